// The GPU side of a model-running command: a ModelRunner on "cuda:N" (cuda/cuda_model_runner.h)
// when this build has the CUDA backend, a clear error otherwise. Kept apart so that nothing
// else in node/ needs CUDA headers or an #ifdef.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/model_runner.h"
#include "kvstore/kv_cache_factory.h"
#include "model/llama_model.h"

namespace specnode {

// Parses "cpu" (-1) or "cuda:N" (N); InvalidArgument naming `what` otherwise.
absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& what);

// A runner for `model` on CUDA device `device`, its KV pool sized by kv.capacity_bytes in
// pages of kv.page_tokens (f16; the CPU's mixed-precision options do not apply). The model
// must outlive only this call (weights are copied to the device). Unimplemented in a build
// without the CUDA backend; Unavailable without a usable device.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeGpuRunner(const LlamaModel& model, int device,
                                                           const KvCacheOptions& kv);

// True when this binary was built with the CUDA backend.
bool HaveCudaBackend();

}  // namespace specnode
