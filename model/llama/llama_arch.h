// The architecture table: every model family specnode runs, one row each, as llama.cpp
// describes its architectures. A row says how that family's graph differs from plain Llama
// (llama_forward.cc reads the flags; there is one graph, not one per family) and which
// optional tensors its files carry. A file whose general.architecture has no row is refused
// by name (LlamaConfig::FromGguf).
//
// Rows, and where they come from:
//   llama   Llama 1-3, SmolLM, Mistral 7B (whose llama.cpp conversions are written as
//           "llama"): RoPE on adjacent pairs (the converter permutes Q/K rows for it).
//   qwen2   Qwen2 / Qwen2.5: NeoX RoPE (halves, rows not permuted), biases on Q, K and V.
//   qwen3   Qwen3 (dense): NeoX RoPE, no biases, an RMSNorm over each head of Q and K
//           (attn_q_norm / attn_k_norm, [head_dim]) before RoPE.
//   gemma3  Gemma 3 (text): NeoX RoPE, Q/K norms, embeddings scaled by sqrt(d_model),
//           GeGLU (tanh GELU), each sublayer's output normalised before its residual add
//           (post_attention_norm, post_ffw_norm), local layers (sliding window, RoPE base
//           10000) with every 6th layer global (the file's base). Norm weights are used as
//           stored: llama.cpp's converter already folded Gemma's (1 + w) into them.
// Any row: <arch>.attention.sliding_window, when the file has it, windows every layer
// except the row's global ones (Mistral-style files: all of them).
// Immutable data; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace specnode {

// How RoPE pairs a head's dimensions: kNorm rotates (2i, 2i+1) (ggml's NORM mode), kNeox
// rotates (i, i + rope_dim/2) (GPT-NeoX / ggml's NEOX mode). Pair i turns by
// position * base^(-2i / rope_dim) in both.
enum class RopeMode { kNorm, kNeox };

// The gate's activation of the gated MLP: down(act(gate) * up).
enum class FfnActivation {
  kSilu,      // SwiGLU
  kGeluTanh,  // GeGLU with GELU's tanh approximation
};

struct ArchTraits {
  std::string_view name;  // general.architecture; also the metadata key prefix
  RopeMode rope = RopeMode::kNorm;
  bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias [rows of the matrix]: required
  bool qk_norm = false;   // blk.N.attn_{q,k}_norm.weight [head_dim]: required
  FfnActivation ffn = FfnActivation::kSilu;
  bool embed_scale = false;  // token embeddings multiplied by sqrt(d_model)
  bool post_norms = false;   // blk.N.post_attention_norm / post_ffw_norm.weight [d_model]
  // With a sliding window: layer l is global (whole prefix) iff (l + 1) % swa_period == 0;
  // 0: every layer is windowed.
  int swa_period = 0;
  float rope_base_local = 0.0f;  // RoPE base of the windowed layers; 0: the file's base
  // Linear RoPE scaling (rope.scaling.type linear) applies to the global layers only
  // (Gemma 3 4B+: the local layers keep unscaled RoPE); false: to every layer.
  bool rope_scaling_global_only = false;
};

// What a row's flags ask of a backend: model/llama/backend_caps.h (FeaturesOf). A flag
// added to ArchTraits must become a GraphFeature there.

// The row of `architecture`, or nullptr when the table has none.
const ArchTraits* FindArch(std::string_view architecture);

// "llama, qwen2, qwen3": for errors and --help.
std::string SupportedArchitectures();

const char* RopeModeName(RopeMode mode);  // "norm" / "neox"

}  // namespace specnode
