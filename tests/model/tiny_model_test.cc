#include "model/llama/tiny_model.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_reader.h"

namespace specnode {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/tiny_model_test_" + name + ".gguf";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<GgufFile> WriteAndOpen(const TinyModelOptions& o, const std::string& name) {
  const std::string path = TempPath(name);
  absl::Status s = WriteTinyModel(o, path);
  EXPECT_TRUE(s.ok()) << s;
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  std::remove(path.c_str());
  return f.ok() ? std::move(*f) : nullptr;
}

std::vector<float> Decode(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(t->n_elements()));
  const int64_t cols = t->dims[0];
  const size_t row_bytes = GgmlRowBytes(t->type, cols);
  for (int64_t r = 0; r < t->n_elements() / cols; ++r) {
    DequantizeRow(t->type, f.TensorData(*t) + r * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}

double StdDev(const std::vector<float>& v) {
  double s = 0, ss = 0;
  for (float x : v) s += x;
  const double mean = s / v.size();
  for (float x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / v.size());
}

TEST(TinyModelTest, SameOptionsGiveIdenticalBytes) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_1}) {
    TinyModelOptions o;
    o.weight_type = type;
    o.perturb = 0.05f;
    ASSERT_TRUE(WriteTinyModel(o, TempPath("det_a")).ok());
    ASSERT_TRUE(WriteTinyModel(o, TempPath("det_b")).ok());
    const std::string a = ReadAll(TempPath("det_a")), b = ReadAll(TempPath("det_b"));
    EXPECT_GT(a.size(), 10000u);
    EXPECT_TRUE(a == b) << "files differ for type " << static_cast<int>(type);
    o.seed = 2;
    ASSERT_TRUE(WriteTinyModel(o, TempPath("det_b")).ok());
    EXPECT_FALSE(a == ReadAll(TempPath("det_b"))) << "seed has no effect";
  }
  std::remove(TempPath("det_a").c_str());
  std::remove(TempPath("det_b").c_str());
}

// Tensors large enough to split into several chunks (token_embd: 512 x 1259 values) give
// the same bytes on 3 threads as on 1 (one thread is the sequential writer).
TEST(TinyModelTest, ThreadsDoNotChangeTheBytes) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_1}) {
    TinyModelOptions o;
    o.weight_type = type;
    o.d_model = 512;
    o.n_heads = 8;
    o.d_ff = 1024;
    o.n_merges = 1000;
    o.perturb = 0.05f;
    o.threads = 1;
    ASSERT_TRUE(WriteTinyModel(o, TempPath("thr_a")).ok());
    o.threads = 3;
    ASSERT_TRUE(WriteTinyModel(o, TempPath("thr_b")).ok());
    const std::string a = ReadAll(TempPath("thr_a")), b = ReadAll(TempPath("thr_b"));
    EXPECT_GT(a.size(), 500000u);
    EXPECT_TRUE(a == b) << "1 and 3 threads differ for type " << static_cast<int>(type);
  }
  std::remove(TempPath("thr_a").c_str());
  std::remove(TempPath("thr_b").c_str());
}

