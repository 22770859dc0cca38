#include "model/llama/llama_arch.h"

#include "absl/strings/str_join.h"

namespace specnode {
namespace {

constexpr ArchTraits kArchs[] = {
    {.name = "llama", .rope = RopeMode::kNorm},
    {.name = "qwen2", .rope = RopeMode::kNeox, .qkv_bias = true},
    {.name = "qwen3", .rope = RopeMode::kNeox, .qk_norm = true},
    {.name = "gemma3",
     .rope = RopeMode::kNeox,
     .qk_norm = true,
     .ffn = FfnActivation::kGeluTanh,
     .embed_scale = true,
     .post_norms = true,
     .swa_period = 6,
     .rope_base_local = 10000.0f,
     .rope_scaling_global_only = true},
};

}  // namespace

const ArchTraits* FindArch(std::string_view architecture) {
  for (const ArchTraits& a : kArchs) {
    if (a.name == architecture) return &a;
  }
  return nullptr;
}

std::string SupportedArchitectures() {
  return absl::StrJoin(kArchs, ", ",
                       [](std::string* out, const ArchTraits& a) { out->append(a.name); });
}

const char* RopeModeName(RopeMode mode) { return mode == RopeMode::kNeox ? "neox" : "norm"; }

}  // namespace specnode
