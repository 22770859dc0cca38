#include "model/cpu/finite.h"

namespace specnode {

bool AllFinite(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * 0.0f;
  }
  for (; i < n; ++i) acc[0] += x[i] * 0.0f;
  float sum = 0.0f;
  for (float a : acc) sum += a;
  return sum == 0.0f;
}

}  // namespace specnode
