// Views of a Llama model's weights inside a mapped GGUF file, optionally restricted to one
// tensor-parallel shard. Matrices stay in their storage type (no dequantised copies) and the
// views point into the GgufFile mapping, which must outlive the LlamaWeights. Storage-only
// types (Q5_0, Q5_1, and the K-quants Q4_K, Q5_K, Q6_K) stay as stored too: a backend runs
// them natively where it can (the CPU's x8 kernels take the K-quants) and converts the rest
// when it uploads them (ConvertToComputeType). The one exception: a K-quant matrix whose
// tensor-parallel column slice does not fall on its 256-value super-blocks is converted
// here, before slicing, and owned here.
//
// Tensor-parallel slicing (Megatron style, shard r of T):
//   Q, K, V     by output rows, whole heads: query heads [r*H/T, (r+1)*H/T), kv heads
//               likewise (T must divide both head counts)
//   gate, up    by output rows: ffn units [r*F/T, (r+1)*F/T)
//   O, down     by input columns, the same head / unit range (partial sums are all-reduced)
//   Q/K/V biases like their matrices' rows; norms (incl. the per-head Q/K norms),
//   embedding and head are replicated.
// Column slices must fall on 32-value block boundaries (checked; K-quants see above).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/cpu/act_quant.h"
#include "model/gguf/weight_view.h"
#include "model/llama/llama_config.h"

namespace specnode {

class GgufFile;

struct ShardSpec {
  int rank = 0;  // 0 <= rank < size
  int size = 1;
};

// The heads a tensor-parallel shard holds (Megatron slicing; the rules and their messages:
// tensor-parallel/shard_plan.h). Query heads: n_heads / size of them from q_begin. KV
// heads: n_kv_heads / size of them from kv_begin when size divides n_kv_heads; when size is
// a multiple of n_kv_heads (KV-head replication, as vLLM does), the one kv head its query
// heads use, which kv_replicas = size / n_kv_heads ranks hold alike.
struct ShardHeads {
  int q_begin = 0;
  int q_count = 0;
  int kv_begin = 0;
  int kv_count = 0;
  int kv_replicas = 1;
};
// InvalidArgument unless 0 <= rank < size, size divides n_heads and d_ff, and size divides
// n_kv_heads or is a multiple of it.
absl::StatusOr<ShardHeads> HeadsOfShard(const LlamaConfig& config, ShardSpec shard);

struct LayerWeights {
  const float* attn_norm = nullptr;  // [d_model]
  WeightView wq;                     // [q_dim / T rows, d_model cols]
  WeightView wk;                     // [kv_dim / T, d_model]
  WeightView wv;                     // [kv_dim / T, d_model]
  // Biases added to Q, K, V (architectures with qkv_bias, else null).
  const float* bq = nullptr;  // [q_dim / T]
  const float* bk = nullptr;  // [kv_dim / T]
  const float* bv = nullptr;  // [kv_dim / T]
  // Added to K after RoPE where K has a bias: -bk (the keys the cache stores are K less its
  // bias; llama_forward.cc Layer). Null without a K bias or with SPECNODE_KEY_OFFSET=0.
  const float* k_offset = nullptr;  // [kv_dim / T]
  // RMSNorm weights over each head of Q and K before RoPE (qk_norm, else null).
  const float* q_norm = nullptr;     // [head_dim]
  const float* k_norm = nullptr;     // [head_dim]
  WeightView wo;                     // [d_model, q_dim / T]
  const float* ffn_norm = nullptr;   // [d_model]
  // Norms of the attention and feed-forward outputs before their residual adds
  // (architectures with post_norms, else null).
  const float* post_attn_norm = nullptr;  // [d_model]
  const float* post_ffn_norm = nullptr;   // [d_model]
  WeightView w_gate;                 // [d_ff / T, d_model]
  WeightView w_up;                   // [d_ff / T, d_model]
  WeightView w_down;                 // [d_model, d_ff / T]
};

// The kv heads a (shard's) KV cache holds, and how many query heads attend to each there:
// the model's GQA group, or less under KV-head replication (ShardHeads).
struct KvHeadsHeld {
  int n_kv_heads = 0;
  int gqa_group = 1;
};

struct LlamaWeights {
  ShardSpec shard;
  int n_heads_local = 0;     // query heads on this shard
  int n_kv_heads_local = 0;  // kv heads on this shard
  int d_ff_local = 0;
  KvHeadsHeld kv_heads_held() const {
    return {n_kv_heads_local, n_kv_heads_local > 0 ? n_heads_local / n_kv_heads_local : 1};
  }
  WeightView token_embd;               // [vocab rows, d_model cols]
  const float* output_norm = nullptr;  // [d_model]
  WeightView output;                   // [vocab, d_model]; token_embd when tied
  // RoPE frequency factors (rope_freqs.weight: Llama 3.1 / 3.2 files), [rope_dim / 2]; null
  // when the file has none.
  const float* rope_freqs = nullptr;
  int rope_freqs_len = 0;
  // Linear RoPE scaling as frequency factors (config.rope_scale for every pair,
  // [rope_freqs_len]); null without scaling. The layers LlamaConfig::LayerRopeScale scales
  // use these instead of rope_freqs (a file with both is refused).
  const float* rope_linear = nullptr;
  std::vector<LayerWeights> layers;
  int head_dim = 0;  // width of q_norm / k_norm (MapWeightViews passes it as their length)
  // Norm and bias vectors converted to f32 when the file stores them as F16/BF16.
  std::vector<std::vector<float>> owned_norms;
  // Matrices converted to their compute type here (see above; views may point into these).
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned_matrices;
  // How LlamaForward's matmuls round activations for the quantised matrices (cpu_matmul.h);
  // a compute choice carried with the weights so every forward pass over them agrees.
  ActQuant activations = ActQuant::kInt16;
};

// n_layers < 0 loads every layer; otherwise the first n_layers (a self-speculative draft
// shares the target's final norm and head). Errors name the tensor and what is wrong.
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const GgufFile& file, const LlamaConfig& config,
                                              ShardSpec shard = {}, int n_layers = -1);

// A views-only copy of `w` (owned_* empty: it owns nothing) with every matrix replaced by
// matrix(view) and every norm or bias vector by norm(vector, its length): how a backend re-points
// the weights at its own memory or copies (Backend::UploadWeights). A tied head (output.data ==
// token_embd.data) is mapped once and shared. The first error returned by a callback is returned.
// A copy of v in its compute type (ComputeTypeOf: Q4_K -> Q4_1, Q5_0 / Q5_1 / Q5_K / Q6_K ->
// Q8_0; ggml_converted_types.h), its bytes appended to *owned, when v's type is storage-only
// (IsConvertedType); else v itself. A column-slice view converts its slice.
WeightView ConvertToComputeType(const WeightView& v,
                                std::vector<std::unique_ptr<std::vector<uint8_t>>>* owned);

using WeightMatrixMap = std::function<absl::StatusOr<WeightView>(const WeightView&)>;
using WeightNormMap = std::function<absl::StatusOr<const float*>(const float*, int64_t)>;
absl::StatusOr<LlamaWeights> MapWeightViews(const LlamaWeights& w, const WeightMatrixMap& matrix,
                                            const WeightNormMap& norm);

}  // namespace specnode
