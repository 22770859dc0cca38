#include "tensor-parallel/mpi_communicator.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/status_macros.h"
#include "tensor-parallel/mpi_check.h"

namespace specnode {
namespace {

constexpr int kTagModulus = 32768;  // MPI guarantees MPI_TAG_UB >= 32767

// Staging buffers a failed exchange left with MPI (see Fail): kept for the life of the
// process and reachable from here, so that they are never reused or freed while MPI may
// still write into them, and a leak checker sees them as held, not lost. Bounded: a
// communicator fails once (it is broken afterwards). Thread-safe.
void AbandonBuffer(std::vector<char> buffer) {
  static std::mutex mu;
  static auto* buffers = new std::vector<std::vector<char>>();
  std::lock_guard lock(mu);
  buffers->push_back(std::move(buffer));
}

// FNV-1a of the rank list, so members can tell they were given the same group.
int ListHash(std::span<const int> ranks) {
  uint32_t h = 2166136261u;
  for (int r : ranks) {
    h ^= static_cast<uint32_t>(r);
    h *= 16777619u;
  }
  return static_cast<int>(h & 0x7fffffff);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommunicatorOptions options)
    : comm_(comm), options_(options) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  AbandonRequests(requests_, posted_receives_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::Init() {
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm_, &rank_));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm_, &size_));
  MPI_Group group, world_group;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_group(comm_, &group));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  std::vector<int> mine(size_);
  std::iota(mine.begin(), mine.end(), 0);
  world_ranks_.assign(size_, -1);
  const int rc =
      MPI_Group_translate_ranks(group, size_, mine.data(), world_group, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  SPECNODE_MPI_RETURN_IF_ERROR(rc);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) peers_.push_back(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    MPI_Comm comm, CommunicatorOptions options) {
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MpiCommunicator: timeout_s must be > 0, got ", options.timeout_s));
  }
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_idup(comm, &dup, &request));
  SPECNODE_RETURN_IF_ERROR(MpiWaitWithDeadline(&request, MPI_STATUS_IGNORE, options.timeout_s,
                                               "MpiCommunicator: MPI_Comm_idup"));
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(dup, options));
  SPECNODE_RETURN_IF_ERROR(c->Init());
  return c;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::CreateFromWorldRanks(
    std::span<const int> world_ranks, CommunicatorOptions options) {
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MpiCommunicator: timeout_s must be > 0, got ", options.timeout_s));
  }
  int world_rank = 0, world_size = 0;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const std::string list = absl::StrJoin(world_ranks, ",");
  if (world_ranks.empty()) {
    return absl::InvalidArgumentError("MpiCommunicator: empty list of world ranks");
  }
  int me = -1;
  for (size_t i = 0; i < world_ranks.size(); ++i) {
    const int r = world_ranks[i];
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat("MpiCommunicator: world rank ", r,
                                                     " out of range (world size ", world_size,
                                                     ") in [", list, "]"));
    }
    if (std::count(world_ranks.begin(), world_ranks.end(), r) > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("MpiCommunicator: world rank ", r, " listed twice in [", list, "]"));
    }
    if (r == world_rank) me = static_cast<int>(i);
  }
  if (me < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MpiCommunicator: world rank ", world_rank,
                                                   " is not in the group [", list, "]"));
  }

  // Check in with every other member (bounded by the deadline), comparing the lists.
  const int n = static_cast<int>(world_ranks.size());
  const int my_hash = ListHash(world_ranks);
  std::vector<int> their_hash(n, 0);
  std::vector<MPI_Request> requests;
  std::vector<std::string> labels;
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    requests.emplace_back();
    SPECNODE_MPI_RETURN_IF_ERROR(MPI_Irecv(&their_hash[i], 1, MPI_INT, world_ranks[i],
                                           kMpiGroupHandshakeTag, MPI_COMM_WORLD,
                                           &requests.back()));
    labels.push_back(absl::StrCat("world rank ", world_ranks[i]));
  }
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    requests.emplace_back();
    SPECNODE_MPI_RETURN_IF_ERROR(MPI_Isend(&my_hash, 1, MPI_INT, world_ranks[i],
                                           kMpiGroupHandshakeTag, MPI_COMM_WORLD,
                                           &requests.back()));
    labels.push_back(absl::StrCat("world rank ", world_ranks[i]));
  }
  const absl::Status waited =
      MpiWaitAllWithDeadline(std::span<MPI_Request>(requests), labels, options.timeout_s,
                             absl::StrCat("MpiCommunicator: forming group [", list, "]"));
  if (!waited.ok()) {
    // Leak the buffers of pending requests: a late peer may still write into them.
    auto* leaked = new std::vector<int>(std::move(their_hash));
    (void)leaked;
    AbandonRequests(requests, static_cast<size_t>(n - 1));  // the receives come first
    return waited;
  }
  for (int i = 0; i < n; ++i) {
    if (i != me && their_hash[i] != my_hash) {
      return absl::InvalidArgumentError(absl::StrCat("MpiCommunicator: world rank ", world_ranks[i],
                                                     " was given a different group list than [",
                                                     list, "]"));
    }
  }

  MPI_Group world_group, group;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  const int rc = MPI_Group_incl(world_group, n, world_ranks.data(), &group);
  MPI_Group_free(&world_group);
  SPECNODE_MPI_RETURN_IF_ERROR(rc);
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc2 = MPI_Comm_create_group(MPI_COMM_WORLD, group, kMpiGroupHandshakeTag, &comm);
  MPI_Group_free(&group);
  SPECNODE_MPI_RETURN_IF_ERROR(rc2);
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(comm, options));
  SPECNODE_RETURN_IF_ERROR(c->Init());
  return c;
}

