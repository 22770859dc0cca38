// LatencyHistogram: a cumulative (since start) histogram of durations in seconds over fixed
// bucket upper bounds, as Prometheus histograms are exposed (`_bucket{le}`, `_sum`,
// `_count`), and the node's fixed bucket sets.
//
// A value type without locking: the scheduler keeps its histograms in its stats, under its
// mutex, and hands out copies (SchedulerSnapshot). Copying is cheap (the bounds are a view
// of static storage; the counts one small vector).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specnode {

// Bucket upper bounds, seconds, strictly increasing and finite (+Inf is implicit).
// Time to first token: 1 ms .. 2560 s (vLLM's TTFT buckets).
inline constexpr double kTtftBucketsS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                           0.25,  0.5,   0.75, 1,    2.5,  5,    7.5,  10,
                                           20,    40,    80,   160,  640,  2560};
// Time per output token: vLLM's 10 ms .. 80 s, with 1, 2.5 and 5 ms below (CPU decode of a
// small model runs at a few ms per token).
inline constexpr double kTpotBucketsS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                           0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1,     2.5,
                                           5,     7.5,    10,    20,   40,    80};
// Queue time and end-to-end latency: 1 ms .. 0.1 s (an idle node queues for ~0), then
// vLLM's request-latency buckets 0.3 s .. 7680 s.
inline constexpr double kRequestBucketsS[] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1,   1.5, 2,    2.5, 5,
    10,    15,    20,   30,    40,   50,  60,  120, 240, 480, 960, 1920, 7680};

class LatencyHistogram {
 public:
  // bounds: strictly increasing finite upper bounds (seconds) in static storage (they are
  // not copied), e.g. kTtftBucketsS.
  explicit LatencyHistogram(std::span<const double> bounds);

  // Counts one duration (seconds; negative and NaN count as 0) in the first bucket whose
  // bound is >= it (the +Inf bucket when above every bound).
  void Observe(double seconds);

  std::span<const double> bounds() const { return bounds_; }
  // Observations <= bounds()[i], for each i (cumulative, as `_bucket{le}` is).
  std::vector<int64_t> CumulativeCounts() const;
  int64_t count() const { return count_; }  // every observation (the +Inf bucket)
  double sum() const { return sum_; }       // seconds

 private:
  std::span<const double> bounds_;
  std::vector<int64_t> buckets_;  // per bucket (not cumulative); [bounds.size()] = above all
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace specnode
