// GGUF v3 writer for the project's own files (tiny test models, fuzz seeds).
// Not thread-safe. Keys and tensors are written in insertion order; tensor data is
// padded to `alignment` bytes (general.alignment is written when it is not 32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/gguf/ggml_types.h"
#include "model/gguf/gguf_reader.h"

namespace specnode {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);  // a power of two >= 8

  void AddUint32(const std::string& key, uint32_t v);
  void AddInt32(const std::string& key, int32_t v);
  void AddUint64(const std::string& key, uint64_t v);
  void AddFloat32(const std::string& key, float v);
  void AddBool(const std::string& key, bool v);
  void AddString(const std::string& key, const std::string& v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& v);
  void AddFloat32Array(const std::string& key, const std::vector<float>& v);

  // `data` holds the tensor already encoded in `type` (see ggml_types.h), dims in ggml
  // order (dims[0] contiguous). Size is checked against dims and type.
  absl::Status AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& dims,
                         std::string data);
  // Convenience: encodes f32 values into `type` with QuantizeRow (row = dims[0]).
  absl::Status AddTensorF32(const std::string& name, GgmlType type,
                            const std::vector<int64_t>& dims, const std::vector<float>& values);

  // The whole file as bytes / written to `path` (Internal status on I/O failure).
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::string data;
  };
  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  std::string kv_bytes_;  // serialised key/value pairs
  std::vector<Tensor> tensors_;
};

}  // namespace specnode
