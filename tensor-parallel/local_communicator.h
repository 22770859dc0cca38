// The "local" Communicator: the T ranks of a tensor-parallel group are T threads of one
// process. The embedded single-process default (mpirun absent or -np 1) and the reference
// the MPI / NCCL communicators are tested against.
//
//   auto group = LocalCommunicatorGroup::Create(3, {.timeout_s = 5.0});
//   // thread r:
//   Communicator* comm = (*group)->Rank(r);
//   SPECNODE_RETURN_IF_ERROR(comm->AllReduceSum(x.data(), x.size()));
//
// Ownership: the group owns the T Communicator objects; Rank(r) lends rank r's. The group
// must outlive every thread using its ranks. Each Communicator is used by one thread at a
// time (the Communicator contract); different ranks run concurrently.
//
// How a collective runs: each rank copies its contribution into a group-owned staging slot
// (double-buffered by collective parity), posts its sequence number under the group mutex
// and waits on a condition variable (no spinning) until every rank has posted the same
// collective, then reads the other ranks' slots. A rank never reads another rank's own
// buffers, so a rank that timed out and returned leaves nothing dangling. Staging costs one
// copy of the payload per rank; payloads are activations ([n_tokens, d_model] floats).
//
// Deadlines: a rank waiting longer than options.timeout_s breaks the whole group and
// returns DeadlineExceeded("LocalCommunicator AllReduceSum #7 (rank 0 of 3): no answer
// within 0.3 s from rank 2"); ranks waiting in the same collective return the same status;
// every later call on any rank returns FailedPrecondition naming the original failure.
// Mismatched collectives (different op, count, root) break the group with InvalidArgument.
//
// Determinism: AllReduceSum computes data = ((x_0 + x_1) + x_2) + ... in rank order on
// every rank, so all ranks hold bit-identical results (and the same bits as the MPI
// communicator, which sums in the same order).
//
// Byte accounting (same convention as MpiCommunicator): AllReduceSum and AllGather of n
// floats count 4n(T-1) bytes sent and received per rank (an all-gather exchange);
// Broadcast counts bytes(T-1) sent on the root and bytes received elsewhere; Barrier 0.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

class LocalCommunicator;

class LocalCommunicatorGroup {
 public:
  // InvalidArgument for size < 1 or timeout_s <= 0.
  static absl::StatusOr<std::unique_ptr<LocalCommunicatorGroup>> Create(
      int size, CommunicatorOptions options = {});
  ~LocalCommunicatorGroup();
  LocalCommunicatorGroup(const LocalCommunicatorGroup&) = delete;
  LocalCommunicatorGroup& operator=(const LocalCommunicatorGroup&) = delete;

  int size() const { return size_; }
  const CommunicatorOptions& options() const { return options_; }
  // Rank r's communicator (0 <= r < size, asserted). Owned by the group.
  Communicator* Rank(int r);

 private:
  friend class LocalCommunicator;
  enum class Op : int { kNone, kAllReduceSum, kAllGather, kBroadcast, kBarrier };
  struct Meta {
    Op op = Op::kNone;
    int64_t count = 0;  // floats, or bytes for Broadcast
    int root = -1;
  };
  // Everything indexed [2] is by collective parity (seq & 1): a rank can be at most one
  // collective ahead of the slowest, so parity never aliases a collective still being read.
  struct Slot {
    int64_t posted = 0;            // last collective this rank posted (1-based sequence)
    Meta meta[2];                  // what it posted
    std::vector<char> staging[2];  // its payload
  };

  LocalCommunicatorGroup(int size, CommunicatorOptions options);

  const int size_;
  const CommunicatorOptions options_;
  std::vector<std::unique_ptr<LocalCommunicator>> ranks_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;  // [size], guarded by mu_ (payload: see header comment)
  absl::Status failure_;     // first failure; the group is broken when not OK
  int64_t failed_seq_ = 0;   // collective in which it happened
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }
  std::string_view kind() const override { return "local"; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* send, int64_t count, float* recv) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }
  int64_t bytes_received() const override { return bytes_received_; }

 private:
  friend class LocalCommunicatorGroup;
  using Op = LocalCommunicatorGroup::Op;
  LocalCommunicator(LocalCommunicatorGroup* group, int rank) : group_(group), rank_(rank) {}

  // Posts this rank's part of collective `op` (payload: `bytes` bytes at `payload`, may be
  // null) and waits for every rank to post it. On OK, the caller may read every rank's
  // staging slot of this collective's parity until its next collective.
  absl::Status Exchange(Op op, int64_t count, int root, const void* payload, int64_t bytes);
  // Marks this rank and the whole group broken with `status` (the group keeps the first
  // failure) and returns it.
  absl::Status Fail(absl::Status status);
  absl::Status BrokenError() const;
  // Rank r's staging payload of the collective just exchanged.
  const char* Payload(int r) const;

  LocalCommunicatorGroup* group_;
  const int rank_;
  int64_t seq_ = 0;  // collectives started by this rank
  absl::Status broken_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace specnode
