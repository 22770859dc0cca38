// CudaGraphCache: replays a stream's recurring launch sequences as CUDA graphs.
//
// A decode step of a small model is hundreds of tiny kernels (SmolLM2-135M: ~15 per layer x
// 30 layers); launched one by one from the host they cost ~5-7 us each, so a batch-1 step is
// bound by launch latency, not by the GPU (measured on an H200: 3.05 ms per step eager).
// A graph launches the whole sequence at once.
//
// The caller names each launch sequence by a `key` (its shape, e.g. the number of token
// rows) and a `signature` (a hash of everything else the launches bake in: device pointers,
// scalar arguments). Run() executes the sequence eagerly until the same (key, signature) has
// been seen `min_uses` times in a row, then captures it once and replays the graph from then
// on; a changed signature for a key recaptures after min_uses more calls. So one-off shapes
// (a long prompt's prefill) never pay the capture (~ms), and recurring ones (decode at batch
// n, a K-token verification) replay.
//
// Contract for `launches`: only stream-ordered work on `stream` (kernel launches, async
// copies between device buffers), no host synchronisation, no allocation, no reads of host
// memory that changes between calls (a graph replays the arguments captured). Whatever varies
// per call must come from device memory the caller fills before Run (token ids, positions,
// page tables).
//
// Failure handling: if the runtime refuses the capture or the instantiation, the cache
// disables itself (disabled_reason() says why) and every later call runs eagerly: graphs
// are an optimisation, never a new way to fail. If `launches` itself returns an error
// during capture, the capture is discarded and that error is returned, as eagerly.
//
// Not thread-safe; one per stream. The device current at construction must be current at
// every call. Destroys its graphs on destruction.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"

namespace specnode {

class CudaGraphCache {
 public:
  // `max_graphs`: more distinct keys than this drop every graph held (shapes rarely churn;
  // this bounds the memory of pathological patterns).
  explicit CudaGraphCache(int min_uses = 2, size_t max_graphs = 64);
  ~CudaGraphCache();
  CudaGraphCache(const CudaGraphCache&) = delete;
  CudaGraphCache& operator=(const CudaGraphCache&) = delete;

  absl::Status Run(cudaStream_t stream, int64_t key, uint64_t signature,
                   const std::function<absl::Status()>& launches);

  int64_t captures() const { return captures_; }  // graphs captured so far
  int64_t replays() const { return replays_; }    // Run calls served by a graph
  bool disabled() const { return !reason_.empty(); }
  const std::string& disabled_reason() const { return reason_; }

 private:
  struct Entry {
    uint64_t signature = 0;
    int uses = 0;                    // consecutive calls with this signature
    cudaGraphExec_t exec = nullptr;  // captured for `signature`, or null
  };
  void Clear();
  absl::Status Disable(const std::string& why, const std::function<absl::Status()>& launches);

  int min_uses_;
  size_t max_graphs_;
  std::unordered_map<int64_t, Entry> entries_;
  int64_t captures_ = 0, replays_ = 0;
  std::string reason_;
};

// FNV-1a over 64-bit words: the signature helper for pointers and scalars.
class GraphSignature {
 public:
  GraphSignature& Add(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (8 * i)) & 0xff;
      hash_ *= 1099511628211ull;
    }
    return *this;
  }
  GraphSignature& Add(const void* p) { return Add(reinterpret_cast<uintptr_t>(p)); }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace specnode
