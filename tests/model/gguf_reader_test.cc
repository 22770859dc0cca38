#include "model/gguf/gguf_reader.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_writer.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;

// ---- A valid file from the writer, used by the round trip and truncation tests.

std::vector<float> Ramp(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 101 - 50);
  return v;
}

std::string SmallValidFile(uint32_t alignment = 32) {
  GgufWriter w(alignment);
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", 2);
  w.AddInt32("test.negative", -5);
  w.AddUint64("test.big", uint64_t{1} << 40);
  w.AddFloat32("test.eps", 1e-5f);
  w.AddBool("test.flag", true);
  w.AddStringArray("test.tokens", {"a", "", "Ġthe", "<|im_end|>"});
  w.AddInt32Array("test.types", {1, 1, 3, -2});
  w.AddFloat32Array("test.floats", {0.5f, -1.25f});
  EXPECT_TRUE(w.AddTensorF32("norm.weight", GgmlType::kF32, {8}, Ramp(8, 0.1f)).ok());
  EXPECT_TRUE(w.AddTensorF32("q8.weight", GgmlType::kQ8_0, {64, 3}, Ramp(192, 0.01f)).ok());
  EXPECT_TRUE(w.AddTensorF32("q41.weight", GgmlType::kQ4_1, {32, 2, 2}, Ramp(128, 0.02f)).ok());
  EXPECT_TRUE(w.AddTensorF32("h.weight", GgmlType::kF16, {2, 3}, Ramp(6, 1.0f)).ok());
  return w.Serialize();
}

TEST(GgufRoundTripTest, MetadataAndTensorsSurvive) {
  const std::string bytes = SmallValidFile();
  auto file_or = GgufFile::FromBytes(bytes);
  ASSERT_TRUE(file_or.ok()) << file_or.status();
  const GgufFile& f = **file_or;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.keys().size(), 9u);
  EXPECT_EQ(f.keys()[0], "general.architecture");
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.block_count"), 2);
  EXPECT_EQ(*f.GetInt("test.negative"), -5);
  EXPECT_EQ(*f.GetInt("test.big"), int64_t{1} << 40);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("test.eps")), 1e-5f);
  EXPECT_EQ(*f.GetFloat("llama.block_count"), 2.0);  // ints read as floats
  EXPECT_TRUE(*f.GetBool("test.flag"));
  EXPECT_THAT(**f.GetStringArray("test.tokens"),
              ::testing::ElementsAre("a", "", "Ġthe", "<|im_end|>"));
  EXPECT_THAT(**f.GetIntArray("test.types"), ::testing::ElementsAre(1, 1, 3, -2));
  EXPECT_THAT(**f.GetFloatArray("test.floats"), ::testing::ElementsAre(0.5, -1.25));
  ASSERT_NE(f.Find("test.types"), nullptr);
  EXPECT_EQ(f.Find("test.types")->elem_type, GgufValueType::kInt32);
  EXPECT_EQ(f.Find("nope"), nullptr);

  ASSERT_EQ(f.tensors().size(), 4u);
  const GgufTensorInfo* q41 = f.FindTensor("q41.weight");
  ASSERT_NE(q41, nullptr);
  EXPECT_EQ(q41->type, GgmlType::kQ4_1);
  EXPECT_THAT(q41->dims, ::testing::ElementsAre(32, 2, 2));
  EXPECT_EQ(q41->n_elements(), 128);
  EXPECT_EQ(q41->n_bytes, 4u * 20u);
  EXPECT_EQ(f.FindTensor("missing"), nullptr);
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_LE(t.offset + t.n_bytes, f.file_size()) << t.name;
  }
  // Data decodes back to what was written (F32 exactly; Q8_0 within its step).
  const GgufTensorInfo* norm = f.FindTensor("norm.weight");
  std::vector<float> got(8);
  DequantizeRow(norm->type, f.TensorData(*norm), got.data(), 8);
  EXPECT_EQ(got, Ramp(8, 0.1f));
  const GgufTensorInfo* q8 = f.FindTensor("q8.weight");
  std::vector<float> row(64);
  DequantizeRow(q8->type, f.TensorData(*q8) + GgmlRowBytes(q8->type, 64), row.data(), 64);
  const std::vector<float> want = Ramp(192, 0.01f);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(row[i], want[64 + i], 0.5 * 0.5 / 127 + 1e-3) << i;
}

