#include "node/gpu_runner.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifdef SPECNODE_HAVE_CUDA
#include "cuda/cuda_model_runner.h"
#endif
#ifdef SPECNODE_HAVE_NCCL
#include "tensor-parallel/nccl_communicator.h"
#endif

namespace specnode {

absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& what) {
  if (device == "cpu") return -1;
  int n = -1;
  // Digits only after "cuda:" (SimpleAtoi alone would take a sign or spaces).
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos &&
      absl::SimpleAtoi(device.substr(5), &n)) {
    return n;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": expected cpu or cuda:N, got \"", device, "\""));
}

bool HaveCudaBackend() {
#ifdef SPECNODE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<ModelRunner>> MakeGpuRunner(const LlamaModel& model, int device,
                                                           const KvOptions& kv,
                                                           PartialSumReducer* reducer) {
#ifdef SPECNODE_HAVE_CUDA
  CudaForwardOptions o;
  o.device = device;
  o.reducer = reducer;
  o.kv_capacity_bytes = kv.capacity_bytes;
  o.kv_page_tokens = kv.page_tokens;
  auto runner = CudaModelRunner::Create(model.config(), model.weights(), o);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<ModelRunner>(std::move(runner).value());
#else
  (void)model;
  (void)kv;
  (void)reducer;
  return absl::UnimplementedError(absl::StrCat(
      "cuda:", device, " requested, but this specnode was built without the CUDA backend "
      "(configure with nvcc on PATH, or -DSPECNODE_CUDA=ON)"));
#endif
}

GpuShardLink::~GpuShardLink() = default;

absl::StatusOr<std::unique_ptr<GpuShardLink>> GpuShardLink::Create(Communicator* group,
                                                                   int device, double timeout_s) {
  std::unique_ptr<GpuShardLink> link(new GpuShardLink());
  if (group->size() == 1) return link;
#ifdef SPECNODE_HAVE_NCCL
  CommunicatorOptions co;
  co.timeout_s = timeout_s;
  auto nccl = NcclCommunicator::Create(group, device, co);
  if (!nccl.ok()) return nccl.status();
  link->nccl_ = std::move(nccl).value();
  link->reducer_ = std::make_unique<CommunicatorReducer>(link->nccl_.get());
  return link;
#else
  (void)timeout_s;
  return absl::UnimplementedError(absl::StrCat(
      "a tensor-parallel group on cuda:", device,
      " needs NCCL, and this specnode was built without it (CUDA + MPI + NCCL)"));
#endif
}

}  // namespace specnode
