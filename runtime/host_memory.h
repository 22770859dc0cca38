// The host's memory as the CPU device's (the KV budget of kv.memory_utilization on the CPU,
// kvstore/kv_budget.h): /proc/meminfo's MemTotal and MemAvailable, bounded by the cgroup v2
// limit this process runs under (a container's --memory) when there is one.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kvstore/kv_budget.h"

namespace specnode {

// meminfo: /proc/meminfo's text; cgroup_max / cgroup_current: the cgroup's memory.max and
// memory.current ("max" or absent: no limit). Total = min(MemTotal, memory.max); used =
// MemTotal − MemAvailable, or under a limit below MemTotal the cgroup's memory.current.
// InvalidArgument when meminfo lacks MemTotal or MemAvailable.
absl::StatusOr<DeviceMemoryInfo> ParseHostMemory(const std::string& meminfo,
                                                 const std::optional<std::string>& cgroup_max,
                                                 const std::optional<std::string>& cgroup_current);

// The figures now, read from /proc/meminfo and /sys/fs/cgroup (this process's cgroup).
// Unavailable when /proc/meminfo cannot be read.
absl::StatusOr<DeviceMemoryInfo> HostMemory();

}  // namespace specnode
