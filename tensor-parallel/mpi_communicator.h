// The "mpi" Communicator: one tensor-parallel group's ranks are MPI processes; buffers are
// host memory. Used on CPU under mpirun (rank 0 coordinator, ranks 1..T target shards).
//
// Creation (both collective over the group's members only, never the whole world):
//   MpiCommunicator::Create(comm, options)
//       duplicates `comm` with MPI_Comm_idup (waited with the deadline); group rank =
//       rank in comm.
//   MpiCommunicator::CreateFromWorldRanks({1, 2, 3}, options)
//       the group of those MPI_COMM_WORLD ranks, group rank i = world_ranks[i]. Only the
//       listed processes call it (InvalidArgument if the caller is not listed). They first
//       check in with each other point to point on MPI_COMM_WORLD with tag
//       kMpiGroupHandshakeTag (deadline; names absent world ranks), then MPI_Comm_create_group.
//   MpiEnvironment (mpi_check.h) must be initialised first and outlive the communicator.
//
// Algorithm: every collective is point to point over the private duplicated communicator
// (so it never matches the node's own messages): each rank posts MPI_Irecv from and
// MPI_Isend to every peer, tag = collective sequence number mod 32768, then
// MpiWaitAllWithDeadline. Knowing which receive is missing lets a DeadlineExceeded name the
// ranks that did not answer:
//   "MpiCommunicator AllReduceSum #12 (576 floats): no answer within 5 s from rank 2
//    (world 3)"
// AllReduceSum gathers every rank's contribution and sums in rank order 0..T-1 on every
// rank: bit-identical results on all ranks, equal to LocalCommunicator's. O(T^2) messages
// per collective; meant for T <= 8 on a node (activations are KBs to a few MB).
//
// Payloads travel only through communicator-owned staging buffers. After a deadline the
// pending requests are freed and their buffers deliberately leaked (MPI may still write a
// late message into them), so callers' buffers are never touched after a call returns.
//
// Waiting polls MPI_Testsome with a sleeping backoff (20 µs .. 1 ms): an idle rank does not
// spin a core (run mpirun with `--mca mpi_yield_when_idle 1` as well for MPI's own waits).
//
// Not thread-safe (Communicator contract). MPI thread level: calls come from whichever
// thread uses the object, one at a time (SERIALIZED; with FUNNELED use it from the thread
// that initialised MPI). Byte accounting as LocalCommunicator: AllReduceSum / AllGather of
// n floats: 4n(T-1) sent and received; Broadcast: bytes(T-1) sent on the root, bytes
// received elsewhere; Barrier: 0.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

// Tag of the check-in messages of CreateFromWorldRanks on MPI_COMM_WORLD.
inline constexpr int kMpiGroupHandshakeTag = 31001;

class MpiCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm,
                                                                 CommunicatorOptions options = {});
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> CreateFromWorldRanks(
      std::span<const int> world_ranks, CommunicatorOptions options = {});
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view kind() const override { return "mpi"; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* send, int64_t count, float* recv) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }
  int64_t bytes_received() const override { return bytes_received_; }

  MPI_Comm comm() const { return comm_; }  // the private duplicate
  int world_rank(int group_rank) const { return world_ranks_[group_rank]; }

 private:
  MpiCommunicator(MPI_Comm comm, CommunicatorOptions options);
  absl::Status Init();  // rank, size, world ranks

  // Exchanges rows of `row_bytes` bytes: this rank sends staging row rank() to every rank in
  // `send_to` and receives row r from every r in `recv_from`. Waits with the deadline.
  absl::Status Exchange(const char* name, int64_t count, int64_t row_bytes,
                        std::span<const int> send_to, std::span<const int> recv_from);
  absl::Status Fail(absl::Status status);
  absl::Status BrokenError() const;
  char* Row(int r) { return staging_.data() + static_cast<size_t>(r) * row_bytes_; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommunicatorOptions options_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // [size]
  std::vector<int> peers_;        // every rank but this one, ascending
  int64_t seq_ = 0;
  absl::Status broken_;
  std::vector<char> staging_;  // [size, row_bytes_]
  int64_t row_bytes_ = 0;
  std::vector<MPI_Request> requests_;  // the posted receives first, then the sends
  size_t posted_receives_ = 0;          // how many of requests_ are receives
  std::vector<std::string> labels_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace specnode
