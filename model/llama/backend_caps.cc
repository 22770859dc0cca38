#include "model/llama/backend_caps.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specnode {

const char* GraphFeatureName(GraphFeature f) {
  switch (f) {
    case GraphFeature::kNeoxRope:
      return "neox_rope";
    case GraphFeature::kRopeLinearScaling:
      return "rope_linear_scaling";
    case GraphFeature::kLocalRopeBase:
      return "local_rope_base";
    case GraphFeature::kQkvBias:
      return "qkv_bias";
    case GraphFeature::kQkNorm:
      return "qk_norm";
    case GraphFeature::kGeluTanh:
      return "gelu_tanh";
    case GraphFeature::kEmbedScale:
      return "embed_scale";
    case GraphFeature::kPostNorms:
      return "post_norms";
    case GraphFeature::kSlidingWindow:
      return "sliding_window";
    case GraphFeature::kCount:
      break;
  }
  return "unknown";
}

GraphFeatures AllGraphFeatures() { return GraphFeatures().set(); }

GraphFeatures FeaturesOf(const LlamaConfig& c) {
  GraphFeatures f;
  auto set = [&](GraphFeature g, bool on) { f.set(static_cast<size_t>(g), on); };
  const ArchTraits& a = c.arch;
  set(GraphFeature::kNeoxRope, a.rope == RopeMode::kNeox);
  set(GraphFeature::kRopeLinearScaling, c.rope_scale != 1.0f);
  set(GraphFeature::kLocalRopeBase, a.rope_base_local != 0.0f && c.sliding_window != 0);
  set(GraphFeature::kQkvBias, a.qkv_bias);
  set(GraphFeature::kQkNorm, a.qk_norm);
  set(GraphFeature::kGeluTanh, a.ffn == FfnActivation::kGeluTanh);
  set(GraphFeature::kEmbedScale, a.embed_scale);
  set(GraphFeature::kPostNorms, a.post_norms);
  set(GraphFeature::kSlidingWindow, c.sliding_window != 0);
  return f;
}

absl::Status CheckGraphSupported(const BackendCaps& caps, const LlamaConfig& config,
                                 const Device& device) {
  std::vector<std::string> missing;
  const GraphFeatures need = FeaturesOf(config);
  for (size_t i = 0; i < need.size(); ++i) {
    if (need[i] && !caps.features[i]) {
      missing.push_back(GraphFeatureName(static_cast<GraphFeature>(i)));
    }
  }
  if (caps.max_head_dim > 0 && config.head_dim > caps.max_head_dim) {
    missing.push_back(absl::StrCat("head_dim ", config.head_dim,
                                   " (attention takes <= ", caps.max_head_dim, ")"));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(device.name(), " cannot run ", config.Summary(),
                                                 ": no kernel for ", absl::StrJoin(missing, ", "),
                                                 "; use --device cpu"));
}

}  // namespace specnode
