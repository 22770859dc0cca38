#include "runtime/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace specnode {
namespace {

// A "Key:   123 kB" line's value in bytes; nullopt when the key is absent or malformed.
std::optional<int64_t> MemInfoBytes(const std::string& meminfo, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kb = absl::ConsumeSuffix(&line, "kB");
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v) || v < 0) return std::nullopt;
    return kb ? v * 1024 : v;
  }
  return std::nullopt;
}

std::optional<int64_t> CgroupBytes(const std::optional<std::string>& text) {
  if (!text.has_value()) return std::nullopt;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v) || v <= 0) return std::nullopt;
  return v;  // "max" (no limit) does not parse
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// This process's cgroup v2 directory ("0::/path" in /proc/self/cgroup).
std::string CgroupDir() {
  const std::optional<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self.has_value()) return "";
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) return absl::StrCat("/sys/fs/cgroup", line);
  }
  return "";
}

}  // namespace

absl::StatusOr<DeviceMemoryInfo> ParseHostMemory(const std::string& meminfo,
                                                 const std::optional<std::string>& cgroup_max,
                                                 const std::optional<std::string>& cgroup_current) {
  const std::optional<int64_t> total = MemInfoBytes(meminfo, "MemTotal");
  const std::optional<int64_t> available = MemInfoBytes(meminfo, "MemAvailable");
  if (!total.has_value() || !available.has_value()) {
    return absl::InvalidArgumentError("/proc/meminfo has no MemTotal or MemAvailable line");
  }
  DeviceMemoryInfo m;
  m.total_bytes = *total;
  m.used_bytes = std::max<int64_t>(0, *total - *available);
  if (const std::optional<int64_t> limit = CgroupBytes(cgroup_max);
      limit.has_value() && *limit < m.total_bytes) {
    // Under a limit the cgroup's own use is what counts against it.
    m.total_bytes = *limit;
    m.used_bytes = std::min(CgroupBytes(cgroup_current).value_or(m.used_bytes), m.total_bytes);
  }
  return m;
}

absl::StatusOr<DeviceMemoryInfo> HostMemory() {
  const std::optional<std::string> meminfo = ReadFile("/proc/meminfo");
  if (!meminfo.has_value()) return absl::UnavailableError("cannot read /proc/meminfo");
  const std::string dir = CgroupDir();
  return ParseHostMemory(*meminfo, dir.empty() ? std::nullopt : ReadFile(dir + "/memory.max"),
                         dir.empty() ? std::nullopt : ReadFile(dir + "/memory.current"));
}

}  // namespace specnode
