// The "nccl" Communicator: the ranks of one tensor-parallel group are MPI processes, one
// GPU each; buffers are device memory on that GPU. Built only in CUDA builds with MPI
// (SPECNODE_HAVE_NCCL).
//
//   auto mpi = MpiCommunicator::CreateFromWorldRanks({1, 2, 3});
//   auto nccl = NcclCommunicator::Create(mpi->get(), /*device=*/local_rank);
//
// Create is collective over `mpi`'s group: group rank 0 makes the ncclUniqueId and sends
// it with mpi->Broadcast (deadline-bounded), then every rank selects `device`, creates a
// non-blocking stream and calls ncclCommInitRankConfig with a non-blocking config, polling
// ncclCommGetAsyncError until ready or the deadline. `mpi` is only used during Create.
//
// Collectives are synchronous for the caller: each enqueues the NCCL call on the
// communicator's own stream and polls cudaStreamQuery + ncclCommGetAsyncError with a
// sleeping backoff (20 µs .. 1 ms) until it completes. Inputs must be ready on the device
// before the call (synchronise the stream that produced them). On the deadline the NCCL
// communicator is aborted (ncclCommAbort, which frees kernels stuck waiting on a dead peer)
// and DeadlineExceeded is returned: NCCL does not tell which peer is missing, so the message
// says "peers unknown". Then broken (FailedPrecondition) like every Communicator.
//
// Determinism: NCCL reduces each element once and broadcasts it (ring / tree), so every
// rank gets identical bits, and a rerun on the same topology gives the same bits; the
// summation order is NCCL's, so results may differ from LocalCommunicator / MPI in the last
// bits. Byte accounting: the same logical convention as LocalCommunicator.
//
// Not thread-safe (Communicator contract); call from a thread that may use `device`.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(Communicator* mpi, int device,
                                                                  CommunicatorOptions options = {});
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view kind() const override { return "nccl"; }
  // data / send / recv: device pointers on device().
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* send, int64_t count, float* recv) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }
  int64_t bytes_received() const override { return bytes_received_; }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  NcclCommunicator(int rank, int size, int device, CommunicatorOptions options)
      : rank_(rank), size_(size), device_(device), options_(options) {}
  // Polls until the communicator is initialised / the stream is idle, or the deadline.
  absl::Status WaitComm(const char* what);
  absl::Status WaitStream(const char* what);
  absl::Status Fail(absl::Status status);
  absl::Status BrokenError() const;

  const int rank_;
  const int size_;
  const int device_;
  const CommunicatorOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;  // one device float for Barrier
  bool aborted_ = false;
  int64_t seq_ = 0;
  absl::Status broken_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace specnode