TEST(GgufRoundTripTest, TypedGetterErrors) {
  auto f = GgufFile::FromBytes(SmallValidFile());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetInt("absent").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*f)->GetString("absent").status().code(), absl::StatusCode::kNotFound);
  auto s = (*f)->GetInt("general.architecture").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("general.architecture"));
  EXPECT_EQ((*f)->GetInt("test.eps").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetInt("test.flag").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetBool("llama.block_count").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetFloat("general.architecture").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetStringArray("test.types").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetIntArray("test.tokens").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetFloatArray("test.types").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetString("test.tokens").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufRoundTripTest, CustomAlignment) {
  auto f = GgufFile::FromBytes(SmallValidFile(64));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetInt("general.alignment"), 64);
  for (const GgufTensorInfo& t : (*f)->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
}

TEST(GgufRoundTripTest, OpenFromDisk) {
  const std::string path = ::testing::TempDir() + "/gguf_reader_test_open.gguf";
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  ASSERT_TRUE(w.AddTensorF32("t", GgmlType::kBF16, {4}, {1, 2, 3, 4}).ok());
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), w.Serialize().size());
  const GgufTensorInfo* t = (*f)->FindTensor("t");
  ASSERT_NE(t, nullptr);
  float v[4];
  DequantizeRow(t->type, (*f)->TensorData(*t), v, 4);
  EXPECT_EQ(v[3], 4.0f);
  std::remove(path.c_str());
}

