// The finiteness check of float rows (logits, activations) shared by the CPU kernels and the
// graph (model/llama/llama_forward.cc): plain C++, no instruction-set dispatch.
#pragma once

#include <cstdint>

namespace specnode {

// True when every x[0, n) is finite (no NaN, no Inf): 8 running sums of x * 0, which stay 0
// for finite values and turn NaN for the others (no overflow, vectorisable).
bool AllFinite(const float* x, int64_t n);

}  // namespace specnode
