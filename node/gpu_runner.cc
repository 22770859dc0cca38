#include "node/gpu_runner.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifdef SPECNODE_HAVE_CUDA
#include "cuda/cuda_model_runner.h"
#endif

namespace specnode {

absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& what) {
  if (device == "cpu") return -1;
  int n = -1;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &n) && n >= 0) return n;
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
                                                           const KvCacheOptions& kv) {
#ifdef SPECNODE_HAVE_CUDA
  CudaForwardOptions o;
  o.device = device;
  o.kv_capacity_bytes = kv.capacity_bytes;
  o.kv_page_tokens = kv.page_tokens;
  auto runner = CudaModelRunner::Create(model.config(), model.weights(), o);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<ModelRunner>(std::move(runner).value());
#else
  (void)model;
  (void)kv;
  return absl::UnimplementedError(absl::StrCat(
      "cuda:", device, " requested, but this specnode was built without the CUDA backend "
      "(configure with nvcc on PATH, or -DSPECNODE_CUDA=ON)"));
#endif
}

}  // namespace specnode
