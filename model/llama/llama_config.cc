#include "model/llama/llama_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

absl::StatusOr<int> GetPositiveInt(const GgufFile& file, const std::string& key, int64_t max) {
  SPECNODE_ASSIGN_OR_RETURN(int64_t v, file.GetInt(key));
  if (v <= 0 || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", v, " is out of range (1..", max, ")"));
  }
  return static_cast<int>(v);
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfig::FromGguf(const GgufFile& file) {
  LlamaConfig c;
  auto arch = file.GetString("general.architecture");
  if (!arch.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a model file: general.architecture: ", arch.status().message()));
  }
  c.architecture = *arch;
  const ArchTraits* traits = FindArch(c.architecture);
  if (traits == nullptr) {
    return absl::UnimplementedError(absl::StrCat("unsupported architecture '", c.architecture,
                                                 "' (specnode runs ", SupportedArchitectures(),
                                                 ")"));
  }
  c.arch = *traits;
  if (auto name = file.GetString("general.name"); name.ok()) c.name = *name;
  const std::string p = c.architecture + ".";
  SPECNODE_ASSIGN_OR_RETURN(c.n_layers, GetPositiveInt(file, p + "block_count", 1024));
  SPECNODE_ASSIGN_OR_RETURN(c.d_model, GetPositiveInt(file, p + "embedding_length", 1 << 16));
  SPECNODE_ASSIGN_OR_RETURN(c.n_heads, GetPositiveInt(file, p + "attention.head_count", 1024));
  c.n_kv_heads = c.n_heads;
  if (file.Find(p + "attention.head_count_kv") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(c.n_kv_heads,
                              GetPositiveInt(file, p + "attention.head_count_kv", 1024));
  }
  SPECNODE_ASSIGN_OR_RETURN(c.d_ff, GetPositiveInt(file, p + "feed_forward_length", 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(c.context_length, GetPositiveInt(file, p + "context_length", 1 << 24));
  if (c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "head_count %d is not a multiple of head_count_kv %d", c.n_heads, c.n_kv_heads));
  }
  // The head width: attention.key_length when the file states it (Qwen3, Gemma: heads
  // wider or narrower than embedding_length / head_count), else that quotient.
  if (file.Find(p + "attention.key_length") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(c.head_dim, GetPositiveInt(file, p + "attention.key_length", 1024));
    if (file.Find(p + "attention.value_length") != nullptr) {
      SPECNODE_ASSIGN_OR_RETURN(int value_length,
                                GetPositiveInt(file, p + "attention.value_length", 1024));
      if (value_length != c.head_dim) {
        return absl::UnimplementedError(absl::StrFormat(
            "%sattention.value_length %d differs from key_length %d (not supported)", p,
            value_length, c.head_dim));
      }
    }
  } else {
    if (c.d_model % c.n_heads != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "embedding_length %d is not a multiple of head_count %d (and %sattention.key_length "
          "is not set)",
          c.d_model, c.n_heads, p));
    }
    c.head_dim = c.d_model / c.n_heads;
  }
  c.rope_dim = c.head_dim;
  if (file.Find(p + "rope.dimension_count") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(c.rope_dim, GetPositiveInt(file, p + "rope.dimension_count", 1 << 16));
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rope.dimension_count %d must be even and at most head_dim %d", c.rope_dim, c.head_dim));
  }
  if (file.Find(p + "rope.freq_base") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(double base, file.GetFloat(p + "rope.freq_base"));
    if (!(base > 1.0 && base < 1e12)) {
      return absl::InvalidArgumentError(absl::StrCat("rope.freq_base ", base, " out of range"));
    }
    c.rope_base = static_cast<float>(base);
  }
  SPECNODE_ASSIGN_OR_RETURN(double eps, file.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (!(eps > 0.0 && eps < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention.layer_norm_rms_epsilon ", eps, " out of range"));
  }
  c.rms_eps = static_cast<float>(eps);

  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2 || embd->dims[0] != c.d_model) {
    return absl::InvalidArgumentError(
        "token_embd.weight missing or not shaped [embedding_length, vocab]");
  }
  c.vocab_size = static_cast<int>(embd->dims[1]);
  if (file.Find(p + "vocab_size") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(int64_t v, file.GetInt(p + "vocab_size"));
    if (v != c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%svocab_size %d disagrees with token_embd.weight rows %d", p, v, c.vocab_size));
    }
  }
  c.tied_embeddings = file.FindTensor("output.weight") == nullptr;
  // RoPE variants the graph does not compute are refused, never approximated.
  if (auto type = file.GetString(p + "rope.scaling.type"); type.ok() && *type != "none") {
    if (*type != "linear") {
      return absl::UnimplementedError(
          absl::StrCat(p, "rope.scaling.type '", *type, "' is not supported (none or linear)"));
    }
    if (file.Find(p + "rope.scaling.factor") == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(p, "rope.scaling.type is linear but ", p, "rope.scaling.factor is missing"));
    }
    SPECNODE_ASSIGN_OR_RETURN(double factor, file.GetFloat(p + "rope.scaling.factor"));
    if (!(factor >= 1.0 && factor <= 1024.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(p, "rope.scaling.factor ", factor, " out of range [1, 1024]"));
    }
    c.rope_scale = static_cast<float>(factor);
  }

  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.architecture == "gemma3" && c.n_layers == 62) {
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.d_model / c.n_heads));
  }
  if (file.Find(p + "attention.sliding_window") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(c.sliding_window,
                              GetPositiveInt(file, p + "attention.sliding_window", 1 << 24));
  }
  return c;
}

int32_t LlamaConfig::LayerWindow(int l) const {
  if (sliding_window == 0) return 0;
  if (arch.swa_period > 0 && (l + 1) % arch.swa_period == 0) return 0;
  return sliding_window;
}

float LlamaConfig::LayerRopeScale(int l) const {
  if (arch.rope_scaling_global_only && LayerWindow(l) > 0) return 1.0f;
  return rope_scale;
}

float LlamaConfig::LayerRopeBase(int l) const {
  return LayerWindow(l) > 0 && arch.rope_base_local > 0.0f ? arch.rope_base_local : rope_base;
}

std::string LlamaConfig::Summary() const {
  const std::string heads = head_dim * n_heads == d_model
                                ? absl::StrFormat("h%d/%d", n_heads, n_kv_heads)
                                : absl::StrFormat("h%d/%dx%d", n_heads, n_kv_heads, head_dim);
  std::string variants;
  if (arch.rope == RopeMode::kNeox) variants += " neox";
  if (arch.qkv_bias) variants += " bias";
  if (arch.qk_norm) variants += " qknorm";
  if (arch.ffn == FfnActivation::kGeluTanh) variants += " geglu";
  if (arch.post_norms) variants += " postnorm";
  if (rope_scale != 1.0f) variants += absl::StrCat(" ropex", rope_scale);
  if (sliding_window > 0) {
    variants += absl::StrCat(" swa", sliding_window);
    if (arch.swa_period > 0) variants += absl::StrCat("/", arch.swa_period);
  }
  return absl::StrFormat("%s %dL d%d %s ff%d vocab%d ctx%d%s%s", architecture, n_layers, d_model,
                         heads, d_ff, vocab_size, context_length, tied_embeddings ? " tied" : "",
                         variants);
}

}  // namespace specnode
