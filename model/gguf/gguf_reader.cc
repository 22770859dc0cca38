#include "model/gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF parsing assumes little endian");

// Limits beyond what the format itself implies. Each keeps a hostile file from making us
// allocate far more than its own size or loop for a long time.
constexpr uint64_t kMaxKeyLength = 65535;      // GGUF spec
constexpr uint64_t kMaxTensorNameLength = 63;  // ggml's GGML_MAX_NAME is 64 incl. NUL
constexpr uint32_t kMaxDims = 4;
// Decoded arrays cost up to 32x their encoded size (a 1-byte element becomes an int64 or
// an empty string becomes a std::string), so bound the element count per array and in
// total. Real vocabularies are < 300k entries.
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 22;
constexpr uint64_t kMaxTotalArrayElements = uint64_t{1} << 23;
// Containers grow as elements are actually parsed; up-front reservations stay small.
constexpr uint64_t kMaxReserve = 4096;
constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;
constexpr uint64_t kDefaultAlignment = 32;

// Smallest encodings, used to bound counts before allocating for them.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key len, 1-byte key, type, u8
constexpr uint64_t kMinTensorInfoBytes =
    8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, 1 dim, type, offset

// Debian's Abseil has its own string_view; convert at the public API boundary.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

// Name and encoded size (0 = variable) of each value type, indexed by its number.
struct ValueTypeInfo {
  const char* name;
  uint64_t size;
};
constexpr ValueTypeInfo kValueTypes[] = {
    {"uint8", 1},  {"int8", 1},    {"uint16", 2},  {"int16", 2},  {"uint32", 4},
    {"int32", 4},  {"float32", 4}, {"bool", 1},    {"string", 0}, {"array", 0},
    {"uint64", 8}, {"int64", 8},   {"float64", 8},
};
static_assert(std::size(kValueTypes) == static_cast<size_t>(GgufValueType::kFloat64) + 1);

// Only called with types that passed CheckValueType.
uint64_t ScalarSize(GgufValueType t) { return kValueTypes[static_cast<uint32_t>(t)].size; }
const char* ValueTypeName(GgufValueType t) {
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kValueTypes) ? kValueTypes[i].name : "unknown";
}

// Bounds-checked little-endian cursor over the file bytes. Every read either succeeds
// entirely or returns DataLoss naming what was being read and where.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n > remaining()) {
      return absl::DataLossError(absl::StrCat("GGUF truncated: '", what, "' needs ", n,
                                              " bytes at offset ", pos_, " but only ", remaining(),
                                              " remain"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    SPECNODE_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<absl::string_view> ReadString(absl::string_view what, uint64_t max_len) {
    const uint64_t at = pos_;
    SPECNODE_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > max_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF: ", what, " at offset ", at, " has length ", len, " (limit ", max_len, ")"));
    }
    SPECNODE_RETURN_IF_ERROR(Need(len, what));
    absl::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Reads one scalar of integer/bool type into an int64 (uint64 above INT64_MAX rejected).
absl::StatusOr<int64_t> ReadInteger(Cursor& c, GgufValueType t, absl::string_view key) {
  switch (t) {
    case GgufValueType::kUint8:
      return c.Read<uint8_t>(key);
    case GgufValueType::kInt8:
      return c.Read<int8_t>(key);
    case GgufValueType::kUint16:
      return c.Read<uint16_t>(key);
    case GgufValueType::kInt16:
      return c.Read<int16_t>(key);
    case GgufValueType::kUint32:
      return c.Read<uint32_t>(key);
    case GgufValueType::kInt32:
      return c.Read<int32_t>(key);
    case GgufValueType::kInt64:
      return c.Read<int64_t>(key);
    case GgufValueType::kUint64: {
      const uint64_t at = c.pos();
      SPECNODE_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>(key));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF: key '", key, "' holds uint64 ", v, " > INT64_MAX at offset ", at));
      }
      return static_cast<int64_t>(v);
    }
    case GgufValueType::kBool: {
      const uint64_t at = c.pos();
      SPECNODE_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(key));
      if (v > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF: key '", key, "' holds bool byte ", v, " (not 0/1) at offset ", at));
      }
      return static_cast<int64_t>(v);
    }
    default:
      break;
  }
  return absl::InternalError("ReadInteger on a non-integer type");
}

