// DeviceBuffer: one owned allocation of device memory (cudaMalloc / cudaFree), move-only.
//
// Every path that creates a buffer returns absl::Status(Or), and the destructor frees, so an
// early return between an allocation and its use cannot leak. Copies are synchronous
// (cudaMemcpy on the legacy default stream): meant for loading weights, tests and
// benchmarks, not for the per-step hot path, which should use stream-ordered copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: data() == nullptr, size() == 0
  ~DeviceBuffer() { Reset(); }

  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` of uninitialised device memory on the current device (cudaMalloc alignment,
  // at least 256 bytes). bytes == 0 gives an empty buffer without touching the runtime.
  // The allocation is padded to a multiple of 16 bytes (size() stays `bytes`), so a kernel
  // may read the 16-byte vector holding a buffer's last byte (cuda_qmatvec_kernels.cu
  // copies weight rows as 16-byte units aligned down and up).
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // Allocate(bytes) and copy host[0, bytes) into it.
  static absl::StatusOr<DeviceBuffer> FromHost(const void* host, size_t bytes);

  // Copies host[0, bytes) to data()[offset, offset + bytes). OutOfRange when it does not fit.
  absl::Status CopyFromHost(const void* host, size_t bytes, size_t offset = 0);
  // Copies data()[offset, offset + bytes) to host[0, bytes). OutOfRange when out of bounds.
  // Synchronises with the legacy default stream, so prior kernels on it have finished.
  absl::Status CopyToHost(void* host, size_t bytes, size_t offset = 0) const;
  // Sets every byte to zero (cudaMemset).
  absl::Status Zero();

  // Makes size() >= bytes, reallocating (contents discarded) only when it must grow.
  absl::Status Reserve(size_t bytes);
  // Reserve to the next power of two (at least 256 bytes), so that a growing need
  // reallocates (and changes any recorded graph's pointers) only log(n) times.
  absl::Status Grow(size_t bytes);
  // Frees now (cudaFree errors at this point are ignored: there is no one to report them to,
  // and they can only mean the context is already broken).
  void Reset();

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// PinnedHostBuffer: page-locked host memory (cudaMallocHost / cudaFreeHost), move-only:
// the host end of stream-ordered copies (cudaMemcpyAsync is asynchronous only from or to
// pinned memory). Reserve grows it to a power of two (contents discarded).
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  ~PinnedHostBuffer() { Reset(); }
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  // ResourceExhausted / Internal when the runtime cannot pin that much.
  absl::Status Reserve(size_t bytes);
  void Reset();
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace specnode
