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
#include "tensor-parallel/communicator.h"

namespace specnode {

// Parses "cpu" (-1) or "cuda:N" (N, decimal digits only); InvalidArgument naming `what`
// otherwise. The one place device names are checked (CLI flags and YAML configs).
absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& what);

// A runner for `model` on CUDA device `device`, its KV pool sized by kv.capacity_bytes in
// pages of kv.page_tokens (f16; the CPU's mixed-precision options do not apply). The model
// must outlive only this call (weights are copied to the device). Unimplemented in a build
// without the CUDA backend; Unavailable without a usable device.
// `reducer`: a tensor-parallel shard's all-reduce over device buffers (GpuShardLink), null
// for a whole model.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeGpuRunner(const LlamaModel& model, int device,
                                                           const KvOptions& kv,
                                                           PartialSumReducer* reducer = nullptr);

// A GPU shard's data path to the other shards of its group: an NCCL communicator on
// `device`, bootstrapped over the group's host communicator `group` (collective: every rank
// of the group calls Create), and the reducer the forward pass all-reduces with. A group of
// one rank needs none: reducer() is null. Unimplemented in builds without NCCL.
class GpuShardLink {
 public:
  static absl::StatusOr<std::unique_ptr<GpuShardLink>> Create(Communicator* group, int device,
                                                              double timeout_s);
  ~GpuShardLink();
  PartialSumReducer* reducer() const { return reducer_.get(); }

 private:
  GpuShardLink() = default;
  std::unique_ptr<Communicator> nccl_;
  std::unique_ptr<PartialSumReducer> reducer_;
};

// True when this binary was built with the CUDA backend.
bool HaveCudaBackend();

}  // namespace specnode
