#include "runtime/runner_factory.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_budget.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_precision.h"
#include "kvstore/kv_store.h"
#include "model/llama/cpu_backend.h"
#include "model/status_macros.h"
#include "runtime/host_memory.h"

#ifdef SPECNODE_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_page_pool.h"
#endif
#ifdef SPECNODE_HAVE_NCCL
#include "cuda/nccl_communicator.h"
#endif

namespace specnode {

bool HaveCudaBackend() {
#ifdef SPECNODE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// kv with capacity_bytes from kv.memory_utilization, when set: what `memory` (measured with
// the model loaded) leaves of that fraction, at least two of the largest pages.
absl::StatusOr<KvOptions> BudgetedKv(
    const LlamaConfig& config, KvHeadsHeld heads, KvOptions kv, Device device,
    const std::function<absl::StatusOr<DeviceMemoryInfo>()>& memory) {
  if (kv.memory_utilization <= 0) return kv;
  SPECNODE_ASSIGN_OR_RETURN(const DeviceMemoryInfo m, memory());
  const int64_t page = static_cast<int64_t>(kv.page_tokens) * 2 * config.n_layers *
                       heads.n_kv_heads * KvRowBytes(KvPrecision::kFull, config.head_dim);
  SPECNODE_ASSIGN_OR_RETURN(kv.capacity_bytes, KvCapacityFromUtilization(kv.memory_utilization, m,
                                                                         2 * page, device.name()));
  return kv;
}

// The host weights as a shared pointer that does not own them (the model does).
std::shared_ptr<const LlamaWeights> Borrowed(const LlamaWeights& w) {
  return std::shared_ptr<const LlamaWeights>(&w, [](const LlamaWeights*) {});
}

absl::Status CheckCuda(const RunnerOptions& o, const LlamaConfig* config, bool probe_device) {
  const std::string dev = o.device.name();
#ifdef SPECNODE_HAVE_CUDA
  // What the request asks of any GPU first (answers the same with or without one), then
  // whether this one is there.
  const BackendCaps caps = CudaBackend::Caps();
  if (o.activations == ActQuant::kInt8 && !caps.int8_activations) {
    return absl::InvalidArgumentError(absl::StrCat(
        dev, " rounds matmul activations to int16 blocks (the CPU's default); activations int8 ",
        "is a CPU option (leave it unset or int16 on a GPU)"));
  }
  if (o.kv.mode == KvMode::kDense) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv mode dense is the CPU's f32 reference cache; ", dev,
                     " keeps KV in its page pool (kv mode auto, full, int8, int4 or mixed)"));
  }
  const int head_dim = config != nullptr ? config->head_dim : 0;
  SPECNODE_RETURN_IF_ERROR(
      KvStore::CheckSupported(o.kv, CudaPagePool::Caps(head_dim, o.kv.rotate), o.device));
  // The graph against the backend's table, before any weight moves.
  if (config != nullptr) SPECNODE_RETURN_IF_ERROR(CheckGraphSupported(caps, *config, o.device));
  if (!probe_device) return absl::OkStatus();
  SPECNODE_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
  if (o.device.index >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat(dev, " does not exist (", devices, " CUDA devices visible)"));
  }
  return absl::OkStatus();
#else
  (void)config;
  (void)probe_device;
  return absl::UnimplementedError(
      absl::StrCat(dev,
                   " requested, but this specnode was built without the CUDA backend "
                   "(configure with nvcc on PATH, or -DSPECNODE_CUDA=ON)"));
#endif
}

}  // namespace

absl::Status CheckRunnerOptions(const RunnerOptions& o, const LlamaConfig* config,
                                bool probe_device) {
  SPECNODE_RETURN_IF_ERROR(o.kv.Validate());
  if (!o.device.is_cpu()) return CheckCuda(o, config, probe_device);
  if (config != nullptr) {
    SPECNODE_RETURN_IF_ERROR(CheckGraphSupported(CpuBackend::Caps(), *config, Device::Cpu()));
  }
  if (o.kv.mode == KvMode::kDense) return absl::OkStatus();
  const int head_dim = config != nullptr ? config->head_dim : 0;
  return KvStore::CheckSupported(o.kv, CpuPagePool::Caps(head_dim, o.kv.rotate), Device::Cpu());
}

absl::StatusOr<std::unique_ptr<LocalModelRunner>> MakeRunner(const LlamaConfig& config,
                                                             const LlamaWeights& weights,
                                                             const RunnerOptions& o) {
  SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(o, &config));
  if (o.device.is_cpu()) {
    // CheckRunnerOptions above was the options' one check.
    SPECNODE_ASSIGN_OR_RETURN(const KvOptions kv, BudgetedKv(config, weights.kv_heads_held(), o.kv,
                                                             o.device, HostMemory));
    SPECNODE_ASSIGN_OR_RETURN(
        std::unique_ptr<KvCache> cache,
        MakeKvCache(config, weights.kv_heads_held(), kv, nullptr, KvStore::OptionsChecked::kYes));
    const ActQuant act = o.activations.value_or(weights.activations);
    return std::make_unique<LocalModelRunner>(config, std::make_unique<CpuBackend>(o.pool, act),
                                              CpuBackend::ForKernels(Borrowed(weights), act),
                                              std::move(cache), o.reducer);
  }
#ifdef SPECNODE_HAVE_CUDA
  CudaBackendOptions bo;
  bo.device = o.device.index;
  bo.cuda_graphs = o.cuda_graphs;
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(bo));
  SPECNODE_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> device_weights,
                            backend->UploadWeights(Borrowed(weights)));
  CudaBackend* device = backend.get();
  SPECNODE_ASSIGN_OR_RETURN(const KvOptions kv,
                            BudgetedKv(config, weights.kv_heads_held(), o.kv, o.device,
                                       [device] { return device->MemoryInfo(); }));
  SPECNODE_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> cache,
      MakeKvCache(
          config, weights.kv_heads_held(), kv,
          [device](const KvPoolGeometry& g, int64_t capacity,
                   std::optional<bool> rotate) -> absl::StatusOr<std::unique_ptr<KvPagePool>> {
            SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<CudaPagePool> pool,
                                      CudaPagePool::Create(device, g, capacity, rotate));
            return std::unique_ptr<KvPagePool>(std::move(pool));
          },
          KvStore::OptionsChecked::kYes));
  return std::make_unique<LocalModelRunner>(config, std::move(backend), std::move(device_weights),
                                            std::move(cache), o.reducer);
#else
  return absl::InternalError("unreachable: CheckRunnerOptions refuses cuda in this build");
#endif
}

GpuShardLink::~GpuShardLink() = default;

absl::StatusOr<std::unique_ptr<GpuShardLink>> GpuShardLink::Create(Communicator* group,
                                                                   Device device,
                                                                   double timeout_s) {
  std::unique_ptr<GpuShardLink> link(new GpuShardLink());
  if (group->size() == 1) return link;
#ifdef SPECNODE_HAVE_NCCL
  CommunicatorOptions co;
  co.timeout_s = timeout_s;
  auto nccl = NcclCommunicator::Create(group, device.index, co);
  if (!nccl.ok()) return nccl.status();
  link->nccl_ = std::move(nccl).value();
  link->reducer_ = std::make_unique<CommunicatorReducer>(link->nccl_.get());
  return link;
#else
  (void)timeout_s;
  return absl::UnimplementedError(
      absl::StrCat("a tensor-parallel group on ", device.name(),
                   " needs NCCL, and this specnode was built without it (CUDA + MPI + NCCL)"));
#endif
}

}  // namespace specnode
