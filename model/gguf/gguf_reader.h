// GGUF v3 reader: memory-maps a file, validates every structure against the file size,
// and exposes metadata and tensor descriptors. Read-only after Open(); thread-safe for
// concurrent readers. The mapping lives as long as the GgufFile object; pointers returned
// by TensorData() are valid until it is destroyed.
//
// Validation (each failure is an InvalidArgument / DataLoss status naming the problem and
// the byte offset): magic "GGUF"; version 2 or 3; tensor and metadata counts bounded by
// what the file could hold; every string length and array length fits in the remaining
// bytes; metadata value types known; tensor dims 1..4, each > 0, element count without
// overflow and a multiple of the type's block size along dim 0; tensor type known to
// this engine; data offsets aligned to general.alignment (default 32; a power of two
// >= 8) and [offset, offset+size) inside the file, tensors not overlapping; duplicate keys
// or tensor names rejected. Truncation is DataLoss, bad values InvalidArgument.
//
// Beyond the spec, to bound work and memory on hostile input: arrays of arrays are
// rejected (no model uses them); keys are at most 65535 bytes, tensor names 1..63 bytes
// (as ggml); an array holds at most 2^22 elements and all arrays together 2^23; bool
// bytes must be 0 or 1. Tensor data is at least 8-byte aligned in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// One metadata value. Scalars of integer/bool type are held in `i` (uint64 values above
// INT64_MAX are rejected at parse), floats in `f`, strings in `str`. Arrays keep their
// element type in `elem_type` and the elements in `strings`, `ints` or `floats`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType elem_type = GgufValueType::kUint8;  // arrays only
  int64_t i = 0;
  double f = 0.0;
  std::string str;
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  uint64_t offset = 0;        // absolute byte offset in the file
  uint64_t n_bytes = 0;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Maps and validates `path`. NotFound if it cannot be opened.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a copy of `bytes` (fuzzing, tests). Same validation as Open().
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  // Metadata. Find returns nullptr when absent.
  const GgufValue* Find(std::string_view key) const;
  const std::vector<std::string>& keys() const { return key_order_; }
  // Typed getters: NotFound when absent, InvalidArgument (naming the key) on a type
  // mismatch. GetInt accepts any integer type; GetFloat any float or integer type.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(std::string_view key) const;
  absl::StatusOr<const std::vector<int64_t>*> GetIntArray(std::string_view key) const;
  absl::StatusOr<const std::vector<double>*> GetFloatArray(std::string_view key) const;

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Every tensor's bytes, summed: the weights' size.
  uint64_t tensor_bytes() const {
    uint64_t n = 0;
    for (const GgufTensorInfo& t : tensors_) n += t.n_bytes;
    return n;
  }
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // Start of the tensor's bytes inside the mapping ([n_bytes] bytes, validated).
  const uint8_t* TensorData(const GgufTensorInfo& t) const { return base_ + t.offset; }

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // mmap'd region, or nullptr when owned_ holds the bytes
  std::string owned_;
  uint32_t version_ = 0;
  std::unordered_map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace specnode
