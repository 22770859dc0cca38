// `specnode tiny-model`: writes a small deterministic Llama GGUF (see model/tiny_model.h).

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "model/gguf/ggml_types.h"
#include "model/llama/tiny_model.h"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"

namespace specnode {
namespace {

constexpr char kUsage[] =
    "usage: specnode tiny-model --out PATH [--shape NAME] [--arch llama|qwen2|qwen3|gemma3]\n"
    "         [--layers N] [--d-model N] [--heads N]\n"
    "         [--kv-heads N] [--head-dim N] [--ff N] [--merges N] [--context N]\n"
    "         [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k] [--seed S]\n"
    "         [--perturb EPS] [--perturb-seed S] [--untied] [--sliding-window N]\n"
    "         [--rope-freqs] [--rope-scale F] [--threads N]\n"
    "K-quant types apply to matrices whose rows are whole 256-value blocks; narrower ones\n"
    "fall back as in llama.cpp's quantiser (q4_k to q5_0, q5_k to q5_1, q6_k to q8_0).\n"
    "--head-dim (default d_model / heads) other than that quotient is written as\n"
    "<arch>.attention.key_length / value_length, as Qwen3 and Gemma files state theirs.\n"
    "--arch writes that architecture's keys and the tensors it adds (qwen2: Q/K/V\n"
    "biases, qwen3: per-head Q/K norms, gemma3: those and post-norms).\n"
    "--sliding-window N writes <arch>.attention.sliding_window (each token attends to its\n"
    "last N positions, as Mistral's windowed layers).\n"
    "--rope-freqs writes rope_freqs.weight, Llama 3.1-style RoPE frequency factors;\n"
    "--rope-scale F linear RoPE scaling (gemma3: its global layers only).\n"
    "--shape llama3-8b|llama3-70b-layer: real shapes with random weights (Q4_0 unless\n"
    "--type says otherwise; 4.5 / 1.7 GB, minutes to write) for speed and memory benchmarks\n"
    "(bench/README.md); other options override single fields.\n"
    "--threads N generates and encodes each tensor on N threads (default: every hardware\n"
    "thread); the file's bytes do not depend on it.\n";

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "specnode tiny-model: %s\n", message.c_str());
  return code;
}

absl::StatusOr<GgmlType> ParseType(const std::string& s) {
  if (s == "f32") return GgmlType::kF32;
  if (s == "f16") return GgmlType::kF16;
  if (s == "bf16") return GgmlType::kBF16;
  if (s == "q8_0") return GgmlType::kQ8_0;
  if (s == "q4_0") return GgmlType::kQ4_0;
  if (s == "q4_1") return GgmlType::kQ4_1;
  if (s == "q5_0") return GgmlType::kQ5_0;
  if (s == "q5_1") return GgmlType::kQ5_1;
  if (s == "q4_k") return GgmlType::kQ4_K;
  if (s == "q5_k") return GgmlType::kQ5_K;
  if (s == "q6_k") return GgmlType::kQ6_K;
  return absl::InvalidArgumentError(
      "--type must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, "
      "got '" +
      s + "'");
}

// Reads every option into `o`; the first bad value wins.
absl::Status ReadOptions(const CliArgs& args, TinyModelOptions& o) {
  // A real shape first; the other options then override single fields.
  if (args.Has("shape")) {
    if (absl::Status s = ApplyTinyModelShape(args.Get("shape"), &o); !s.ok()) return s;
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  constexpr int64_t kSeedMax = std::numeric_limits<int64_t>::max();
  auto get_int = [&](const char* key, int& field, int64_t lo) -> absl::Status {
    absl::StatusOr<int64_t> v = args.GetInt(key, field, lo, kIntMax);
    if (!v.ok()) return v.status();
    field = static_cast<int>(*v);
    return absl::OkStatus();
  };
  for (auto [key, field, lo] :
       {std::tuple{"layers", &o.n_layers, 1}, std::tuple{"d-model", &o.d_model, 1},
        std::tuple{"heads", &o.n_heads, 1}, std::tuple{"kv-heads", &o.n_kv_heads, 1},
        std::tuple{"head-dim", &o.head_dim, 0}, std::tuple{"ff", &o.d_ff, 1},
        std::tuple{"merges", &o.n_merges, 0}, std::tuple{"context", &o.context_length, 1},
        std::tuple{"sliding-window", &o.sliding_window, 0}, std::tuple{"threads", &o.threads, 0}}) {
    if (absl::Status s = get_int(key, *field, lo); !s.ok()) return s;
  }
  absl::StatusOr<int64_t> seed = args.GetInt("seed", static_cast<int64_t>(o.seed), 0, kSeedMax);
  if (!seed.ok()) return seed.status();
  o.seed = static_cast<uint64_t>(*seed);
  absl::StatusOr<int64_t> pseed =
      args.GetInt("perturb-seed", static_cast<int64_t>(o.perturb_seed), 0, kSeedMax);
  if (!pseed.ok()) return pseed.status();
  o.perturb_seed = static_cast<uint64_t>(*pseed);
  absl::StatusOr<double> perturb = args.GetDouble("perturb", o.perturb, 0.0, 100.0);
  if (!perturb.ok()) return perturb.status();
  o.perturb = static_cast<float>(*perturb);
  if (args.Has("type")) {
    absl::StatusOr<GgmlType> t = ParseType(args.Get("type"));
    if (!t.ok()) return t.status();
    o.weight_type = *t;
  }
  if (args.Has("untied")) o.tied_embeddings = false;
  if (args.Has("rope-freqs")) o.rope_freqs = true;
  absl::StatusOr<double> rope_scale = args.GetDouble("rope-scale", o.rope_scale, 0.0, 1024.0);
  if (!rope_scale.ok()) return rope_scale.status();
  o.rope_scale = static_cast<float>(*rope_scale);
  if (args.Has("arch")) o.arch = args.Get("arch");  // validated by WriteTinyModel
  return absl::OkStatus();
}

}  // namespace

int RunTinyModel(int argc, char** argv) {
  absl::StatusOr<CliArgs> args =
      CliArgs::Parse(argc, argv,
                     {"out", "shape", "arch", "layers", "d-model", "heads", "kv-heads", "head-dim",
                      "ff", "merges", "context", "sliding-window", "rope-scale", "type", "seed",
                      "perturb", "perturb-seed", "threads"},
                     {"untied", "rope-freqs", "help"});
  if (!args.ok()) {
    Fail(2, std::string(args.status().message()));
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args->Has("out") || args->Get("out").empty()) {
    Fail(2, "--out PATH is required");
    std::fputs(kUsage, stderr);
    return 2;
  }
  TinyModelOptions options;
  if (absl::Status s = ReadOptions(*args, options); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  const std::string out = args->Get("out");
  if (absl::Status s = WriteTinyModel(options, out); !s.ok()) {
    // Option combinations the writer rejects are still bad arguments.
    return Fail(s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1, std::string(s.message()));
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace specnode
