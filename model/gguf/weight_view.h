// WeightView: one weight matrix (or a row slice of one) in its GGUF storage type, wherever
// its bytes live — the file's mapping, a host copy, device memory (a backend's
// UploadWeights re-points it). The one type every backend's matmul and embedding take, in a
// header of its own so a backend reads it without the CPU kernels (model/cpu/cpu_matmul.h).
// A view: borrows the bytes; copyable; thread-safe to read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/gguf/ggml_types.h"

namespace specnode {

// The bytes are rows of `cols` values in `type`'s blocks: [rows, cols].
struct WeightView {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // first byte of row 0 (of this slice)
  int64_t rows = 0;            // output features
  int64_t cols = 0;            // input features (multiple of 32 for quantised types)
  size_t row_stride = 0;       // bytes between consecutive rows
  // Optional row-interleaved copy of the same rows (cpu_repack.h, PackRows), owned by
  // whoever set it (the CPU backend's UploadWeights). MatMul uses it where the selected
  // kernels have an x8 kernel for the activation width that runs and every matrix of the
  // call has its copy, else `data`; embedding lookups always read `data`. Whether it is set
  // is fixed for the life of the weights, so a row's result does not depend on the batch.
  const uint8_t* packed = nullptr;
};

}  // namespace specnode
