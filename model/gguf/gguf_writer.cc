#include "model/gguf/gguf_writer.h"

#include <bit>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specnode {
namespace {

template <typename T>
void Put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.append(s);
}

void PutKey(std::string& out, std::string_view key, GgufValueType type) {
  PutString(out, key);
  Put<uint32_t>(out, static_cast<uint32_t>(type));
}

// Debian's Abseil has its own string_view, which StrCat wants.
absl::string_view TypeName(GgmlType t) {
  std::string_view n = GgmlTypeName(static_cast<uint32_t>(t));
  return absl::string_view(n.data(), n.size());
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  assert(alignment >= 8 && std::has_single_bit(alignment));  // GGUF: multiple of 8
  if (alignment != 32) AddUint32("general.alignment", alignment);
}

void GgufWriter::AddUint32(const std::string& key, uint32_t v) {
  PutKey(kv_bytes_, key, GgufValueType::kUint32);
  Put(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::AddInt32(const std::string& key, int32_t v) {
  PutKey(kv_bytes_, key, GgufValueType::kInt32);
  Put(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::AddUint64(const std::string& key, uint64_t v) {
  PutKey(kv_bytes_, key, GgufValueType::kUint64);
  Put(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::AddFloat32(const std::string& key, float v) {
  PutKey(kv_bytes_, key, GgufValueType::kFloat32);
  Put(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::AddBool(const std::string& key, bool v) {
  PutKey(kv_bytes_, key, GgufValueType::kBool);
  Put<uint8_t>(kv_bytes_, v ? 1 : 0);
  ++n_kv_;
}

void GgufWriter::AddString(const std::string& key, const std::string& v) {
  PutKey(kv_bytes_, key, GgufValueType::kString);
  PutString(kv_bytes_, v);
  ++n_kv_;
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  PutKey(kv_bytes_, key, GgufValueType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(kv_bytes_, v.size());
  for (const std::string& s : v) PutString(kv_bytes_, s);
  ++n_kv_;
}

void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& v) {
  PutKey(kv_bytes_, key, GgufValueType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<uint64_t>(kv_bytes_, v.size());
  for (int32_t x : v) Put(kv_bytes_, x);
  ++n_kv_;
}

void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& v) {
  PutKey(kv_bytes_, key, GgufValueType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<uint64_t>(kv_bytes_, v.size());
  for (float x : v) Put(kv_bytes_, x);
  ++n_kv_;
}

absl::Status GgufWriter::AddTensor(const std::string& name, GgmlType type,
                                   const std::vector<int64_t>& dims, std::string data) {
  if (name.empty() || name.size() > 63) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' must be 1..63 bytes"));
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", name, "'"));
    }
  }
  if (!IsSupportedGgmlType(static_cast<uint32_t>(type))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': unsupported type ", static_cast<uint32_t>(type)));
  }
  if (dims.empty() || dims.size() > 4) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' needs 1..4 dims"));
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' has bad dims [", absl::StrJoin(dims, ", "), "]"));
    }
  }
  if (dims[0] % GgmlBlockSize(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': dim 0 (", dims[0],
                                                   ") is not a multiple of the ", TypeName(type),
                                                   " block size"));
  }
  const uint64_t want = static_cast<uint64_t>(n / GgmlBlockSize(type)) * GgmlBlockBytes(type);
  if (data.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", data.size(),
                                                   " bytes of data, dims and type need ", want));
  }
  tensors_.push_back(Tensor{name, type, dims, std::move(data)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorF32(const std::string& name, GgmlType type,
                                      const std::vector<int64_t>& dims,
                                      const std::vector<float>& values) {
  if (dims.empty() || dims[0] <= 0 || !IsSupportedGgmlType(static_cast<uint32_t>(type)) ||
      dims[0] % GgmlBlockSize(type) != 0 || values.size() % static_cast<size_t>(dims[0]) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", values.size(), " values do not fit dims [",
                     absl::StrJoin(dims, ", "), "] of type ", TypeName(type)));
  }
  const int64_t cols = dims[0];
  const int64_t rows = static_cast<int64_t>(values.size()) / cols;
  const size_t row_bytes = GgmlRowBytes(type, cols);
  std::string data(row_bytes * static_cast<size_t>(rows), '\0');
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(type, values.data() + r * cols, data.data() + r * row_bytes, cols);
  }
  // AddTensor checks that the value count matches the product of dims.
  return AddTensor(name, type, dims, std::move(data));
}

namespace {

// Emits the file through `sink` so Serialize and WriteFile share one layout. A template
// so it can take the writer's private Tensor type by deduction.
template <typename Tensors, typename Sink>
void Emit(uint32_t alignment, uint64_t n_kv, const std::string& kv_bytes, const Tensors& tensors,
          Sink&& sink) {
  std::string head;
  Put<uint32_t>(head, 0x46554747u);  // "GGUF"
  Put<uint32_t>(head, 3);
  Put<uint64_t>(head, tensors.size());
  Put<uint64_t>(head, n_kv);
  head += kv_bytes;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    PutString(head, t.name);
    Put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(head, static_cast<uint64_t>(d));
    Put<uint32_t>(head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(head, offset);
    offset = AlignUp(offset + t.data.size(), alignment);
  }
  head.resize(AlignUp(head.size(), alignment), '\0');
  sink(std::string_view(head));
  const std::string zeros(alignment, '\0');
  for (const auto& t : tensors) {
    sink(std::string_view(t.data));
    // The last tensor is padded too, as llama.cpp's writer does.
    sink(std::string_view(zeros).substr(0, AlignUp(t.data.size(), alignment) - t.data.size()));
  }
}

}  // namespace

std::string GgufWriter::Serialize() const {
  std::string out;
  Emit(alignment_, n_kv_, kv_bytes_, tensors_, [&](std::string_view s) { out.append(s); });
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
  int write_errno = 0;
  Emit(alignment_, n_kv_, kv_bytes_, tensors_, [&](std::string_view s) {
    if (write_errno == 0 && !s.empty() && std::fwrite(s.data(), 1, s.size(), f) != s.size()) {
      write_errno = errno != 0 ? errno : EIO;
    }
  });
  if (std::fclose(f) != 0 && write_errno == 0) write_errno = errno != 0 ? errno : EIO;
  if (write_errno != 0) {
    return absl::InternalError(
        absl::StrCat("writing '", path, "' failed: ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

}  // namespace specnode