absl::StatusOr<double> ReadFloat(Cursor& c, GgufValueType t, absl::string_view key) {
  if (t == GgufValueType::kFloat32) {
    SPECNODE_ASSIGN_OR_RETURN(float v, c.Read<float>(key));
    return static_cast<double>(v);
  }
  return c.Read<double>(key);
}

absl::Status CheckValueType(uint32_t raw, uint64_t at, absl::string_view key) {
  if (raw > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF: key '", key, "' has unknown value type ", raw, " at offset ", at));
  }
  return absl::OkStatus();
}

// Parses the value of `key` whose type tag has been read. Arrays of arrays are rejected:
// the spec allows them but no model metadata uses them, and refusing keeps the decoded
// representation flat and allocation bounded.
absl::Status ReadValue(Cursor& c, GgufValueType type, absl::string_view key, GgufValue& out,
                       uint64_t& total_array_elements) {
  out.type = type;
  if (IsIntegerType(type) || type == GgufValueType::kBool) {
    SPECNODE_ASSIGN_OR_RETURN(out.i, ReadInteger(c, type, key));
    return absl::OkStatus();
  }
  if (IsFloatType(type)) {
    SPECNODE_ASSIGN_OR_RETURN(out.f, ReadFloat(c, type, key));
    return absl::OkStatus();
  }
  if (type == GgufValueType::kString) {
    SPECNODE_ASSIGN_OR_RETURN(absl::string_view s, c.ReadString(key, kNoLimit));
    out.str = std::string(s);
    return absl::OkStatus();
  }
  // Array.
  const uint64_t at = c.pos();
  SPECNODE_ASSIGN_OR_RETURN(uint32_t raw_elem, c.Read<uint32_t>(key));
  SPECNODE_RETURN_IF_ERROR(CheckValueType(raw_elem, at, key));
  const auto elem = static_cast<GgufValueType>(raw_elem);
  if (elem == GgufValueType::kArray) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF: key '", key, "' is an array of arrays (unsupported) at offset ", at));
  }
  out.elem_type = elem;
  const uint64_t count_at = c.pos();
  SPECNODE_ASSIGN_OR_RETURN(uint64_t count, c.Read<uint64_t>(key));
  const uint64_t min_elem = elem == GgufValueType::kString ? 8 : ScalarSize(elem);
  if (count > c.remaining() / min_elem) {
    return absl::DataLossError(absl::StrCat("GGUF: array '", key, "' at offset ", count_at,
                                            " claims ", count, " elements of ", ValueTypeName(elem),
                                            " but only ", c.remaining(), " bytes remain"));
  }
  if (count > kMaxArrayElements || total_array_elements + count > kMaxTotalArrayElements) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF: array '", key, "' at offset ", count_at,
                                                   " has ", count,
                                                   " elements, over this reader's limit"));
  }
  total_array_elements += count;
  if (elem == GgufValueType::kString) {
    out.strings.reserve(std::min(count, kMaxReserve));
    for (uint64_t i = 0; i < count; ++i) {
      SPECNODE_ASSIGN_OR_RETURN(absl::string_view s, c.ReadString(key, kNoLimit));
      out.strings.emplace_back(s);
    }
  } else if (IsFloatType(elem)) {
    out.floats.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      SPECNODE_ASSIGN_OR_RETURN(double v, ReadFloat(c, elem, key));
      out.floats.push_back(v);
    }
  } else {
    out.ints.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      SPECNODE_ASSIGN_OR_RETURN(int64_t v, ReadInteger(c, elem, key));
      out.ints.push_back(v);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // validated at parse: no overflow
  return n;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, size_);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open GGUF '", path, "': ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot stat GGUF '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("GGUF '", path, "' is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(
          absl::StrCat("cannot mmap GGUF '", path, "': ", std::strerror(err)));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  absl::Status s = file->Parse();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string_view bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = "<memory>";
  file->owned_ = std::string(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  SPECNODE_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_);
  SPECNODE_ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != 0x46554747u) {  // "GGUF" little endian
    return absl::InvalidArgumentError(
        absl::StrFormat("not a GGUF file: magic is 0x%08x at offset 0, want \"GGUF\"", magic));
  }
  SPECNODE_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GGUF version ", version_, " at offset 4 (want 2 or 3",
                     version_ > 0xffff ? "; big-endian files are not supported)" : ")"));
  }
  SPECNODE_ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  SPECNODE_ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // Both sections follow, so together they must fit in what remains.
  if (n_kv > c.remaining() / kMinKvBytes || n_tensors > c.remaining() / kMinTensorInfoBytes ||
      n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > c.remaining()) {
    return absl::DataLossError(absl::StrCat("GGUF: header claims ", n_tensors, " tensors and ",
                                            n_kv, " metadata entries but only ", c.remaining(),
                                            " bytes follow offset 24"));
  }

  uint64_t total_array_elements = 0;
  kv_.reserve(std::min(n_kv, kMaxReserve));
  key_order_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = c.pos();
    SPECNODE_ASSIGN_OR_RETURN(absl::string_view key, c.ReadString("metadata key", kMaxKeyLength));
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: empty metadata key at offset ", key_at));
    }
    const uint64_t type_at = c.pos();
    SPECNODE_ASSIGN_OR_RETURN(uint32_t raw_type, c.Read<uint32_t>(key));
    SPECNODE_RETURN_IF_ERROR(CheckValueType(raw_type, type_at, key));
    GgufValue value;
    SPECNODE_RETURN_IF_ERROR(
        ReadValue(c, static_cast<GgufValueType>(raw_type), key, value, total_array_elements));
    auto [it, inserted] = kv_.try_emplace(std::string(key), std::move(value));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: duplicate metadata key '", key, "' at offset ", key_at));
    }
    key_order_.push_back(it->first);
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* a = Find("general.alignment"); a != nullptr) {
    // The spec asks for a multiple of 8; we also need a power of two. Together with a
    // page- or heap-aligned base this keeps every tensor 8-byte aligned for the kernels.
    if (!IsIntegerType(a->type) || a->i < 8 || static_cast<uint64_t>(a->i) > kMaxAlignment ||
        !std::has_single_bit(static_cast<uint64_t>(a->i))) {
      return absl::InvalidArgumentError(
          "GGUF: general.alignment must be an integer power of two in [8, 2^30]");
    }
    alignment = static_cast<uint64_t>(a->i);
  }

  tensors_.reserve(std::min(n_tensors, kMaxReserve));
  tensor_index_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t info_at = c.pos();
    SPECNODE_ASSIGN_OR_RETURN(absl::string_view name,
                              c.ReadString("tensor name", kMaxTensorNameLength));
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: empty tensor name at offset ", info_at));
    }
    GgufTensorInfo t;
    t.name = std::string(name);
    SPECNODE_ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>(t.name));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF: tensor '", t.name, "' has ", n_dims,
                                                     " dims (want 1..4) at offset ", info_at));
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      SPECNODE_ASSIGN_OR_RETURN(uint64_t raw_dim, c.Read<uint64_t>(t.name));
      if (raw_dim == 0 || raw_dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF: tensor '", t.name, "' dim ", d,
                                                       " is ", static_cast<int64_t>(raw_dim),
                                                       " (must be > 0) at offset ", info_at));
      }
      const auto dim = static_cast<int64_t>(raw_dim);
      if (__builtin_mul_overflow(n_elements, dim, &n_elements)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GGUF: tensor '", t.name, "' element count overflows at offset ", info_at));
      }
      t.dims.push_back(dim);
    }
    const uint64_t type_at = c.pos();
    SPECNODE_ASSIGN_OR_RETURN(uint32_t raw_type, c.Read<uint32_t>(t.name));
    if (!IsSupportedGgmlType(raw_type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: tensor '", t.name, "' has unsupported type ", raw_type, " (",
                       Sv(GgmlTypeName(raw_type)), ") at offset ", type_at));
    }
    t.type = static_cast<GgmlType>(raw_type);
    const int block = GgmlBlockSize(t.type);
    if (t.dims[0] % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF: tensor '", t.name, "' dim 0 (", t.dims[0], ") is not a multiple of the ",
          Sv(GgmlTypeName(raw_type)), " block size ", block));
    }
    if (__builtin_mul_overflow(static_cast<uint64_t>(n_elements / block),
                               static_cast<uint64_t>(GgmlBlockBytes(t.type)), &t.n_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: tensor '", t.name, "' byte size overflows at offset ", info_at));
    }
    const uint64_t offset_at = c.pos();
    SPECNODE_ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>(t.name));  // relative for now
    if (t.offset % alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF: tensor '", t.name, "' data offset ",
                                                     t.offset, " is not aligned to ", alignment,
                                                     " (at offset ", offset_at, ")"));
    }
    if (tensor_index_.count(t.name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: duplicate tensor name '", t.name, "' at offset ", info_at));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensorInfo& t : tensors_) {
    uint64_t abs_offset = 0, end = 0;
    if (__builtin_add_overflow(data_start, t.offset, &abs_offset) ||
        __builtin_add_overflow(abs_offset, t.n_bytes, &end) || end > size_) {
      return absl::DataLossError(absl::StrCat("GGUF: tensor '", t.name, "' data [", t.offset, ", +",
                                              t.n_bytes, ") relative to data start ", data_start,
                                              " lies past the end of the file (", size_,
                                              " bytes)"));
    }
    t.offset = abs_offset;
  }
  // No two tensors may share bytes.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo* prev = by_offset[i - 1];
    if (prev->offset + prev->n_bytes > by_offset[i]->offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: tensor data overlaps: '", prev->name, "' [", prev->offset, ", ",
                       prev->offset + prev->n_bytes, ") and '", by_offset[i]->name, "' at ",
                       by_offset[i]->offset));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

absl::Status NotFound(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF metadata key '", key, "' not found"));
}

absl::Status Mismatch(absl::string_view key, const GgufValue& v, absl::string_view want) {
  std::string have = ValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) have = absl::StrCat("array of ", ValueTypeName(v.elem_type));
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata key '", key, "' is ", have, ", want ", want));
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (!IsIntegerType(v->type)) return Mismatch(Sv(key), *v, "an integer");
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (IsFloatType(v->type)) return v->f;
  if (IsIntegerType(v->type)) return static_cast<double>(v->i);
  return Mismatch(Sv(key), *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (v->type != GgufValueType::kBool) return Mismatch(Sv(key), *v, "a bool");
  return v->i != 0;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (v->type != GgufValueType::kString) return Mismatch(Sv(key), *v, "a string");
  return v->str;
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(
    std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return Mismatch(Sv(key), *v, "an array of string");
  }
  return &v->strings;
}

// Integer and bool arrays both live in `ints`.
absl::StatusOr<const std::vector<int64_t>*> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (v->type != GgufValueType::kArray ||
      !(IsIntegerType(v->elem_type) || v->elem_type == GgufValueType::kBool)) {
    return Mismatch(Sv(key), *v, "an array of integers");
  }
  return &v->ints;
}

absl::StatusOr<const std::vector<double>*> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound(Sv(key));
  if (v->type != GgufValueType::kArray || !IsFloatType(v->elem_type)) {
    return Mismatch(Sv(key), *v, "an array of floats");
  }
  return &v->floats;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace specnode
