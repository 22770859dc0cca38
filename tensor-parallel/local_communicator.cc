#include "tensor-parallel/local_communicator.h"

#include <cassert>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace specnode {
namespace {

const char* OpName(int op) {  // LocalCommunicatorGroup::Op
  switch (op) {
    case 1:
      return "AllReduceSum";
    case 2:
      return "AllGather";
    case 3:
      return "Broadcast";
    case 4:
      return "Barrier";
    default:
      return "?";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCommunicatorGroup>> LocalCommunicatorGroup::Create(
    int size, CommunicatorOptions options) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalCommunicatorGroup: size must be >= 1, got ", size));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalCommunicatorGroup: timeout_s must be > 0, got ", options.timeout_s));
  }
  return std::unique_ptr<LocalCommunicatorGroup>(new LocalCommunicatorGroup(size, options));
}

LocalCommunicatorGroup::LocalCommunicatorGroup(int size, CommunicatorOptions options)
    : size_(size), options_(options), slots_(size) {
  for (int r = 0; r < size; ++r) {
    ranks_.push_back(std::unique_ptr<LocalCommunicator>(new LocalCommunicator(this, r)));
  }
}

LocalCommunicatorGroup::~LocalCommunicatorGroup() = default;

Communicator* LocalCommunicatorGroup::Rank(int r) {
  assert(r >= 0 && r < size_);
  return ranks_[r].get();
}

absl::Status LocalCommunicator::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("LocalCommunicator rank ", rank_, " of ", group_->size_,
                   " is broken by an earlier failure: ", broken_.message()));
}

absl::Status LocalCommunicator::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(group_->mu_);
    if (group_->failure_.ok()) {
      group_->failure_ = status;
      group_->failed_seq_ = seq_;
    }
  }
  group_->cv_.notify_all();
  broken_ = status;
  return status;
}

const char* LocalCommunicator::Payload(int r) const {
  return group_->slots_[r].staging[seq_ & 1].data();
}

absl::Status LocalCommunicator::Exchange(Op op, int64_t count, int root, const void* payload,
                                         int64_t bytes) {
  LocalCommunicatorGroup& g = *group_;
  const int64_t seq = ++seq_;
  const int parity = static_cast<int>(seq & 1);
  const char* name = OpName(static_cast<int>(op));
  LocalCommunicatorGroup::Slot& mine = g.slots_[rank_];
  // Nobody reads this parity's staging now: the last collective with this parity (seq-2)
  // finished on every rank before any of them posted seq-1, which this rank has completed.
  mine.staging[parity].resize(static_cast<size_t>(bytes));
  if (bytes > 0) std::memcpy(mine.staging[parity].data(), payload, static_cast<size_t>(bytes));

  std::unique_lock<std::mutex> lock(g.mu_);
  if (!g.failure_.ok()) {
    broken_ = g.failure_;
    return BrokenError();
  }
  mine.meta[parity] = {op, count, root};
  mine.posted = seq;
  g.cv_.notify_all();

  const auto all_posted = [&] {
    for (const auto& s : g.slots_) {
      if (s.posted < seq) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(g.options_.timeout_s));
  while (!all_posted()) {
    if (!g.failure_.ok()) {
      broken_ = g.failure_;
      // Ranks waiting in the collective that failed report that failure itself.
      return g.failed_seq_ == seq ? g.failure_ : BrokenError();
    }
    if (g.cv_.wait_until(lock, deadline) == std::cv_status::timeout && !all_posted() &&
        g.failure_.ok()) {
      std::vector<std::string> missing;
      for (int r = 0; r < g.size_; ++r) {
        if (g.slots_[r].posted < seq) missing.push_back(absl::StrCat("rank ", r));
      }
      g.failure_ = absl::DeadlineExceededError(
          absl::StrFormat("LocalCommunicator %s #%d: no answer within %g s from %s", name, seq,
                          g.options_.timeout_s, absl::StrJoin(missing, ", ")));
      g.failed_seq_ = seq;
      g.cv_.notify_all();
    }
  }
  // Every rank posted `seq`; their metadata of this parity is stable until we post again.
  for (int r = 0; r < g.size_; ++r) {
    const auto& m = g.slots_[r].meta[parity];
    if (m.op != op || m.count != count || m.root != root) {
      const absl::Status status = absl::InvalidArgumentError(absl::StrFormat(
          "LocalCommunicator collective #%d mismatch: rank %d called %s(count %d, root %d), "
          "rank %d called %s(count %d, root %d)",
          seq, rank_, name, count, root, r, OpName(static_cast<int>(m.op)), m.count, m.root));
      if (g.failure_.ok()) {
        g.failure_ = status;
        g.failed_seq_ = seq;
      }
      broken_ = status;
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllReduceSum(float* data, int64_t count) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && data == nullptr)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("LocalCommunicator AllReduceSum: bad buffer (count ", count, ")")));
  }
  const int n = group_->size_;
  if (n == 1) return absl::OkStatus();
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  if (absl::Status s = Exchange(Op::kAllReduceSum, count, -1, data, bytes); !s.ok()) return s;
  // Rank order, element by element: ((x0 + x1) + x2) + ... — identical bits on every rank.
  // (count 0 takes part in the ordering but moves nothing: data may be null then.)
  if (bytes > 0) std::memcpy(data, Payload(0), static_cast<size_t>(bytes));
  for (int r = 1; r < n; ++r) {
    const float* x = reinterpret_cast<const float*>(Payload(r));
    for (int64_t i = 0; i < count; ++i) data[i] += x[i];
  }
  bytes_sent_ += bytes * (n - 1);
  bytes_received_ += bytes * (n - 1);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllGather(const float* send, int64_t count, float* recv) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && (send == nullptr || recv == nullptr))) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("LocalCommunicator AllGather: bad buffers (count ", count, ")")));
  }
  const int n = group_->size_;
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  if (n == 1) {
    if (bytes > 0) std::memmove(recv, send, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  if (absl::Status s = Exchange(Op::kAllGather, count, -1, send, bytes); !s.ok()) return s;
  for (int r = 0; r < n; ++r) {
    if (bytes > 0) std::memcpy(recv + r * count, Payload(r), static_cast<size_t>(bytes));
  }
  bytes_sent_ += bytes * (n - 1);
  bytes_received_ += bytes * (n - 1);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  if (!broken_.ok()) return BrokenError();
  const int n = group_->size_;
  if (bytes < 0 || (bytes > 0 && data == nullptr) || root < 0 || root >= n) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "LocalCommunicator Broadcast: bad arguments (bytes ", bytes, ", root ", root, ")")));
  }
  if (n == 1) return absl::OkStatus();
  const bool is_root = rank_ == root;
  if (absl::Status s = Exchange(Op::kBroadcast, bytes, root, data, is_root ? bytes : 0); !s.ok()) {
    return s;
  }
  if (is_root) {
    bytes_sent_ += bytes * (n - 1);
  } else {
    if (bytes > 0) std::memcpy(data, Payload(root), static_cast<size_t>(bytes));
    bytes_received_ += bytes;
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Barrier() {
  if (!broken_.ok()) return BrokenError();
  if (group_->size_ == 1) return absl::OkStatus();
  return Exchange(Op::kBarrier, 0, -1, nullptr, 0);
}

}  // namespace specnode