TEST(GgufOpenTest, MissingPathIsNotFound) {
  auto f = GgufFile::Open("/nonexistent/dir/model.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
}

TEST(GgufOpenTest, DirectoryIsRejected) {
  auto f = GgufFile::Open(::testing::TempDir());
  EXPECT_FALSE(f.ok());
}

TEST(GgufOpenTest, EmptyAndGarbageFilesAreRejected) {
  const std::string path = ::testing::TempDir() + "/gguf_reader_test_empty.gguf";
  { std::ofstream out(path, std::ios::binary); }
  auto f = GgufFile::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
  {
    std::ofstream out(path, std::ios::binary);
    out << "this is not a model file at all, just text";
  }
  f = GgufFile::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  std::remove(path.c_str());
}

// Every proper prefix that cuts into the header or any tensor's data must be rejected
// (and must not crash or read out of bounds: run under ASan to check the latter).
TEST(GgufBadInputTest, TruncatedAtEveryOffset) {
  const std::string bytes = SmallValidFile();
  auto full = GgufFile::FromBytes(bytes);
  ASSERT_TRUE(full.ok());
  uint64_t data_end = 0;
  for (const GgufTensorInfo& t : (*full)->tensors()) {
    data_end = std::max(data_end, t.offset + t.n_bytes);
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = GgufFile::FromBytes(std::string_view(bytes).substr(0, n));
    if (n < data_end) {
      ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes accepted";
    } else {
      ASSERT_TRUE(f.ok()) << "only the final padding was cut, n=" << n << ": " << f.status();
    }
  }
}

// ---- Hand-built files for the hostile cases.

class Raw {
 public:
  Raw& U8(uint8_t v) { return Put(v); }
  Raw& U32(uint32_t v) { return Put(v); }
  Raw& U64(uint64_t v) { return Put(v); }
  Raw& Str(std::string_view s) {
    U64(s.size());
    b_.append(s);
    return *this;
  }
  Raw& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b_.append("GGUF");
    return U32(version).U64(n_tensors).U64(n_kv);
  }
  Raw& KvU32(std::string_view key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Raw& Tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  // Pads to 32 and appends `n` data bytes.
  Raw& Data(size_t n) {
    b_.resize((b_.size() + 31) / 32 * 32, '\0');
    b_.append(n, '\x11');
    return *this;
  }
  const std::string& bytes() const { return b_; }

 private:
  template <typename T>
  Raw& Put(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    b_.append(buf, sizeof(T));
    return *this;
  }
  std::string b_;
};

absl::Status Parse(const Raw& r) { return GgufFile::FromBytes(r.bytes()).status(); }

MATCHER_P2(IsError, code, substr, "") {
  if (arg.code() != code) {
    *result_listener << "status " << arg;
    return false;
  }
  if (std::string(arg.message()).find(substr) == std::string::npos) {
    *result_listener << "message lacks '" << substr << "': " << arg;
    return false;
  }
  return true;
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

TEST(GgufBadInputTest, MinimalEmptyFileIsValid) {
  EXPECT_TRUE(Parse(Raw().Header(0, 0)).ok());
  EXPECT_TRUE(Parse(Raw().Header(0, 1).KvU32("a", 1)).ok());
  EXPECT_TRUE(Parse(Raw().Header(0, 0, 2)).ok());  // version 2 has the same layout
}

TEST(GgufBadInputTest, BadMagicAndVersion) {
  std::string bytes = Raw().Header(0, 0).bytes();
  bytes[3] = 'X';
  EXPECT_THAT(GgufFile::FromBytes(bytes).status(), IsError(kInvalid, "magic"));
  EXPECT_THAT(Parse(Raw().Header(0, 0, 1)), IsError(kInvalid, "version 1"));
  EXPECT_THAT(Parse(Raw().Header(0, 0, 4)), IsError(kInvalid, "version 4"));
  EXPECT_THAT(Parse(Raw().Header(0, 0, 0x03000000)), IsError(kInvalid, "big-endian"));
  EXPECT_THAT(GgufFile::FromBytes("GGU").status(), IsError(kDataLoss, "magic"));
  EXPECT_THAT(GgufFile::FromBytes("").status(), IsError(kDataLoss, "truncated"));
}

TEST(GgufBadInputTest, AbsurdCounts) {
  EXPECT_THAT(Parse(Raw().Header(uint64_t{1} << 62, 0)), IsError(kDataLoss, "tensors"));
  EXPECT_THAT(Parse(Raw().Header(0, ~uint64_t{0})), IsError(kDataLoss, "metadata"));
  EXPECT_THAT(Parse(Raw().Header(~uint64_t{0}, ~uint64_t{0})), IsError(kDataLoss, "bytes"));
  // Plausible counts that the remaining bytes cannot hold.
  EXPECT_THAT(Parse(Raw().Header(0, 2).KvU32("a", 1)), IsError(kDataLoss, "metadata"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("a").U32(9).U32(4).U64(uint64_t{1} << 40)),
              IsError(kDataLoss, "claims"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("a").U32(9).U32(8).U64(3).Str("x")),
              IsError(kDataLoss, "claims"));
}

TEST(GgufBadInputTest, StringLengthsPastEof) {
  EXPECT_THAT(Parse(Raw().Header(0, 1).U64(1000).U32(0).U32(0)), IsError(kDataLoss, "key"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(8).U64(~uint64_t{0}).U64(0)),
              IsError(kDataLoss, "'k'"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(9).U32(8).U64(1).U64(1 << 20).U64(0)),
              IsError(kDataLoss, "'k'"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).U64(70000).U32(0).U32(0)),
              IsError(kInvalid, "length 70000"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("").U32(4).U32(1)), IsError(kInvalid, "empty"));
}

TEST(GgufBadInputTest, UnknownAndInvalidValues) {
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(13).U64(0)),
              IsError(kInvalid, "unknown value type 13"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(0xffffffffu).U64(0)),
              IsError(kInvalid, "unknown value type"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(9).U32(77).U64(0)),
              IsError(kInvalid, "unknown value type 77"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(9).U32(9).U64(1).U32(4).U64(0)),
              IsError(kInvalid, "array of arrays"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(7).U8(2).U32(0).U32(0)),
              IsError(kInvalid, "bool"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("k").U32(10).U64(~uint64_t{0}).U64(0)),
              IsError(kInvalid, "INT64_MAX"));
}

