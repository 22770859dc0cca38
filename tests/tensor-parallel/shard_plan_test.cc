// ShardPlan: valid splits and the errors for sizes a model cannot take.
#include "tensor-parallel/shard_plan.h"

#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf/gguf_reader.h"
#include "model/llama/tiny_model.h"

namespace specnode {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LlamaConfig SmolLm2Like() {
  LlamaConfig c;
  c.architecture = "llama";
  c.name = "SmolLM2 135M Instruct";
  c.n_layers = 30;
  c.d_model = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.rope_dim = 64;
  c.d_ff = 1536;
  c.vocab_size = 49152;
  c.context_length = 8192;
  return c;
}

LlamaConfig Tiny(int d_model, int heads, int kv_heads, int d_ff) {
  LlamaConfig c;
  c.architecture = "llama";
  c.n_layers = 2;
  c.d_model = d_model;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = d_model / heads;
  c.rope_dim = c.head_dim;
  c.d_ff = d_ff;
  c.vocab_size = 323;
  c.context_length = 512;
  return c;
}

TEST(ShardPlan, SmolLm2TakesOneAndThree) {
  const LlamaConfig c = SmolLm2Like();
  EXPECT_THAT(ShardPlan::ValidSizes(c), ElementsAre(1, 3));
  auto p1 = ShardPlan::Create(c, 1);
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_EQ(p1->rank(0).heads.count(), 9);
  EXPECT_EQ(p1->rank(0).ffn.count(), 1536);
  auto p3 = ShardPlan::Create(c, 3);
  ASSERT_TRUE(p3.ok()) << p3.status();
  ASSERT_EQ(p3->size(), 3);
  for (int r = 0; r < 3; ++r) {
    const RankShard& s = p3->rank(r);
    EXPECT_EQ(s.heads.begin, 3 * r);
    EXPECT_EQ(s.heads.end, 3 * r + 3);
    EXPECT_EQ(s.kv_heads.begin, r);
    EXPECT_EQ(s.kv_heads.count(), 1);
    EXPECT_EQ(s.ffn.begin, 512 * r);
    EXPECT_EQ(s.ffn.count(), 512);
    EXPECT_EQ(s.q_cols.begin, 192 * r);
    EXPECT_EQ(s.q_cols.count(), 192);
    EXPECT_EQ(p3->Spec(r).rank, r);
    EXPECT_EQ(p3->Spec(r).size, 3);
  }
  EXPECT_THAT(p3->Summary(), HasSubstr("per rank 3 heads, 1 kv heads, 512 ffn units"));
}

TEST(ShardPlan, SmolLm2RefusesTwoAndFourWithClearMessages) {
  const LlamaConfig c = SmolLm2Like();
  const absl::Status two = ShardPlan::Create(c, 2).status();
  EXPECT_EQ(two.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(two.message(), "tensor parallelism 2 does not divide SmolLM2's 3 KV heads; use 1 or 3");
  const absl::Status four = ShardPlan::Create(c, 4).status();
  EXPECT_EQ(four.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(four.message(),
            "tensor parallelism 4 exceeds SmolLM2's 3 KV heads and is not a multiple of them "
            "(each KV head is replicated on T / 3 ranks); use 1 or 3");
  // 6 replicates each kv head twice but does not divide the 9 query heads.
  EXPECT_THAT(ShardPlan::Create(c, 6).status().message(),
              HasSubstr("tensor parallelism 6 does not divide SmolLM2's 9 attention heads"));
  const absl::Status zero = ShardPlan::Create(c, 0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("at least 1, got 0"));
}

TEST(ShardPlan, TinyModelsSplitTwoAndFour) {
  const LlamaConfig c = Tiny(256, 8, 4, 512);
  EXPECT_THAT(ShardPlan::ValidSizes(c), ElementsAre(1, 2, 4, 8));  // 8: kv heads replicated
  auto p = ShardPlan::Create(c, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank(3).heads.begin, 6);
  EXPECT_EQ(p->rank(3).kv_heads.begin, 3);
  EXPECT_EQ(p->rank(3).ffn.begin, 384);
  EXPECT_EQ(ShardPlan::Create(c, 3).status().message(),
            "tensor parallelism 3 does not divide the model's 4 KV heads; use 1 or 2 or 4 or 8");
}

// TP above the kv-head count, a multiple of it: each kv head on T / n_kv ranks, each rank
// a 1 / T share of the query heads, all of one GQA group (vLLM's replication).
TEST(ShardPlan, ReplicatesKvHeadsWhenTpIsAMultipleOfThem) {
  LlamaConfig c = Tiny(4096, 32, 8, 14336);  // Llama-3-8B's attention and ffn shapes
  c.name = "Llama 3 8B";
  EXPECT_THAT(ShardPlan::ValidSizes(c), ElementsAre(1, 2, 4, 8, 16, 32));
  auto p = ShardPlan::Create(c, 16);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kv_replicas(), 2);
  for (int r = 0; r < 16; ++r) {
    const RankShard& s = p->rank(r);
    EXPECT_EQ(s.heads.begin, 2 * r);
    EXPECT_EQ(s.heads.count(), 2);
    EXPECT_EQ(s.kv_heads.begin, r / 2);  // heads 4k..4k+3 use kv head k
    EXPECT_EQ(s.kv_heads.count(), 1);
    EXPECT_EQ(s.heads.begin / c.gqa_group(), s.kv_heads.begin);
    EXPECT_EQ(s.q_cols.count(), 256);
    EXPECT_EQ(s.ffn.count(), 896);
  }
  EXPECT_THAT(p->Summary(), HasSubstr("per rank 2 heads, 1 kv heads (each on 2 ranks), 896"));
  EXPECT_EQ(ShardPlan::Create(c, 8)->kv_replicas(), 1);
  EXPECT_EQ(ShardPlan::Create(c, 12).status().message(),
            "tensor parallelism 12 exceeds Llama's 8 KV heads and is not a multiple of them "
            "(each KV head is replicated on T / 8 ranks); use 1 or 2 or 4 or 8 or 16 or 32");
  // The loader slices the same heads (LoadLlamaWeights uses HeadsOfShard).
  auto h = HeadsOfShard(c, ShardSpec{5, 16});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->q_begin, 10);
  EXPECT_EQ(h->kv_begin, 2);
  EXPECT_EQ(h->kv_replicas, 2);
  EXPECT_FALSE(HeadsOfShard(c, ShardSpec{0, 12}).ok());
  EXPECT_FALSE(HeadsOfShard(c, ShardSpec{16, 16}).ok());
}

TEST(ShardPlan, ColumnSlicesMustFallOnQuantBlocks) {
  // head_dim 8: q slices of 16 columns at TP 4 are not 32-value blocks.
  const LlamaConfig c = Tiny(64, 8, 8, 256);
  EXPECT_TRUE(ShardPlan::Create(c, 2).ok());
  const absl::Status s = ShardPlan::Create(c, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("attention-output slices of 16 columns"));
  EXPECT_THAT(s.message(), HasSubstr("use 1 or 2"));
  // d_ff 96: 48-unit slices at TP 2.
  const absl::Status f = ShardPlan::Create(Tiny(64, 2, 2, 96), 2).status();
  EXPECT_THAT(f.message(), HasSubstr("feed-forward slices of 48 units"));
}

TEST(ShardPlan, ForFileCountsBytesPerRank) {
  // Per architecture: qwen2's Q/K/V biases are sliced with their matrices (so its replicated
  // bytes equal llama's), qwen3's per-head norms are replicated.
  int64_t llama_replicated = 0;
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    TinyModelOptions o;
    o.arch = arch;
    o.d_model = 128;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.d_ff = 256;
    o.weight_type = GgmlType::kQ4_1;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("specnode_plan_" + std::to_string(getpid()) + arch + ".gguf"))
                                 .string();
    ASSERT_TRUE(WriteTinyModel(o, path).ok());
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto config = LlamaConfig::FromGguf(**file);
    ASSERT_TRUE(config.ok());
    auto p1 = ShardPlan::ForFile(**file, *config, 1);
    auto p2 = ShardPlan::ForFile(**file, *config, 2);
    ASSERT_TRUE(p1.ok() && p2.ok());
    int64_t total = 0;
    for (const auto& t : (*file)->tensors()) total += t.n_bytes;
    EXPECT_EQ(p1->rank(0).weight_bytes(), total);
    EXPECT_EQ(p2->rank(0).sharded_bytes * 2, p1->rank(0).sharded_bytes);
    EXPECT_EQ(p2->rank(1).replicated_bytes, p1->rank(0).replicated_bytes);
    EXPECT_GT(p2->rank(0).sharded_bytes, 0);
    // TP 4 over 2 kv heads: K and V (and their biases) held at 1/2, the rest at 1/4.
    auto p4 = ShardPlan::ForFile(**file, *config, 4);
    ASSERT_TRUE(p4.ok()) << p4.status();
    int64_t kv_bytes = 0;
    for (const auto& t : (*file)->tensors()) {
      if (t.name.find("attn_k.") != std::string::npos ||
          t.name.find("attn_v.") != std::string::npos) {
        kv_bytes += t.n_bytes;
      }
    }
    EXPECT_EQ(p4->rank(3).sharded_bytes, (p1->rank(0).sharded_bytes - kv_bytes) / 4 + kv_bytes / 2);
    const int64_t replicated = p1->rank(0).replicated_bytes;
    if (std::string(arch) == "llama") llama_replicated = replicated;
    if (std::string(arch) == "qwen2") {
      EXPECT_EQ(replicated, llama_replicated);
    }
    if (std::string(arch) == "qwen3") {
      EXPECT_EQ(replicated, llama_replicated + 2 * o.n_layers * (128 / 4) * 4);  // f32 [hd] x2
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace specnode
