// What a backend runs, asked before any weight moves (as ggml backends answer supports_op):
// the graph's features beyond plain llama that a model needs (FeaturesOf: its architecture
// row and its file), and one table per backend of those it has kernels for (BackendCaps,
// CpuBackend::Caps, CudaBackend::Caps). The runner factory (runtime/runner_factory.cc) checks
// a model against its device's table once, and a refusal names exactly what is missing.
//
// A flag added to ArchTraits (llama_arch.h) or LlamaConfig that changes the graph must become
// a GraphFeature here; tests/model/backend_caps_test.cc checks every row of the architecture
// table against every backend's table. Value types; thread-safe.
#pragma once

#include <bitset>
#include <string>

#include "absl/status/status.h"
#include "model/llama/device.h"
#include "model/llama/llama_config.h"

namespace specnode {

enum class GraphFeature : int {
  kNeoxRope,           // RoPE over halves (RopeMode::kNeox)
  kRopeLinearScaling,  // rope.scaling.type linear (frequency factors from the scale)
  kLocalRopeBase,      // windowed layers with their own RoPE base (gemma3)
  kQkvBias,            // biases on Q, K and V (qwen2)
  kQkNorm,             // RMSNorm over each head of Q and K (qwen3, gemma3)
  kGeluTanh,           // GeGLU with the tanh GELU (gemma3)
  kEmbedScale,         // embeddings times sqrt(d_model) (gemma3)
  kPostNorms,          // post-attention / post-FFN norms (gemma3)
  kSlidingWindow,      // sliding-window attention layers (gemma3, Mistral-style files)
  kCount,
};
using GraphFeatures = std::bitset<static_cast<size_t>(GraphFeature::kCount)>;

// "neox_rope", "sliding_window", ...: for errors, --help and docs/gpu.md.
const char* GraphFeatureName(GraphFeature f);

// Every feature: what a backend with a kernel for each op and variant of the table runs.
GraphFeatures AllGraphFeatures();

// The features `config`'s graph uses (its row's flags, its window and RoPE scaling). RoPE
// frequency factors from the file (rope_freqs.weight) are an input of the RoPE op every
// backend takes, not a feature.
GraphFeatures FeaturesOf(const LlamaConfig& config);

struct BackendCaps {
  GraphFeatures features;         // the variants it has kernels for
  int max_head_dim = 0;           // attention's largest head_dim; 0: any
  bool int8_activations = false;  // ActQuant::kInt8 matmuls (the CPU's option)
};

// OK when `caps` runs `config`'s graph; else InvalidArgument naming `device`, the model
// (config.Summary()) and every missing feature or limit at once.
absl::Status CheckGraphSupported(const BackendCaps& caps, const LlamaConfig& config,
                                 const Device& device);

}  // namespace specnode
