#include "tensor-parallel/mpi_check.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace specnode {
namespace {

constexpr int64_t kFirstSleepNs = 20'000;   // 20 µs
constexpr int64_t kMaxSleepNs = 1'000'000;  // 1 ms

constexpr int kYieldPolls = 32;  // first polls: sched_yield, no sleep

// Poll pacing: a few yielding polls (an answer that is microseconds away is caught without
// a timer's latency, and a runnable peer on the same core gets the CPU), then sleeps
// growing from 20 µs to 1 ms.
class Backoff {
 public:
  void Wait() {
    if (polls_++ < kYieldPolls) {
      sched_yield();
      return;
    }
    timespec ts{0, static_cast<long>(sleep_ns_)};
    nanosleep(&ts, nullptr);
    sleep_ns_ = std::min(kMaxSleepNs, sleep_ns_ * 2);
  }
  void Reset() {
    polls_ = 0;
    sleep_ns_ = kFirstSleepNs;
  }

 private:
  int polls_ = 0;
  int64_t sleep_ns_ = kFirstSleepNs;
};

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string SecondsText(double s) { return absl::StrFormat("%g", s); }

}  // namespace

namespace mpi_internal {

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return absl::StrCat(len > 0 ? std::string(text, len) : std::string("unknown MPI error"),
                      " (MPI error class ", error_class, ")");
}

absl::Status MpiErrorToStatus(int code, const char* expr, const char* file, int line) {
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", expr, " failed: ", MpiErrorString(code)));
}

}  // namespace mpi_internal

absl::Status MpiWaitWithDeadline(MPI_Request* request, MPI_Status* status, double timeout_s,
                                 std::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeout_s)));
  Backoff backoff;
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(request, &done, status);
    if (rc != MPI_SUCCESS) {
      return absl::InternalError(
          absl::StrCat(Sv(what), ": MPI_Test failed: ", mpi_internal::MpiErrorString(rc)));
    }
    if (done) return absl::OkStatus();
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(Sv(what), ": no answer within ", SecondsText(timeout_s), " s"));
    }
    backoff.Wait();
  }
}

absl::Status MpiWaitAllWithDeadline(std::span<MPI_Request> requests,
                                    std::span<const std::string> labels, double timeout_s,
                                    std::string_view what) {
  const auto label = [&](size_t i) {
    return i < labels.size() ? labels[i] : absl::StrCat("request ", i);
  };
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeout_s)));
  const int n = static_cast<int>(requests.size());
  std::vector<int> indices(n);
  std::vector<MPI_Status> statuses(n);
  Backoff backoff;
  for (;;) {
    int outcount = 0;
    const int rc = MPI_Testsome(n, requests.data(), &outcount, indices.data(), statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (int k = 0; k < outcount; ++k) {
        if (statuses[k].MPI_ERROR != MPI_SUCCESS) {
          return absl::InternalError(
              absl::StrCat(Sv(what), ": ", label(indices[k]),
                           " failed: ", mpi_internal::MpiErrorString(statuses[k].MPI_ERROR)));
        }
      }
    }
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      return absl::InternalError(
          absl::StrCat(Sv(what), ": MPI_Testsome failed: ", mpi_internal::MpiErrorString(rc)));
    }
    // MPI_UNDEFINED: no active request left, i.e. everything completed.
    if (outcount == MPI_UNDEFINED) return absl::OkStatus();
    if (std::all_of(requests.begin(), requests.end(),
                    [](MPI_Request r) { return r == MPI_REQUEST_NULL; })) {
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (int i = 0; i < n; ++i) {
        if (requests[i] == MPI_REQUEST_NULL) continue;
        std::string l = label(i);
        if (std::find(missing.begin(), missing.end(), l) == missing.end()) {
          missing.push_back(std::move(l));
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(Sv(what), ": no answer within ",
                                                      SecondsText(timeout_s), " s from ",
                                                      absl::StrJoin(missing, ", ")));
    }
    if (outcount > 0) {
      backoff.Reset();  // progress: poll again soon
      continue;
    }
    backoff.Wait();
  }
}

void AbandonRequests(std::span<MPI_Request> requests, size_t receives) {
  for (size_t i = 0; i < requests.size(); ++i) {
    MPI_Request& r = requests[i];
    if (r == MPI_REQUEST_NULL) continue;
    if (i < receives) MPI_Cancel(&r);
    MPI_Request_free(&r);
    r = MPI_REQUEST_NULL;
  }
}

bool InMpiJob() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MpiEnvironment>> MpiEnvironment::Init(int* argc, char*** argv) {
  std::unique_ptr<MpiEnvironment> env(new MpiEnvironment());
  int initialized = 0;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  if (initialized) {
    SPECNODE_MPI_RETURN_IF_ERROR(MPI_Query_thread(&env->provided_));
  } else {
    SPECNODE_MPI_RETURN_IF_ERROR(
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &env->provided_));
    env->owns_ = true;
  }
  if (env->provided_ < MPI_THREAD_FUNNELED) {
    return absl::FailedPreconditionError(absl::StrCat("MPI provides thread level ", env->provided_,
                                                      ", specnode needs at least FUNNELED"));
  }
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank_));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size_));
  return env;
}

MpiEnvironment::~MpiEnvironment() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace specnode