TEST(TinyModelTest, MetadataDescribesACompleteLlama) {
  TinyModelOptions o;
  auto f = WriteAndOpen(o, "meta");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetInt("llama.block_count"), o.n_layers);
  EXPECT_EQ(*f->GetInt("llama.context_length"), o.context_length);
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), o.d_model);
  EXPECT_EQ(*f->GetInt("llama.feed_forward_length"), o.d_ff);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), o.n_heads);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), o.n_kv_heads);
  EXPECT_EQ(*f->GetInt("llama.rope.dimension_count"), o.d_model / o.n_heads);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->GetFloat("llama.rope.freq_base")), o.rope_base);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->GetFloat("llama.attention.layer_norm_rms_epsilon")),
                  o.rms_eps);
  EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_FALSE(*f->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_THAT(*f->GetString("tokenizer.chat_template"),
              ::testing::StartsWith("{% for message in messages %}"));
  EXPECT_THAT(*f->GetString("tokenizer.chat_template"),
              ::testing::HasSubstr("'<|im_start|>assistant\n'"));

  const int vocab = 256 + o.n_merges + 3;
  EXPECT_EQ(*f->GetInt("llama.vocab_size"), vocab);
  const std::vector<std::string>& tokens = **f->GetStringArray("tokenizer.ggml.tokens");
  const std::vector<int64_t>& types = **f->GetIntArray("tokenizer.ggml.token_type");
  const std::vector<std::string>& merges = **f->GetStringArray("tokenizer.ggml.merges");
  ASSERT_EQ(tokens.size(), static_cast<size_t>(vocab));
  ASSERT_EQ(types.size(), static_cast<size_t>(vocab));
  ASSERT_EQ(merges.size(), static_cast<size_t>(o.n_merges));
  // GPT-2 byte alphabet: printable bytes as themselves, space -> U+0120, 0 -> U+0100.
  EXPECT_EQ(tokens['a'], "a");
  EXPECT_EQ(tokens['!'], "!");
  EXPECT_EQ(tokens[' '], "\xc4\xa0");
  EXPECT_EQ(tokens[0], "\xc4\x80");
  EXPECT_EQ(tokens['\n'], "\xc4\x8a");
  EXPECT_EQ(tokens[0xad], "\xc5\x83");  // soft hyphen is remapped (U+0143)
  EXPECT_EQ(tokens[vocab - 3], "<|endoftext|>");
  EXPECT_EQ(tokens[vocab - 2], "<|im_start|>");
  EXPECT_EQ(tokens[vocab - 1], "<|im_end|>");
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.bos_token_id"), vocab - 2);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), vocab - 1);
  for (int i = 0; i < vocab; ++i) EXPECT_EQ(types[i], i >= vocab - 3 ? 3 : 1) << i;
  EXPECT_THAT(std::vector<std::string>(merges.begin(), merges.begin() + 3),
              ::testing::ElementsAre("h e", "\xc4\xa0 t", "\xc4\xa0t he"));
}

// Every merge joins two existing tokens into a token; tokens are unique.
void ExpectValidBpe(const GgufFile& f) {
  const std::vector<std::string>& tokens = **f.GetStringArray("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = **f.GetStringArray("tokenizer.ggml.merges");
  const std::set<std::string> vocab(tokens.begin(), tokens.end());
  EXPECT_EQ(vocab.size(), tokens.size()) << "duplicate tokens";
  std::set<std::string> earlier(tokens.begin(), tokens.begin() + 256);
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ');
    ASSERT_NE(sp, std::string::npos) << merges[i];
    const std::string a = merges[i].substr(0, sp), b = merges[i].substr(sp + 1);
    EXPECT_TRUE(earlier.count(a) && earlier.count(b))
        << "merge " << i << " '" << merges[i] << "' uses a later token";
    EXPECT_EQ(tokens[256 + i], a + b) << i;
    earlier.insert(a + b);
  }
}

TEST(TinyModelTest, MergesAreValidBpeForManySizes) {
  for (int n : {0, 1, 64, 3000}) {
    TinyModelOptions o;
    o.n_merges = n;
    o.d_model = 32;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.d_ff = 32;
    o.n_layers = 1;
    auto f = WriteAndOpen(o, "merges");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ((**f->GetStringArray("tokenizer.ggml.merges")).size(), static_cast<size_t>(n));
    ExpectValidBpe(*f);
  }
}