absl::Status MpiCommunicator::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("MpiCommunicator rank ", rank_, " of ", size_,
                   " is broken by an earlier failure: ", broken_.message()));
}

absl::Status MpiCommunicator::Fail(absl::Status status) {
  broken_ = status;
  const bool pending = std::any_of(requests_.begin(), requests_.end(),
                                   [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  AbandonRequests(requests_, posted_receives_);
  if (pending) {
    // MPI may still deliver a late message into (or read) the staging buffer: give it up.
    // The vector's heap block moves, so MPI's pointers into it stay valid.
    AbandonBuffer(std::move(staging_));
    staging_.clear();
  }
  return status;
}

absl::Status MpiCommunicator::Exchange(const char* name, int64_t count, int64_t row_bytes,
                                       std::span<const int> send_to,
                                       std::span<const int> recv_from) {
  const int64_t seq = ++seq_;
  const int tag = static_cast<int>(seq % kTagModulus);
  if (row_bytes > INT32_MAX) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("MpiCommunicator ", name, ": ", row_bytes, " bytes exceed one MPI message")));
  }
  requests_.clear();
  posted_receives_ = 0;
  labels_.clear();
  const auto label = [&](int r) {
    return absl::StrCat("rank ", r, " (world ", world_ranks_[r], ")");
  };
  for (int r : recv_from) {
    requests_.emplace_back(MPI_REQUEST_NULL);
    labels_.push_back(label(r));
    const int rc =
        MPI_Irecv(Row(r), static_cast<int>(row_bytes), MPI_BYTE, r, tag, comm_, &requests_.back());
    if (rc != MPI_SUCCESS) return Fail(SPECNODE_MPI_STATUS(rc));
    ++posted_receives_;
  }
  for (int r : send_to) {
    requests_.emplace_back(MPI_REQUEST_NULL);
    labels_.push_back(label(r));
    const int rc = MPI_Isend(Row(rank_), static_cast<int>(row_bytes), MPI_BYTE, r, tag, comm_,
                             &requests_.back());
    if (rc != MPI_SUCCESS) return Fail(SPECNODE_MPI_STATUS(rc));
  }
  const std::string what =
      absl::StrFormat("MpiCommunicator %s #%d (%d %s) on rank %d of %d", name, seq, count,
                      std::strcmp(name, "Broadcast") == 0 ? "bytes" : "floats", rank_, size_);
  absl::Status s =
      MpiWaitAllWithDeadline(std::span<MPI_Request>(requests_), labels_, options_.timeout_s, what);
  if (!s.ok()) return Fail(std::move(s));
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllReduceSum(float* data, int64_t count) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && data == nullptr)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("MpiCommunicator AllReduceSum: bad buffer (count ", count, ")")));
  }
  if (size_ == 1) return absl::OkStatus();
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  row_bytes_ = bytes;
  staging_.resize(static_cast<size_t>(bytes) * size_);
  if (bytes > 0) std::memcpy(Row(rank_), data, static_cast<size_t>(bytes));
  SPECNODE_RETURN_IF_ERROR(Exchange("AllReduceSum", count, bytes, peers_, peers_));
  // Rank order, element by element: ((x0 + x1) + x2) + ... — identical bits on every rank.
  // (count 0 takes part in the ordering but moves nothing: data may be null then.)
  if (bytes > 0) std::memcpy(data, Row(0), static_cast<size_t>(bytes));
  for (int r = 1; r < size_; ++r) {
    const float* x = reinterpret_cast<const float*>(Row(r));
    for (int64_t i = 0; i < count; ++i) data[i] += x[i];
  }
  bytes_sent_ += bytes * (size_ - 1);
  bytes_received_ += bytes * (size_ - 1);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGather(const float* send, int64_t count, float* recv) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && (send == nullptr || recv == nullptr))) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("MpiCommunicator AllGather: bad buffers (count ", count, ")")));
  }
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  if (size_ == 1) {
    if (bytes > 0) std::memmove(recv, send, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  row_bytes_ = bytes;
  staging_.resize(static_cast<size_t>(bytes) * size_);
  if (bytes > 0) std::memcpy(Row(rank_), send, static_cast<size_t>(bytes));
  SPECNODE_RETURN_IF_ERROR(Exchange("AllGather", count, bytes, peers_, peers_));
  if (bytes > 0) std::memcpy(recv, staging_.data(), static_cast<size_t>(bytes) * size_);
  bytes_sent_ += bytes * (size_ - 1);
  bytes_received_ += bytes * (size_ - 1);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  if (!broken_.ok()) return BrokenError();
  if (bytes < 0 || (bytes > 0 && data == nullptr) || root < 0 || root >= size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "MpiCommunicator Broadcast: bad arguments (bytes ", bytes, ", root ", root, ")")));
  }
  if (size_ == 1) return absl::OkStatus();
  row_bytes_ = bytes;
  staging_.resize(static_cast<size_t>(bytes) * size_);
  const bool is_root = rank_ == root;
  if (is_root) {
    if (bytes > 0) std::memcpy(Row(rank_), data, static_cast<size_t>(bytes));
    SPECNODE_RETURN_IF_ERROR(Exchange("Broadcast", bytes, bytes, peers_, {}));
    bytes_sent_ += bytes * (size_ - 1);
  } else {
    const int from[1] = {root};
    SPECNODE_RETURN_IF_ERROR(Exchange("Broadcast", bytes, bytes, {}, from));
    if (bytes > 0) std::memcpy(data, Row(root), static_cast<size_t>(bytes));
    bytes_received_ += bytes;
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Barrier() {
  if (!broken_.ok()) return BrokenError();
  if (size_ == 1) return absl::OkStatus();
  row_bytes_ = 0;
  return Exchange("Barrier", 0, 0, peers_, peers_);
}

}  // namespace specnode
