#include "kvstore/kv_budget.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace specnode {

absl::StatusOr<int64_t> KvCapacityFromUtilization(double fraction, const DeviceMemoryInfo& memory,
                                                  int64_t min_bytes, std::string_view device) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memory utilization must be in (0, 1], got %g", fraction));
  }
  constexpr double kMiB = 1 << 20;
  const double budget = std::floor(fraction * static_cast<double>(memory.total_bytes));
  const int64_t kv = static_cast<int64_t>(std::floor((budget - memory.used_bytes) / kMiB)) << 20;
  if (kv < min_bytes || kv <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %.2f of its %.0f MiB is %.0f MiB, and %.0f MiB are in use with the model loaded: "
        "that leaves %.0f MiB for the KV cache, below its %.2f MiB minimum (raise "
        "--gpu-memory-utilization / kv.memory_utilization, or give --kv-capacity-mb instead)",
        std::string(device), fraction, memory.total_bytes / kMiB, budget / kMiB,
        memory.used_bytes / kMiB, std::max<double>(0, kv) / kMiB, min_bytes / kMiB));
  }
  return kv;
}

}  // namespace specnode
