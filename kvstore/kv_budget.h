// The KV cache's budget as a fraction of a device's memory (vLLM's
// --gpu-memory-utilization): what is left of fraction × the device's total once the model is
// loaded. Pure arithmetic on measured figures; the measurements come from the device
// (runtime/host_memory.h for the CPU's host memory, CudaBackend::MemoryInfo in
// cuda/cuda_backend.h for a GPU).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace specnode {

// One device's memory, bytes, as measured at one moment.
struct DeviceMemoryInfo {
  int64_t total_bytes = 0;  // what the device has (a cgroup's limit on the host, if lower)
  int64_t used_bytes = 0;   // in use by every process, this one's loaded weights included
};

// fraction × total − used, rounded down to whole MiB: the bytes the KV cache may take so
// that the device is at most `fraction` used (other processes' memory counts as used, as in
// vLLM before 0.7). fraction in (0, 1]. ResourceExhausted naming `device`, the figures and
// the flags to change when that leaves less than `min_bytes` (two KV pages: the store's
// floor).
absl::StatusOr<int64_t> KvCapacityFromUtilization(double fraction, const DeviceMemoryInfo& memory,
                                                  int64_t min_bytes, std::string_view device);

}  // namespace specnode