TEST(TinyModelTest, TensorsHaveLlamaNamesShapesAndTypes) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (bool tied : {true, false}) {
      TinyModelOptions o;
      o.weight_type = type;
      o.tied_embeddings = tied;
      o.n_layers = 3;
      o.d_model = 96;
      o.n_heads = 6;
      o.n_kv_heads = 2;
      o.d_ff = 160;
      auto f = WriteAndOpen(o, "shapes");
      ASSERT_NE(f, nullptr);
      const int64_t vocab = 256 + o.n_merges + 3, hd = 16;
      EXPECT_EQ(f->tensors().size(), static_cast<size_t>(2 + 9 * o.n_layers + (tied ? 0 : 1)));
      auto expect = [&](const std::string& name, std::vector<int64_t> dims, GgmlType t) {
        const GgufTensorInfo* info = f->FindTensor(name);
        ASSERT_NE(info, nullptr) << name;
        EXPECT_EQ(info->dims, dims) << name;
        EXPECT_EQ(info->type, t) << name;
      };
      expect("token_embd.weight", {96, vocab}, type);
      expect("output_norm.weight", {96}, GgmlType::kF32);
      if (tied) {
        EXPECT_EQ(f->FindTensor("output.weight"), nullptr);
      } else {
        expect("output.weight", {96, vocab}, type);
      }
      for (int l = 0; l < o.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        expect(p + "attn_norm.weight", {96}, GgmlType::kF32);
        expect(p + "attn_q.weight", {96, 6 * hd}, type);
        expect(p + "attn_k.weight", {96, 2 * hd}, type);
        expect(p + "attn_v.weight", {96, 2 * hd}, type);
        expect(p + "attn_output.weight", {6 * hd, 96}, type);
        expect(p + "ffn_norm.weight", {96}, GgmlType::kF32);
        expect(p + "ffn_gate.weight", {96, 160}, type);
        expect(p + "ffn_up.weight", {96, 160}, type);
        expect(p + "ffn_down.weight", {160, 96}, type);
      }
      // Weight scales: projections ~ 1/sqrt(fan_in), norms ~ 1.
      const std::vector<float> q = Decode(*f, "blk.0.attn_q.weight");
      EXPECT_NEAR(StdDev(q), 1.0 / std::sqrt(96.0), 0.2 / std::sqrt(96.0));
      const std::vector<float> norm = Decode(*f, "blk.1.ffn_norm.weight");
      double mean = 0;
      for (float v : norm) mean += v / norm.size();
      EXPECT_NEAR(mean, 1.0, 0.05);
    }
  }
}

TEST(TinyModelTest, PerturbAddsNoiseOfTheRequestedRelativeSize) {
  TinyModelOptions base;
  base.d_model = 128;
  base.d_ff = 256;
  auto target = WriteAndOpen(base, "target");
  ASSERT_NE(target, nullptr);
  for (float eps : {0.01f, 0.1f, 0.5f}) {
    TinyModelOptions o = base;
    o.perturb = eps;
    auto draft = WriteAndOpen(o, "draft");
    ASSERT_NE(draft, nullptr);
    for (const GgufTensorInfo& t : target->tensors()) {
      const std::vector<float> a = Decode(*target, t.name), b = Decode(*draft, t.name);
      std::vector<float> diff(a.size());
      for (size_t i = 0; i < a.size(); ++i) diff[i] = b[i] - a[i];
      const double ratio = StdDev(diff) / StdDev(a);
      // Norm tensors have only 128 values; allow more sampling slack there.
      const double tol = a.size() < 1000 ? 0.25 : 0.08;
      EXPECT_NEAR(ratio, eps, tol * eps) << t.name << " eps " << eps;
    }
  }
  // perturb = 0 ignores perturb_seed: the draft is the target.
  TinyModelOptions same = base;
  same.perturb_seed = 99;
  ASSERT_TRUE(WriteTinyModel(base, TempPath("p0a")).ok());
  ASSERT_TRUE(WriteTinyModel(same, TempPath("p0b")).ok());
  EXPECT_TRUE(ReadAll(TempPath("p0a")) == ReadAll(TempPath("p0b")));
  // A different perturb_seed gives a different draft.
  TinyModelOptions d1 = base, d2 = base;
  d1.perturb = d2.perturb = 0.1f;
  d2.perturb_seed = d1.perturb_seed + 1;
  ASSERT_TRUE(WriteTinyModel(d1, TempPath("p0a")).ok());
  ASSERT_TRUE(WriteTinyModel(d2, TempPath("p0b")).ok());
  EXPECT_FALSE(ReadAll(TempPath("p0a")) == ReadAll(TempPath("p0b")));
  std::remove(TempPath("p0a").c_str());
  std::remove(TempPath("p0b").c_str());
}

