// Collectives among the ranks of one tensor-parallel group, behind one interface with three
// implementations:
//   "local"  LocalCommunicator  (local_communicator.h): T ranks as threads of one process;
//                               the embedded single-process default and the unit tests.
//   "mpi"    MpiCommunicator    (mpi_communicator.h): CPU buffers over an MPI_Comm.
//   "nccl"   NcclCommunicator   (nccl_communicator.h): GPU device buffers, CUDA builds only.
//
// Contract shared by every implementation:
//   - Not thread-safe: one collective at a time per object. Each rank (thread or process)
//     owns its own Communicator object.
//   - Every rank of the group calls the same collectives, in the same order, with the same
//     counts (and, for Broadcast, the same root and byte count). Mismatches are programming
//     errors; implementations detect what they cheaply can (InvalidArgument) and otherwise
//     the collective times out.
//   - Deadlines: a collective that does not complete within CommunicatorOptions::timeout_s
//     returns DeadlineExceeded, naming the ranks that did not answer when the
//     implementation knows them. No call blocks forever.
//   - After any failure the communicator is broken: every later call returns
//     FailedPrecondition (with the original error in the message). A broken group cannot be
//     repaired; the job tears it down.
//   - Determinism: AllReduceSum adds the ranks' contributions in a fixed order, so every
//     rank receives bit-identical results and a rerun with the same inputs gives the same
//     bits.
//   - Waiting ranks do not busy-spin at 100% CPU (they poll with a sleeping backoff or
//     block on a condition variable).
//
// Buffer memory: host memory for "local" and "mpi", device memory for "nccl".
// Counts are in elements (float) unless the name says bytes. count == 0 is a valid no-op
// that still takes part in the collective's ordering (implementations may skip the
// exchange, since every rank skips it alike).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "model/llama/backend.h"

namespace specnode {

struct CommunicatorOptions {
  double timeout_s = 5.0;  // every collective's deadline, seconds; must be > 0
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // 0 <= rank() < size(), this group's numbering
  virtual int size() const = 0;
  virtual std::string_view kind() const = 0;  // "local", "mpi", "nccl"

  // In place: data[i] = sum over ranks r = 0..size-1 (in that order) of rank r's data[i].
  // data: [count] floats.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;

  // send: [count] floats; recv: [size, count] floats, row r = rank r's send. recv must not
  // overlap send.
  virtual absl::Status AllGather(const float* send, int64_t count, float* recv) = 0;

  // Copies `bytes` bytes from rank `root`'s data to every other rank's data.
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;

  // Returns once every rank has entered the Barrier (or on the deadline).
  virtual absl::Status Barrier() = 0;

  // Payload bytes this rank has sent / received through collectives since construction
  // (the logical payload of the collective algorithm used, not wire bytes incl. headers).
  // Readable from the owning thread only, like the rest of the object.
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

// Adapts a Communicator to LlamaForward's PartialSumReducer, so a shard's forward pass sums
// its partial O / down projections across the group. Borrows `comm` (not owned; must
// outlive this adapter). Same thread-safety as the Communicator.
class CommunicatorReducer : public PartialSumReducer {
 public:
  explicit CommunicatorReducer(Communicator* comm) : comm_(comm) {}
  absl::Status AllReduceSum(float* data, int64_t count) override {
    return comm_->AllReduceSum(data, count);
  }
  Communicator* communicator() const { return comm_; }

 private:
  Communicator* comm_;
};

}  // namespace specnode
