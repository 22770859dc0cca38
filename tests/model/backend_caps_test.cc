// The capability tables (model/llama/backend_caps.h): every flag of the architecture table
// asks for a named feature, every backend's table either runs each row or refuses it naming
// exactly what is missing.
#include "model/llama/backend_caps.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/llama/cpu_backend.h"
#include "model/llama/llama_arch.h"

namespace specnode {
namespace {

LlamaConfig ConfigOf(const ArchTraits& a, int window = 0, float rope_scale = 1.0f) {
  LlamaConfig c;
  c.architecture = std::string(a.name);
  c.arch = a;
  c.n_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 32;
  c.sliding_window = window;
  c.rope_scale = rope_scale;
  return c;
}

bool Has(const GraphFeatures& f, GraphFeature g) { return f[static_cast<size_t>(g)]; }

// Plain llama asks for nothing; each flag of a row (with the file values that make it
// change the graph) asks for its feature, and every feature has a name.
TEST(BackendCaps, EveryArchFlagAsksForANamedFeature) {
  const ArchTraits llama = *FindArch("llama");
  EXPECT_TRUE(FeaturesOf(ConfigOf(llama)).none());
  struct Case {
    ArchTraits arch;
    int window;
    float rope_scale;
    GraphFeature want;
  };
  std::vector<Case> cases(9, Case{llama, 0, 1.0f, GraphFeature::kCount});
  cases[0].arch.rope = RopeMode::kNeox, cases[0].want = GraphFeature::kNeoxRope;
  cases[1].arch.qkv_bias = true, cases[1].want = GraphFeature::kQkvBias;
  cases[2].arch.qk_norm = true, cases[2].want = GraphFeature::kQkNorm;
  cases[3].arch.ffn = FfnActivation::kGeluTanh, cases[3].want = GraphFeature::kGeluTanh;
  cases[4].arch.embed_scale = true, cases[4].want = GraphFeature::kEmbedScale;
  cases[5].arch.post_norms = true, cases[5].want = GraphFeature::kPostNorms;
  cases[6].arch.swa_period = 6, cases[6].window = 64, cases[6].want = GraphFeature::kSlidingWindow;
  cases[7].arch.rope_base_local = 10000.0f, cases[7].window = 64;
  cases[7].want = GraphFeature::kLocalRopeBase;
  cases[8].arch.rope_scaling_global_only = true, cases[8].rope_scale = 8.0f;
  cases[8].want = GraphFeature::kRopeLinearScaling;
  for (const Case& c : cases) {
    const GraphFeatures f = FeaturesOf(ConfigOf(c.arch, c.window, c.rope_scale));
    EXPECT_TRUE(Has(f, c.want)) << GraphFeatureName(c.want);
  }
  for (int i = 0; i < static_cast<int>(GraphFeature::kCount); ++i) {
    EXPECT_NE(std::string(GraphFeatureName(static_cast<GraphFeature>(i))), "unknown") << i;
  }
  for (const char* arch : {"qwen2", "qwen3", "gemma3"}) {
    EXPECT_TRUE(FeaturesOf(ConfigOf(*FindArch(arch), 512)).any()) << arch;
  }
}

// A backend lacking a feature refuses the rows that need it, naming the device, the model
// and every missing feature at once; the limits are named too.
TEST(BackendCaps, ARefusalNamesEveryMissingFeature) {
  const LlamaConfig gemma = ConfigOf(*FindArch("gemma3"), 512);
  for (int i = 0; i < static_cast<int>(GraphFeature::kCount); ++i) {
    const GraphFeature g = static_cast<GraphFeature>(i);
    BackendCaps caps;
    caps.features = AllGraphFeatures();
    caps.features.reset(i);
    const absl::Status s = CheckGraphSupported(caps, gemma, Device::Cuda(3));
    if (!Has(FeaturesOf(gemma), g)) {
      EXPECT_TRUE(s.ok()) << GraphFeatureName(g) << ": " << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(GraphFeatureName(g)), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("cuda:3"), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("gemma3"), std::string_view::npos) << s;
  }
  BackendCaps none;  // plain llama only, head_dim <= 8
  none.max_head_dim = 8;
  const absl::Status s = CheckGraphSupported(none, gemma, Device::Cpu());
  for (const char* name : {"neox_rope", "qk_norm", "gelu_tanh", "embed_scale", "post_norms",
                           "sliding_window", "local_rope_base", "head_dim 16"}) {
    EXPECT_NE(s.message().find(name), std::string_view::npos) << name << ": " << s;
  }
  EXPECT_TRUE(CheckGraphSupported(none, ConfigOf(*FindArch("llama")), Device::Cpu())
                  .message()
                  .find("head_dim 16") != std::string_view::npos);
}

// The CPU reference runs every row (the GPU's table is checked in the runner factory's
// tests, where CUDA is built).
TEST(BackendCaps, TheCpuRunsEveryRow) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma3"}) {
    for (int window : {0, 4096}) {
      const absl::Status s = CheckGraphSupported(
          CpuBackend::Caps(), ConfigOf(*FindArch(arch), window, 2.0f), Device::Cpu());
      EXPECT_TRUE(s.ok()) << arch << ": " << s;
    }
  }
}

}  // namespace
}  // namespace specnode
