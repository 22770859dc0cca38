// MPI member of the check-macro family (cuda/cuda_check.h has the CUDA one): every MPI
// failure becomes an absl::Status naming the call and where it was made, and every wait
// has a deadline, so no rank blocks forever on a peer that died or stopped answering.
//
//   SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
//     on failure returns from the enclosing function (absl::Status / StatusOr) with
//       InternalError("tensor-parallel/foo.cc:42: MPI_Comm_dup(MPI_COMM_WORLD, &comm)
//                      failed: <MPI_Error_string text>")
//     MPI only returns error codes when the communicator's error handler is
//     MPI_ERRORS_RETURN; MpiEnvironment::Init sets that on MPI_COMM_WORLD, and communicators
//     duplicated from it inherit it.
//   SPECNODE_MPI_STATUS(expr)
//     the same check as an absl::Status value (OK on success), for cleanup paths.
//
// Waiting: MPI_Wait would block (and, in OpenMPI, busy-poll a core) with no deadline.
// MpiWaitWithDeadline / MpiWaitAllWithDeadline poll MPI_Test / MPI_Testsome (which also
// drive MPI's progress engine): the first 32 polls yield the CPU (sched_yield: an answer
// microseconds away is caught without timer latency, and a peer sharing the core runs),
// then sleep with a backoff of 20 µs doubling to 1 ms, so an idle rank costs ~1-2% of one
// core (measured: 8-13 ms of CPU over 0.5-1 s waits) and an answer is noticed within
// ~1 ms. On the deadline they return DeadlineExceeded and leave the requests pending (a
// collective's requests cannot be cancelled portably); the caller frees them and marks its
// communicator broken. Deadline messages are stable; tests match them.
//
// The message format "<file>:<line>: <expr> failed: <reason>" is stable; tests match it.
#pragma once

#include <mpi.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

// Waits for one request. OK once it completes (fills *status unless status is
// MPI_STATUS_IGNORE); InternalError when MPI_Test fails; DeadlineExceeded
// ("<what>: no answer within <timeout_s> s") when timeout_s passes first. `what` describes
// the operation for the message, e.g. "AllReduceSum(576 floats) from rank 2".
absl::Status MpiWaitWithDeadline(MPI_Request* request, MPI_Status* status, double timeout_s,
                                 std::string_view what);

// Waits for every request in `requests` (completed ones become MPI_REQUEST_NULL).
// `labels[i]` names request i for the message (e.g. "rank 2"); labels may be empty, then
// requests are named by index. DeadlineExceeded:
//   "<what>: no answer within <timeout_s> s from rank 1, rank 2"
// listing the labels of the requests still pending, each distinct label once (a send and a
// receive to the same peer may share a label). InternalError if MPI_Testsome fails or
// a request completed with an error (naming its label).
absl::Status MpiWaitAllWithDeadline(std::span<MPI_Request> requests,
                                    std::span<const std::string> labels, double timeout_s,
                                    std::string_view what);

// Gives up on requests that will not complete (a peer that failed or stopped answering):
// the first `receives` entries are receives, the rest sends; each pending one becomes
// MPI_REQUEST_NULL. A receive is cancelled, then freed: that withdraws it from the
// transport, which lets MPI_Finalize close its endpoints under every layer (OpenMPI's OFI
// MTL fails fi_close — "Device or resource busy" — when a receive is still posted there).
// A send is only freed: OpenMPI's OFI MTL crashes in MPI_Cancel of a send, and MPI 4
// deprecates cancelling sends. MPI may still read or write the requests' buffers
// afterwards: the caller keeps them alive (leaks them).
void AbandonRequests(std::span<MPI_Request> requests, size_t receives);

// True when this process was started by mpirun / a PMI launcher (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK in the environment). Does not initialise MPI; cheap; thread-safe.
bool InMpiJob();

// Owns MPI initialisation for the process: Init calls MPI_Init_thread (unless MPI is
// already initialised, then it adopts it and does not finalise), sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD, and the destructor calls MPI_Finalize. Create at most one, on the thread
// that will make the MPI calls; destroy it after every communicator is gone.
//
// Thread level: MPI_THREAD_SERIALIZED is requested (any thread may call MPI, one at a
// time); FailedPrecondition if the library provides less than MPI_THREAD_FUNNELED. With
// FUNNELED only the initialising thread may call MPI (provided() tells which one you got).
class MpiEnvironment {
 public:
  static absl::StatusOr<std::unique_ptr<MpiEnvironment>> Init(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int provided() const { return provided_; }  // MPI_THREAD_* level granted
  static bool InMpiJob() { return ::specnode::InMpiJob(); }

 private:
  MpiEnvironment() = default;
  bool owns_ = false;  // we called MPI_Init_thread, so we finalise
  int world_rank_ = 0;
  int world_size_ = 1;
  int provided_ = MPI_THREAD_SINGLE;
};

namespace mpi_internal {

// "<MPI_Error_string> (MPI error class N)" for an MPI return code.
std::string MpiErrorString(int code);

// Builds InternalError("<file>:<line>: <expr> failed: <reason>"). Only called on failure.
absl::Status MpiErrorToStatus(int code, const char* expr, const char* file, int line);

inline absl::Status MpiStatus(int code, const char* expr, const char* file, int line) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  return MpiErrorToStatus(code, expr, file, line);
}

}  // namespace mpi_internal
}  // namespace specnode

#define SPECNODE_MPI_STATUS(expr) \
  ::specnode::mpi_internal::MpiStatus((expr), #expr, __FILE__, __LINE__)

#define SPECNODE_MPI_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                       \
    const int specnode_mpi_code_ = (expr);                                                   \
    if (specnode_mpi_code_ != MPI_SUCCESS) {                                                 \
      return ::specnode::mpi_internal::MpiErrorToStatus(specnode_mpi_code_, #expr, __FILE__, \
                                                        __LINE__);                           \
    }                                                                                        \
  } while (0)
