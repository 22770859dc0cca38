#include "cuda/nccl_communicator.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/cuda_check.h"
#include "model/status_macros.h"
#include "cuda/nccl_check.h"

namespace specnode {

namespace nccl_internal {

absl::Status NcclErrorToStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr,
                                          " failed: ", ncclGetErrorString(result), " (ncclResult ",
                                          static_cast<int>(result), ")"));
}

}  // namespace nccl_internal

namespace {

constexpr int64_t kFirstSleepNs = 20'000;
constexpr int64_t kMaxSleepNs = 1'000'000;

void SleepNs(int64_t ns) {
  timespec ts{0, static_cast<long>(ns)};
  nanosleep(&ts, nullptr);
}

std::chrono::steady_clock::time_point Deadline(double s) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(s));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    Communicator* mpi, int device, CommunicatorOptions options) {
  if (mpi == nullptr)
    return absl::InvalidArgumentError("NcclCommunicator: no bootstrap communicator");
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator: timeout_s must be > 0, got ", options.timeout_s));
  }
  SPECNODE_ASSIGN_OR_RETURN(const int n_devices, CudaDeviceCount());
  if (device < 0 || device >= n_devices) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NcclCommunicator: device %d does not exist (%d visible)", device, n_devices));
  }
  // The id is made on group rank 0 and sent to the others over the bootstrap communicator.
  // A rank that failed above never gets here and the others' Broadcast times out.
  ncclUniqueId id{};
  if (mpi->rank() == 0) SPECNODE_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  SPECNODE_RETURN_IF_ERROR(mpi->Broadcast(&id, sizeof(id), 0));

  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(mpi->rank(), mpi->size(), device, options));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMalloc(&c->barrier_buf_, sizeof(float)));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that init and collectives can be bounded by our deadline
  SPECNODE_NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&c->comm_, c->size_, id, c->rank_, &config));
  SPECNODE_RETURN_IF_ERROR(c->WaitComm("ncclCommInitRankConfig"));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    if (!broken_.ok() && !aborted_) {
      ncclCommAbort(comm_);
    } else if (!aborted_) {
      ncclCommFinalize(comm_);
      // Non-blocking: finalize may be in progress; bounded poll, then destroy (or abort).
      ncclResult_t state = ncclInProgress;
      const auto deadline = Deadline(options_.timeout_s);
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             std::chrono::steady_clock::now() < deadline) {
        SleepNs(kMaxSleepNs);
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
  }
  if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status NcclCommunicator::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("NcclCommunicator rank ", rank_, " of ", size_,
                   " is broken by an earlier failure: ", broken_.message()));
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  broken_ = status;
  if (comm_ != nullptr && !aborted_) {
    ncclCommAbort(comm_);  // releases kernels blocked on a missing peer
    aborted_ = true;
    comm_ = nullptr;
  }
  return status;
}

absl::Status NcclCommunicator::WaitComm(const char* what) {
  const auto deadline = Deadline(options_.timeout_s);
  int64_t sleep_ns = kFirstSleepNs;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const absl::Status s = SPECNODE_NCCL_STATUS(ncclCommGetAsyncError(comm_, &state));
    if (!s.ok()) return Fail(s);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return Fail(absl::InternalError(absl::StrCat("NcclCommunicator ", what, ": ",
                                                   ncclGetErrorString(state), " (",
                                                   ncclGetLastError(comm_), ")")));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrFormat("NcclCommunicator %s on rank %d of %d: no answer within %g s (peers "
                          "unknown)",
                          what, rank_, size_, options_.timeout_s)));
    }
    SleepNs(sleep_ns);
    sleep_ns = std::min(kMaxSleepNs, sleep_ns * 2);
  }
}

absl::Status NcclCommunicator::WaitStream(const char* what) {
  SPECNODE_RETURN_IF_ERROR(WaitComm(what));  // the enqueue itself may be in progress
  const auto deadline = Deadline(options_.timeout_s);
  int64_t sleep_ns = kFirstSleepNs;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return Fail(SPECNODE_CUDA_STATUS(q));
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(absl::InternalError(absl::StrCat("NcclCommunicator ", what, ": ",
                                                   ncclGetErrorString(state), " (",
                                                   ncclGetLastError(comm_), ")")));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrFormat(
          "NcclCommunicator %s #%d on rank %d of %d: no answer within %g s (peers unknown)", what,
          seq_, rank_, size_, options_.timeout_s)));
    }
    SleepNs(sleep_ns);
    sleep_ns = std::min(kMaxSleepNs, sleep_ns * 2);
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t count) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && data == nullptr)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator AllReduceSum: bad buffer (count ", count, ")")));
  }
  ++seq_;
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = SPECNODE_NCCL_STATUS(ncclAllReduce(data, data, static_cast<size_t>(count),
                                                          ncclFloat32, ncclSum, comm_, stream_));
      !s.ok()) {
    return Fail(s);
  }
  SPECNODE_RETURN_IF_ERROR(WaitStream("AllReduceSum"));
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  bytes_sent_ += bytes * (size_ - 1);
  bytes_received_ += bytes * (size_ - 1);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const float* send, int64_t count, float* recv) {
  if (!broken_.ok()) return BrokenError();
  if (count < 0 || (count > 0 && (send == nullptr || recv == nullptr))) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicator AllGather: bad buffers (count ", count, ")")));
  }
  ++seq_;
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = SPECNODE_NCCL_STATUS(
          ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, comm_, stream_));
      !s.ok()) {
    return Fail(s);
  }
  SPECNODE_RETURN_IF_ERROR(WaitStream("AllGather"));
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  bytes_sent_ += bytes * (size_ - 1);
  bytes_received_ += bytes * (size_ - 1);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  if (!broken_.ok()) return BrokenError();
  if (bytes < 0 || (bytes > 0 && data == nullptr) || root < 0 || root >= size_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicator Broadcast: bad arguments (bytes ", bytes, ", root ", root, ")")));
  }
  ++seq_;
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = SPECNODE_NCCL_STATUS(
          ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
      !s.ok()) {
    return Fail(s);
  }
  SPECNODE_RETURN_IF_ERROR(WaitStream("Broadcast"));
  if (rank_ == root) {
    bytes_sent_ += bytes * (size_ - 1);
  } else {
    bytes_received_ += bytes;
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  if (!broken_.ok()) return BrokenError();
  ++seq_;
  // NCCL has no barrier: a one-float all-reduce completes only when every rank joined.
  if (absl::Status s = SPECNODE_NCCL_STATUS(
          ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
      !s.ok()) {
    return Fail(s);
  }
  return WaitStream("Barrier");
}

}  // namespace specnode
