#include "model/cpu/act_quant.h"

namespace specnode {

bool ParseActQuant(const std::string& name, ActQuant* out) {
  if (name == "int16") {
    *out = ActQuant::kInt16;
  } else if (name == "int8") {
    *out = ActQuant::kInt8;
  } else {
    return false;
  }
  return true;
}

}  // namespace specnode