TEST(GgufBadInputTest, DuplicateKey) {
  EXPECT_THAT(Parse(Raw().Header(0, 2).KvU32("a.b", 1).KvU32("a.b", 2)),
              IsError(kInvalid, "duplicate metadata key 'a.b'"));
}

TEST(GgufBadInputTest, BadAlignmentKey) {
  EXPECT_THAT(Parse(Raw().Header(0, 1).KvU32("general.alignment", 3)),
              IsError(kInvalid, "alignment"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).KvU32("general.alignment", 0)),
              IsError(kInvalid, "alignment"));
  EXPECT_THAT(Parse(Raw().Header(0, 1).KvU32("general.alignment", 1)),
              IsError(kInvalid, "alignment"));  // spec: multiple of 8
  EXPECT_TRUE(Parse(Raw().Header(0, 1).KvU32("general.alignment", 8)).ok());
  EXPECT_THAT(Parse(Raw().Header(0, 1).Str("general.alignment").U32(8).Str("32").U64(0)),
              IsError(kInvalid, "alignment"));
}

Raw OneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
  Raw r;
  r.Header(1, 0).Tensor("blk.0.w", std::move(dims), type, offset).Data(data);
  return r;
}

TEST(GgufBadInputTest, ValidSingleTensor) {
  EXPECT_TRUE(Parse(OneTensor({32, 2}, 8, 0, 68)).ok());
  EXPECT_TRUE(Parse(OneTensor({3}, 0, 0, 12)).ok());
}

TEST(GgufBadInputTest, UnknownTensorType) {
  auto s = Parse(OneTensor({256}, 11, 0, 256));
  EXPECT_THAT(s, IsError(kInvalid, "type 11 (Q3_K)"));
  EXPECT_THAT(s, IsError(kInvalid, "blk.0.w"));
  EXPECT_THAT(Parse(OneTensor({4}, 77, 0, 64)), IsError(kInvalid, "type 77"));
}

