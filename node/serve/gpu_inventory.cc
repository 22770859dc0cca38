#include "node/serve/gpu_inventory.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

#ifdef SPECNODE_HAVE_CUDA
#include "cuda/cuda_check.h"
#endif

namespace specnode {
namespace {

std::optional<std::string> CudaVisibleDevices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// ", CUDA_VISIBLE_DEVICES=..." when it is set, for origins.
std::string VisibleSuffix(const std::optional<std::string>& cvd) {
  return cvd.has_value() ? absl::StrCat(", CUDA_VISIBLE_DEVICES=", *cvd) : "";
}

}  // namespace

absl::StatusOr<NodeGpus> ThisHostGpus() {
  const std::optional<std::string> cvd = CudaVisibleDevices();
  if (cvd.has_value()) {
    if (absl::Status s = ParseCudaVisibleDevices(*cvd).status(); !s.ok()) return s;
  }
#ifdef SPECNODE_HAVE_CUDA
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return NodeSeenByRuntime(
        0, std::nullopt, absl::StrCat("this host: ", count.status().message(), VisibleSuffix(cvd)));
  }
  return NodeSeenByRuntime(
      *count, cvd,
      absl::StrCat("this host: the CUDA runtime reports ", *count, VisibleSuffix(cvd)));
#else
  return NodeSeenByRuntime(
      0, std::nullopt,
      absl::StrCat("this host: this specnode was built without the CUDA backend",
                   VisibleSuffix(cvd)));
#endif
}

absl::StatusOr<NodeGpus> PlannedNodeGpus(int gpus) {
  const std::optional<std::string> cvd = CudaVisibleDevices();
  return NodeWithGpus(gpus, cvd, absl::StrCat("--gpus-per-node ", gpus, VisibleSuffix(cvd)));
}

}  // namespace specnode
