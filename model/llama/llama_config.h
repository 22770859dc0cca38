// Hyper-parameters of a Llama-family model (any row of the architecture table,
// llama_arch.h), read from GGUF metadata.
// Immutable value type; everything downstream reads it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/llama/llama_arch.h"

namespace specnode {

class GgufFile;

struct LlamaConfig {
  std::string architecture;  // general.architecture: a row of llama_arch.h
  ArchTraits arch;           // that row: the graph's variants
  std::string name;          // general.name, informational
  int n_layers = 0;
  int d_model = 0;           // embedding_length
  int n_heads = 0;
  int n_kv_heads = 0;        // GQA: n_heads is a multiple of n_kv_heads
  int head_dim = 0;          // attention.key_length, else d_model / n_heads
  int rope_dim = 0;          // rotated dims per head (<= head_dim, even)
  int d_ff = 0;              // feed_forward_length
  int vocab_size = 0;
  int context_length = 0;
  float rope_base = 10000.0f;
  // Linear RoPE scaling factor (rope.scaling.type linear, rope.scaling.factor): positions
  // are divided by it on the layers it applies to (LayerRopeScale); 1: none.
  float rope_scale = 1.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: the head reuses token_embd
  // Sliding-window attention: a windowed layer's token attends to its last sliding_window
  // positions only (<arch>.attention.sliding_window; 0: every layer attends to the whole
  // prefix). Which layers are windowed: all, unless the row has a global-layer period.
  int sliding_window = 0;
  // Multiplies q·k before the softmax: 1 / sqrt(head_dim), except Gemma 3 27B (62 layers),
  // whose query_pre_attn_scalar is d_model / n_heads (as llama.cpp, which hard-codes it).
  float attn_scale = 0.0f;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  int gqa_group() const { return n_heads / n_kv_heads; }
  // The attention window of layer l (KvCache::Attend's `window`): 0 for a global layer.
  int32_t LayerWindow(int l) const;
  // The RoPE base of layer l: the row's local base on a windowed layer that has one.
  float LayerRopeBase(int l) const;
  // The linear RoPE scale of layer l (1 on a local layer of a row that scales global ones).
  float LayerRopeScale(int l) const;

  // Reads "<arch>.*" keys. Unimplemented for an architecture not in the table (naming it
  // and the supported ones) and for value_length != key_length; InvalidArgument naming the key for
  // missing or inconsistent values (e.g. heads not dividing d_model without key_length, kv heads
  // not dividing heads, odd rope dims, vocab mismatch between the metadata and token_embd).
  static absl::StatusOr<LlamaConfig> FromGguf(const GgufFile& file);

  // One line for logs: "llama 30L d576 h9/3 ff1536 vocab49152 ctx8192" (heads x head_dim
  // when that is not d_model: "h16/8x128"; the variants a row adds: "qwen2 ... neox bias").
  std::string Summary() const;
};

}  // namespace specnode
