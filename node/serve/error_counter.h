// Error replies sent, by code of the one error table (coordinator/request_error.h), across
// the node's front ends (the ZeroMQ socket thread and the HTTP threads). The metrics report
// them as specnode_errors_total{code}.
//
// Thread-safety: Add and Counts may be called from any thread (relaxed atomics: a scrape
// sees each count at some recent value).
#pragma once

#include <array>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <map>
#include <string>

#include "coordinator/request_error.h"

namespace specnode {

class ErrorCounter {
 public:
  void Add(RequestError code) {
    const size_t i = static_cast<size_t>(code);
    assert(i < kMaxCodes);
    counts_[i].fetch_add(1, std::memory_order_relaxed);
  }
  // Wire code -> replies so far, for every code that happened.
  std::map<std::string, int64_t> Counts() const {
    std::map<std::string, int64_t> out;
    for (const RequestErrorInfo& e : RequestErrorTable()) {
      const int64_t n = counts_[static_cast<size_t>(e.code)].load(std::memory_order_relaxed);
      if (n > 0) out[e.wire] = n;
    }
    return out;
  }

 private:
  static constexpr size_t kMaxCodes = 32;  // > the table's codes
  std::array<std::atomic<int64_t>, kMaxCodes> counts_{};
};

}  // namespace specnode
