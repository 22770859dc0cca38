#include "cuda/cuda_graph_cache.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"

namespace specnode {

CudaGraphCache::CudaGraphCache(int min_uses, size_t max_graphs)
    : min_uses_(min_uses < 1 ? 1 : min_uses), max_graphs_(max_graphs < 1 ? 1 : max_graphs) {}

CudaGraphCache::~CudaGraphCache() { Clear(); }

void CudaGraphCache::Clear() {
  for (auto& [key, e] : entries_) {
    if (e.exec != nullptr) (void)cudaGraphExecDestroy(e.exec);
  }
  entries_.clear();
}

absl::Status CudaGraphCache::Disable(const std::string& why,
                                     const std::function<absl::Status()>& launches) {
  (void)cudaGetLastError();  // the refusal must not surface at the next launch check
  reason_ = why;
  Clear();
  return launches();
}

absl::Status CudaGraphCache::Run(cudaStream_t stream, int64_t key, uint64_t signature,
                                 const std::function<absl::Status()>& launches) {
  if (disabled()) return launches();
  if (entries_.size() >= max_graphs_ && entries_.find(key) == entries_.end()) Clear();
  Entry& e = entries_[key];
  if (e.signature != signature || e.uses == 0) {
    if (e.exec != nullptr) (void)cudaGraphExecDestroy(e.exec);
    e = Entry{signature, 0, nullptr};
  }
  if (e.exec != nullptr) {
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e.exec, stream));
    ++replays_;
    return absl::OkStatus();
  }
  if (++e.uses < min_uses_) return launches();

  // Thread-local mode: other threads' CUDA calls (another forward, a reducer) are not
  // affected by, and do not invalidate, this capture.
  cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    return Disable(absl::StrCat("cudaStreamBeginCapture: ", cudaGetErrorString(err)), launches);
  }
  const absl::Status body = launches();
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(stream, &graph);
  if (!body.ok()) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    e.uses = 0;
    return body;
  }
  if (err != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    return Disable(absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorString(err)), launches);
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    return Disable(absl::StrCat("cudaGraphInstantiate: ", cudaGetErrorString(err)), launches);
  }
  e.exec = exec;
  ++captures_;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e.exec, stream));
  ++replays_;
  return absl::OkStatus();
}

}  // namespace specnode
