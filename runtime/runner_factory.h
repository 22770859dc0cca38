// The one runner factory: every model instance this process runs — a CLI command's model,
// serve's target and draft models, a tensor-parallel shard rank's slice — is built here,
// on the CPU or a GPU, from typed options (parsed once at the edge: node/ flags and YAML).
//
//   CPU:    CpuBackend over the host weights + a KvStore over a CpuPagePool (or the dense
//           reference cache for kv mode dense)
//   cuda:N: CudaBackend (weights copied to the device) + a KvStore over a CudaPagePool
// and LocalModelRunner (runtime/model_runner.h) over them: one graph, one KV manager.
//
// A device that cannot do what was asked refuses with a clear error naming the device —
// never a silent downgrade — and CheckRunnerOptions says so before any weight is loaded.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kvstore/kv_options.h"
#include "model/cpu/cpu_matmul.h"
#include "model/llama/backend.h"
#include "model/llama/device.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"
#include "runtime/model_runner.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

class ThreadPool;

struct RunnerOptions {
  Device device;
  KvOptions kv;
  // How CPU matmuls round activations (cpu_matmul.h). Unset: the weights' own
  // (LoadOptions::activations, int16 by default). A GPU rounds them to int16 blocks as the
  // CPU does by default (cuda/cuda_matmul.h, kQuantAct) and refuses int8.
  std::optional<ActQuant> activations;
  ThreadPool* pool = nullptr;            // the CPU's host threads (borrowed; null: one thread)
  PartialSumReducer* reducer = nullptr;  // a TP shard's all-reduce (device buffers on a GPU)
  bool cuda_graphs = true;               // GPU: replay recurring passes as CUDA graphs
};

// What `options` asks of its device, checked without loading anything: a build with the
// CUDA backend and (probe_device) a visible device for cuda:N; a KV mode, rotation and
// eviction the device's page pool stores; activations the device computes with; for
// `config` (when given) a head_dim the device's attention runs. Unimplemented (a CPU-only
// build), Unavailable (no usable GPU) or InvalidArgument, naming the device and what it
// lacks. probe_device false: only what can be told without the device (another rank's).
absl::Status CheckRunnerOptions(const RunnerOptions& options, const LlamaConfig* config = nullptr,
                                bool probe_device = true);

// A runner over `weights` (a loaded model's views: borrowed on the CPU, where they must
// outlive the runner; copied to a GPU, after which they may go). n_kv_heads of the cache
// are the weights' local ones (a shard's). Checks CheckRunnerOptions first.
absl::StatusOr<std::unique_ptr<LocalModelRunner>> MakeRunner(const LlamaConfig& config,
                                                             const LlamaWeights& weights,
                                                             const RunnerOptions& options);

// True when this binary was built with the CUDA backend.
bool HaveCudaBackend();

// A GPU shard's data path to the other shards of its group: an NCCL communicator on
// `device`, bootstrapped over the group's host communicator `group` (collective: every rank
// of the group calls Create), and the reducer the forward pass all-reduces with. A group of
// one rank needs none: reducer() is null. Unimplemented in builds without NCCL.
class GpuShardLink {
 public:
  static absl::StatusOr<std::unique_ptr<GpuShardLink>> Create(Communicator* group, Device device,
                                                              double timeout_s);
  ~GpuShardLink();
  PartialSumReducer* reducer() const { return reducer_.get(); }

 private:
  GpuShardLink() = default;
  std::unique_ptr<Communicator> nccl_;
  std::unique_ptr<PartialSumReducer> reducer_;
};

}  // namespace specnode
