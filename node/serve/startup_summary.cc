#include "node/serve/startup_summary.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace specnode {

std::string StartupSummary(const StartupFigures& f) {
  constexpr double kMiB = 1 << 20;
  std::string out =
      absl::StrFormat("ready in %.1f s; weights %.1f MiB", f.ready_s, f.weight_bytes / kMiB);
  if (!f.kv.has_value() || !f.sequence_room.has_value() || f.sequence_room->needed <= 0) {
    return out + "; KV: the dense reference cache (no budget)";
  }
  const double sequences =
      static_cast<double>(f.sequence_room->available) / f.sequence_room->needed;
  absl::StrAppendFormat(&out, "; KV %.0f MiB (%.0f tokens at f16: %.1f sequences of %d tokens",
                        f.kv->capacity_bytes / kMiB, sequences * f.max_model_len, sequences,
                        f.max_model_len);
  absl::StrAppendFormat(&out, ", max_active %d%s)", f.max_active,
                        sequences < f.max_active ? "; full-length sequences preempt" : "");
  return out;
}

std::string TargetRanksLine(std::string_view group, std::string_view plan,
                            std::span<const RankMemory> ranks) {
  constexpr double kMiB = 1 << 20;
  std::string out = absl::StrFormat("group %s target, %s", group, plan);
  for (const RankMemory& r : ranks) {
    absl::StrAppendFormat(&out, "; rank %d %s on %s: weights %.1f MiB, KV %.0f MiB", r.rank,
                          r.device, r.host, r.weight_bytes / kMiB, r.kv_bytes / kMiB);
  }
  return out;
}

double ProcessAgeS() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0;
  if (!std::getline(stat, line) || !(uptime >> up)) return 0;
  // Field 22 (starttime, clock ticks after boot) counts from after the command's ")".
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double start = 0;
  if (!absl::SimpleAtod(field, &start) || ticks <= 0) return 0;
  return std::max(0.0, up - start / ticks);
}

}  // namespace specnode
