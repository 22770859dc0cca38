// Device: where a model computes — the CPU or one CUDA device. Parsed once from its text
// ("cpu", "cuda:N") where a flag or a config file names it, and carried typed from there:
// backends, KV caches and page pools say where they are as a Device (Backend::device,
// KvCache::device, KvPagePool::device); its name is for messages only.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specnode {

struct Device {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA device (kCuda); 0 for the CPU

  static Device Cpu() { return {}; }
  static Device Cuda(int index) { return {Kind::kCuda, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string name() const;  // "cpu", "cuda:N"
  bool operator==(const Device&) const = default;
};

// "cpu" or "cuda:N" (N decimal digits only). InvalidArgument quoting the text otherwise:
// `expected cpu or cuda:N, got "gpu0"`.
absl::StatusOr<Device> ParseDevice(std::string_view text);

}  // namespace specnode
