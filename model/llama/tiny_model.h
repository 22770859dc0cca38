// Writes small deterministic Llama-family GGUF files for tests and demos.
//
// The file is a complete model of one architecture of the table (llama_arch.h): its
// "<arch>.*" hyper-parameters and the tensors its row requires (Q/K/V biases for qwen2,
// per-head Q/K norms for qwen3 and gemma3, post-norms for gemma3; its RoPE mode, GeGLU,
// embedding scale and local/global layer pattern are the graph's, nothing in the file), a
// byte-level BPE vocabulary (256 byte tokens, `n_merges` merges of frequent English pairs, and the
// control tokens
// <|endoftext|>, <|im_start|>, <|im_end|>), a ChatML chat template, and weights drawn
// from a seeded generator (same options -> byte-identical file). Weights are scaled so
// activations stay O(1) through the layers and logits are not degenerate.
//
// perturb > 0 adds seeded Gaussian noise with standard deviation perturb * (each tensor's
// own standard deviation) to every tensor: a draft that agrees with the target less as
// perturb grows. perturb_seed selects the noise draw.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

struct TinyModelOptions {
  std::string arch = "llama";  // general.architecture: a row of llama_arch.h
  int n_layers = 2;
  int d_model = 64;  // multiple of 32 (and of n_heads unless head_dim is set)
  int n_heads = 4;
  int n_kv_heads = 2;  // divides n_heads
  // Width of a head; 0: d_model / n_heads. Another width (Qwen3 and Gemma files have them)
  // is written as <arch>.attention.key_length / value_length; n_heads * head_dim must be a
  // multiple of 32.
  int head_dim = 0;
  int d_ff = 128;     // multiple of 32
  int n_merges = 64;  // vocabulary = 256 + n_merges + 3 control tokens
  int context_length = 512;
  // > 0: written as <arch>.attention.sliding_window (Mistral-style windowed attention).
  int sliding_window = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  // Writes rope_freqs.weight (Llama 3.1-style RoPE frequency factors): pair i's angle
  // divided by 1 + 7 i / (pairs - 1), a ramp from 1 (fast pairs) to 8 (slow ones).
  bool rope_freqs = false;
  // > 1: written as rope.scaling.type linear with this rope.scaling.factor.
  float rope_scale = 0.0f;
  // qwen2: added to the K bias of each kv head's slowest RoPE pair (its channel head_dim/2 - 1,
  // and half of it taken from head_dim - 1), as Qwen2.5's files carry |b| up to ~456 there.
  float k_bias_outlier = 0.0f;
  bool tied_embeddings = true;            // no output.weight; the head reuses token_embd
  GgmlType weight_type = GgmlType::kF32;  // matrices; norms are always F32
  uint64_t seed = 1;
  float perturb = 0.0f;
  uint64_t perturb_seed = 7;
  // Threads that generate and encode each tensor (0: one per hardware thread). The file's
  // bytes do not depend on it: value i of a tensor comes from its own position in the
  // tensor's random stream, and rows are encoded independently.
  int threads = 0;
};

absl::Status WriteTinyModel(const TinyModelOptions& options, const std::string& path);

// Real shapes with random weights, for speed and memory benchmarks (not for quality: the
// weights are the writer's seeded noise): sets *o's architecture fields to
//   llama3-8b         Llama-3-8B: 32 layers, d 4096, 32 / 8 heads x 128, ff 14336, vocab
//                     128256, untied head, RoPE base 500000, context 8192
//   llama3-70b-layer  one layer of Llama-3-70B: d 8192, 64 / 8 heads x 128, ff 28672, the
//                     same vocabulary and head
// and the weight type to Q4_0 (a caller may override any field afterwards).
// InvalidArgument naming the known shapes for another name.
absl::Status ApplyTinyModelShape(std::string_view name, TinyModelOptions* o);

}  // namespace specnode
