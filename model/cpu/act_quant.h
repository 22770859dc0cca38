// How activations are rounded before a quantised matmul (model/cpu/cpu_matmul.h describes both
// modes): a value type the model's weights carry (model/llama/llama_weights.h) and every
// backend reads, kept apart from the CPU kernels so a library that only names it (the graph,
// cuda/) does not link them.
#pragma once

#include <string>

namespace specnode {

// Activation rounding for quantised weights.
enum class ActQuant { kInt16, kInt8 };

// Parses "int16" / "int8"; false on anything else. (The name of what runs for a request on
// this CPU is the kernels' ActQuantName, model/cpu/cpu_matmul.h.)
bool ParseActQuant(const std::string& name, ActQuant* out);

}  // namespace specnode