TEST(GgufBadInputTest, BadDims) {
  EXPECT_THAT(Parse(OneTensor({0}, 0, 0, 32)), IsError(kInvalid, "must be > 0"));
  EXPECT_THAT(Parse(OneTensor({4, 0}, 0, 0, 32)), IsError(kInvalid, "dim 1"));
  EXPECT_THAT(Parse(OneTensor({~uint64_t{0}}, 0, 0, 32)), IsError(kInvalid, "is -1"));
  EXPECT_THAT(Parse(OneTensor({uint64_t{1} << 63}, 0, 0, 32)), IsError(kInvalid, "> 0"));
  EXPECT_THAT(Parse(OneTensor({}, 0, 0, 32)), IsError(kInvalid, "0 dims"));
  EXPECT_THAT(Parse(OneTensor({1, 1, 1, 1, 1}, 0, 0, 32)), IsError(kInvalid, "5 dims"));
  EXPECT_THAT(Parse(OneTensor({uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0, 32)),
              IsError(kInvalid, "overflow"));
  EXPECT_THAT(Parse(OneTensor({uint64_t{1} << 62}, 0, 0, 32)), IsError(kInvalid, "overflow"));
  EXPECT_THAT(Parse(OneTensor({33}, 8, 0, 64)), IsError(kInvalid, "block size"));
  EXPECT_THAT(Parse(OneTensor({uint64_t{1} << 40}, 0, 0, 32)), IsError(kDataLoss, "past"));
}

TEST(GgufBadInputTest, BadOffsets) {
  EXPECT_THAT(Parse(OneTensor({4}, 0, 4, 64)), IsError(kInvalid, "not aligned"));
  EXPECT_THAT(Parse(OneTensor({4}, 0, 32, 32)), IsError(kDataLoss, "past the end"));
  EXPECT_THAT(Parse(OneTensor({4}, 0, 0, 15)), IsError(kDataLoss, "past the end"));
  EXPECT_THAT(Parse(OneTensor({4}, 0, ~uint64_t{31}, 64)), IsError(kDataLoss, "past the end"));
}

TEST(GgufBadInputTest, TensorNames) {
  Raw dup;
  dup.Header(2, 0).Tensor("w", {8}, 0, 0).Tensor("w", {8}, 0, 32).Data(64);
  EXPECT_THAT(Parse(dup), IsError(kInvalid, "duplicate tensor name 'w'"));
  Raw empty;
  empty.Header(1, 0).Tensor("", {8}, 0, 0).Data(32);
  EXPECT_THAT(Parse(empty), IsError(kInvalid, "empty tensor name"));
  Raw long_name;
  long_name.Header(1, 0).Tensor(std::string(64, 'x'), {8}, 0, 0).Data(32);
  EXPECT_THAT(Parse(long_name), IsError(kInvalid, "length 64"));
}

TEST(GgufBadInputTest, OverlappingTensorData) {
  Raw r;
  r.Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {8}, 0, 32).Data(64);
  EXPECT_THAT(Parse(r), IsError(kInvalid, "overlap"));
  Raw same;
  same.Header(2, 0).Tensor("a", {8}, 0, 0).Tensor("b", {8}, 0, 0).Data(64);
  EXPECT_THAT(Parse(same), IsError(kInvalid, "overlap"));
  Raw ok;
  ok.Header(2, 0).Tensor("a", {8}, 0, 32).Tensor("b", {8}, 0, 0).Data(64);
  EXPECT_TRUE(Parse(ok).ok());
}

// Flipping any single byte of a valid file must give OK or an error, never a crash.
TEST(GgufBadInputTest, SingleByteCorruptionNeverCrashes) {
  const std::string bytes = SmallValidFile();
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}}) {
      std::string copy = bytes;
      copy[i] = static_cast<char>(v);
      auto f = GgufFile::FromBytes(copy);
      if (f.ok()) {
        for (const GgufTensorInfo& t : (*f)->tensors()) {
          ASSERT_LE(t.offset + t.n_bytes, copy.size());
        }
      }
    }
  }
}

// ---- The real model, when available.

TEST(GgufRealModelTest, SmolLm2Q4_1) {
  const char* path = std::getenv("SPECNODE_MODEL");
  if (path == nullptr || *path == '\0') {
    const char* req = std::getenv("SPECNODE_REQUIRE_MODEL");
    if (req != nullptr && std::string(req) == "1") {
      FAIL() << "SPECNODE_REQUIRE_MODEL=1 but SPECNODE_MODEL is not set";
    }
    GTEST_SKIP() << "SPECNODE_MODEL is not set (point it at SmolLM2-135M-Instruct.Q4_1.gguf)";
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ((*f)->tensors().size(), 272u);
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 30);
  int n_q41 = 0, n_q80 = 0, n_f32 = 0;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    switch (t.type) {
      case GgmlType::kQ4_1:
        ++n_q41;
        break;
      case GgmlType::kQ8_0:
        ++n_q80;
        break;
      case GgmlType::kF32:
        ++n_f32;
        break;
      default:
        ADD_FAILURE() << t.name << " has type " << GgmlTypeName(static_cast<uint32_t>(t.type));
    }
  }
  EXPECT_GT(n_q41, 0);
  EXPECT_GT(n_q80, 0);
  EXPECT_GT(n_f32, 0);
  auto tokens = (*f)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ((*tokens)->size(), 49152u);
  const GgufTensorInfo* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_THAT(emb->dims, ::testing::ElementsAre(576, 49152));
  // The first row decodes to finite values.
  std::vector<float> row(576);
  DequantizeRow(emb->type, (*f)->TensorData(*emb), row.data(), 576);
  for (float v : row) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace specnode
