#include "cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"

namespace specnode {
namespace {

absl::Status CheckRange(size_t offset, size_t bytes, size_t size) {
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("device buffer range [", offset, ", ", offset + bytes,
                                              ") exceeds its ", size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  void* ptr = nullptr;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, (bytes + 15) & ~size_t{15}));
  buffer.ptr_ = ptr;
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::FromHost(const void* host, size_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer = Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  // On a failed copy `buffer` goes out of scope here and frees the allocation.
  absl::Status copied = buffer->CopyFromHost(host, bytes);
  if (!copied.ok()) return copied;
  return buffer;
}

absl::Status DeviceBuffer::CopyFromHost(const void* host, size_t bytes, size_t offset) {
  absl::Status in_range = CheckRange(offset, bytes, bytes_);
  if (!in_range.ok()) return in_range;
  if (bytes == 0) return absl::OkStatus();
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* host, size_t bytes, size_t offset) const {
  absl::Status in_range = CheckRange(offset, bytes, bytes_);
  if (!in_range.ok()) return in_range;
  if (bytes == 0) return absl::OkStatus();
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Zero() {
  if (bytes_ == 0) return absl::OkStatus();
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemset(ptr_, 0, bytes_));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  Reset();  // free first: growing must not need old + new at once
  absl::StatusOr<DeviceBuffer> grown = Allocate(bytes);
  if (!grown.ok()) return grown.status();
  *this = std::move(*grown);
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Grow(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  return Reserve(std::bit_ceil(std::max<size_t>(bytes, 256)));
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

absl::Status PinnedHostBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  size_t grown = 4096;
  while (grown < bytes) grown *= 2;
  Reset();
  void* ptr = nullptr;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr, grown));
  ptr_ = ptr;
  bytes_ = grown;
  return absl::OkStatus();
}

void PinnedHostBuffer::Reset() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace specnode
