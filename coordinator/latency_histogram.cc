#include "coordinator/latency_histogram.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace specnode {

LatencyHistogram::LatencyHistogram(std::span<const double> bounds)
    : bounds_(bounds), buckets_(bounds.size() + 1, 0) {
  assert(std::adjacent_find(bounds.begin(), bounds.end(), std::greater_equal<>()) == bounds.end());
}

void LatencyHistogram::Observe(double seconds) {
  if (!(seconds > 0)) seconds = 0;  // negative or NaN
  // The first bound >= seconds: Prometheus buckets are "le" (upper bound inclusive).
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
  buckets_[i]++;
  count_++;
  sum_ += seconds;
}

std::vector<int64_t> LatencyHistogram::CumulativeCounts() const {
  std::vector<int64_t> out(bounds_.size());
  int64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += buckets_[i];
    out[i] = running;
  }
  return out;
}

}  // namespace specnode