TEST(TinyModelTest, BadOptionsAreRejected) {
  const std::string path = TempPath("bad");
  auto rejected = [&](auto mutate, const char* what) {
    TinyModelOptions o;
    mutate(o);
    absl::Status s = WriteTinyModel(o, path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
  };
  rejected([](TinyModelOptions& o) { o.n_layers = 0; }, "zero layers");
  rejected([](TinyModelOptions& o) { o.threads = -1; }, "negative threads");
  rejected([](TinyModelOptions& o) { o.d_model = 48; }, "d_model not multiple of 32");
  rejected([](TinyModelOptions& o) { o.d_model = 0; }, "zero d_model");
  rejected([](TinyModelOptions& o) { o.n_heads = 3; }, "n_heads does not divide d_model");
  rejected([](TinyModelOptions& o) { o.n_heads = 0; }, "zero heads");
  rejected([](TinyModelOptions& o) { o.n_heads = 64; }, "odd head_dim");  // 64/64 = 1
  rejected([](TinyModelOptions& o) { o.n_kv_heads = 3; }, "kv heads do not divide heads");
  rejected([](TinyModelOptions& o) { o.n_kv_heads = 0; }, "zero kv heads");
  rejected([](TinyModelOptions& o) { o.n_kv_heads = 8; }, "more kv heads than heads");
  rejected([](TinyModelOptions& o) { o.d_ff = 100; }, "d_ff not multiple of 32");
  rejected([](TinyModelOptions& o) { o.n_merges = -1; }, "negative merges");
  rejected([](TinyModelOptions& o) { o.context_length = 0; }, "zero context");
  rejected([](TinyModelOptions& o) { o.rope_base = 0.0f; }, "zero rope base");
  rejected([](TinyModelOptions& o) { o.rms_eps = 0.0f; }, "zero eps");
  rejected([](TinyModelOptions& o) { o.rms_eps = std::nanf(""); }, "nan eps");
  rejected([](TinyModelOptions& o) { o.perturb = -0.1f; }, "negative perturb");
  rejected([](TinyModelOptions& o) { o.perturb = INFINITY; }, "infinite perturb");
  rejected([](TinyModelOptions& o) { o.weight_type = static_cast<GgmlType>(10); }, "Q2_K");
  rejected(
      [](TinyModelOptions& o) {
        o.d_model = 16384;
        o.n_layers = 256;
      },
      "too large");
  rejected([](TinyModelOptions& o) { o.arch = "mamba"; }, "unknown arch");
  rejected([](TinyModelOptions& o) { o.sliding_window = -1; }, "negative window");
  // I/O failure is an error, not a crash.
  EXPECT_FALSE(WriteTinyModel(TinyModelOptions{}, "/nonexistent/dir/x.gguf").ok());
}

// The real-shape benchmark models: Llama-3-8B's and a Llama-3-70B layer's hyper-parameters
// (bench/bench_shapes.py writes and measures them; too large to write in a unit test).
TEST(TinyModel, RealShapesHaveTheirModelsHyperParameters) {
  TinyModelOptions o;
  ASSERT_TRUE(ApplyTinyModelShape("llama3-8b", &o).ok());
  EXPECT_EQ(o.arch, "llama");
  EXPECT_EQ(o.n_layers, 32);
  EXPECT_EQ(o.d_model, 4096);
  EXPECT_EQ(o.n_heads, 32);
  EXPECT_EQ(o.n_kv_heads, 8);
  EXPECT_EQ(o.d_ff, 14336);
  EXPECT_EQ(256 + o.n_merges + 3, 128256);  // Llama 3's vocabulary
  EXPECT_FALSE(o.tied_embeddings);
  EXPECT_EQ(o.weight_type, GgmlType::kQ4_0);
  TinyModelOptions l;
  ASSERT_TRUE(ApplyTinyModelShape("llama3-70b-layer", &l).ok());
  EXPECT_EQ(l.n_layers, 1);
  EXPECT_EQ(l.d_model, 8192);
  EXPECT_EQ(l.n_heads, 64);
  EXPECT_EQ(l.d_ff, 28672);
  const absl::Status bad = ApplyTinyModelShape("llama3-405b", &l);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("llama3-8b"), std::string::npos) << bad;
}

}  // namespace
}  // namespace specnode
