// specnode kv-eval: what each KV precision mode costs in accuracy and saves in bytes, on
// real text. Every mode runs in lockstep over the same texts (teacher forcing: a short
// prefill, then one token at a time, so tokens leave the recent window as in a real
// decode), batched across texts. Reported per mode: KV bytes per token (pages actually
// held, at the end of each text), perplexity of the held text, mean KL divergence of the
// next-token distribution from the full-precision (f16) store's, and greedy agreement
// over `--generate` tokens generated after each text.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/runner_factory.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/session/model_session.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode kv-eval [--model PATH] --texts FILE[,FILE...] [--modes full,int8,int4,mixed]\n"
    "       [--max-tokens N] [--prefill N] [--generate N] [--threads N] [--json]\n"
    "Compares KV cache precision modes on the texts against 'full' (f16, always run as the\n"
    "reference), on --device (a mode the device cannot store is refused).\n";

// log-softmax of logits[vocab] into out.
void LogSoftmax(std::span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  double max = logits[0];
  for (float v : logits) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lse;
}

struct ModeStats {
  std::string mode;
  ModelRunner* runner = nullptr;  // the session's own for full, else one of its own
  std::unique_ptr<ModelRunner> owned;
  double nll = 0, kl = 0;
  int64_t scored = 0;
  double bytes_per_token_sum = 0;  // averaged over texts
  int64_t agree = 0, generated = 0;
  std::array<int64_t, kKvClasses> tokens{};
};

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 2048, 16, 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(int64_t prefill, args.GetInt("prefill", 32, 1, 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(int64_t n_generate, args.GetInt("generate", 128, 0, 1 << 16));
  SPECNODE_ASSIGN_OR_RETURN(KvOptions kv, KvOptionsFromArgs(args));
  if (!args.Has("texts")) return absl::InvalidArgumentError("--texts is required");
  std::vector<KvMode> modes = {KvMode::kFull};
  for (absl::string_view m :
       absl::StrSplit(args.Get("modes", "int8,int4,mixed"), ',', absl::SkipEmpty())) {
    absl::StatusOr<KvMode> mode = ParseKvMode(std::string(m));
    if (!mode.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--modes: ", mode.status().message()));
    }
    if (*mode != KvMode::kFull) modes.push_back(*mode);
  }
  // Every mode's runner comes from the one factory on --device: what the device cannot
  // store is refused before the weights load. The session's own runner is the reference.
  RunnerOptions ro;
  ro.device = compute.device;
  ro.activations = compute.activations;
  // The mixed policy's options (a byte budget, the cold tier) apply to mixed only; the
  // other modes store every token in one class.
  auto options_for = [&kv](KvMode mode) {
    KvOptions o = kv;
    o.mode = mode;
    if (mode != KvMode::kMixed) o.bytes_per_token = 0;
    return o;
  };
  for (KvMode mode : modes) {
    ro.kv = options_for(mode);
    SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(ro));
  }
  const KvOptions reference = options_for(KvMode::kFull);
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(args.Get("model", DefaultModelPath()),
                                               static_cast<int>(threads), false, reference,
                                               compute));
  const LlamaModel& model = session->model();
  ro.pool = session->pool();
  const int vocab = model.config().vocab_size;

  std::vector<std::vector<int32_t>> texts;
  std::vector<std::string> names;
  for (absl::string_view path : absl::StrSplit(args.Get("texts"), ',', absl::SkipEmpty())) {
    std::ifstream in{std::string(path)};
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", std::string(path)));
    std::stringstream ss;
    ss << in.rdbuf();
    SPECNODE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, model.tokenizer().Encode(ss.str(), false));
    if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
    if (static_cast<int64_t>(ids.size()) <= prefill + 1) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(path), " is too short"));
    }
    SPECNODE_RETURN_IF_ERROR(session->ValidateRequest(ids, std::max<int64_t>(1, n_generate)));
    texts.push_back(std::move(ids));
    names.emplace_back(path);
  }
  std::vector<ModeStats> stats(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    stats[m].mode = std::string(KvModeName(modes[m]));
    if (m == 0) {
      stats[m].runner = &session->runner();
      continue;
    }
    ro.kv = options_for(modes[m]);
    SPECNODE_ASSIGN_OR_RETURN(stats[m].owned, MakeRunner(model.config(), model.weights(), ro));
    stats[m].runner = stats[m].owned.get();
  }

  // Teacher forcing. Step 0 prefills `prefill` tokens; each later step feeds one token.
  const auto t0 = std::chrono::steady_clock::now();
  size_t longest = 0;
  for (const auto& t : texts) longest = std::max(longest, t.size());
  std::vector<std::vector<float>> logits(modes.size());
  std::vector<double> ref_lp, lp;
  for (size_t pos = prefill; pos <= longest; ++pos) {
    // Texts whose next token (at index pos) exists are fed up to pos - 1 and scored on pos.
    std::vector<size_t> active;
    for (size_t i = 0; i < texts.size(); ++i) {
      if (pos < texts[i].size()) active.push_back(i);
    }
    if (active.empty()) break;
    for (size_t m = 0; m < modes.size(); ++m) {
      std::vector<BatchEntry> batch;
      for (size_t i : active) {
        const size_t begin = pos == static_cast<size_t>(prefill) ? 0 : pos - 1;
        batch.push_back({static_cast<SeqId>(i),
                         std::span<const int32_t>(texts[i]).subspan(begin, pos - begin), false});
      }
      SPECNODE_RETURN_IF_ERROR(stats[m].runner->Forward(batch, &logits[m]));
    }
    for (size_t a = 0; a < active.size(); ++a) {
      const int32_t target = texts[active[a]][pos];
      for (size_t m = 0; m < modes.size(); ++m) {
        LogSoftmax(std::span<const float>(logits[m]).subspan(a * vocab, vocab),
                   m == 0 ? &ref_lp : &lp);
        const std::vector<double>& mine = m == 0 ? ref_lp : lp;
        stats[m].nll -= mine[target];
        ++stats[m].scored;
        if (m == 0) continue;
        double kl = 0;
        for (int v = 0; v < vocab; ++v) kl += std::exp(ref_lp[v]) * (ref_lp[v] - lp[v]);
        stats[m].kl += kl;
      }
    }
  }
  // Bytes per token at the end of each text (teacher forcing complete), then greedy.
  for (auto& s : stats) {
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto t = s.runner->SequenceTokens(static_cast<SeqId>(i));
      if (!t.has_value()) continue;
      for (int c = 0; c < kKvClasses; ++c) s.tokens[c] += (*t)[c];
    }
    if (const std::optional<ModelRunner::KvMemory> m = s.runner->Memory()) {
      int64_t total = 0;
      for (const auto& t : texts) total += static_cast<int64_t>(t.size()) - 1;
      s.bytes_per_token_sum = static_cast<double>(m->used_bytes) / total;
    }
  }
  // Greedy continuation: every mode generates from its own cache; compare with full's.
  std::vector<std::vector<int32_t>> next(modes.size(), std::vector<int32_t>(texts.size()));
  std::vector<std::vector<int32_t>> ref_tokens(texts.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    for (size_t i = 0; i < texts.size(); ++i) next[m][i] = texts[i].back();
  }
  for (int64_t g = 0; g < n_generate; ++g) {
    for (size_t m = 0; m < modes.size(); ++m) {
      std::vector<BatchEntry> batch;
      for (size_t i = 0; i < texts.size(); ++i) {
        batch.push_back({static_cast<SeqId>(i), std::span<const int32_t>(&next[m][i], 1), false});
      }
      SPECNODE_RETURN_IF_ERROR(stats[m].runner->Forward(batch, &logits[m]));
      for (size_t i = 0; i < texts.size(); ++i) {
        next[m][i] = ArgMax(std::span<const float>(logits[m]).subspan(i * vocab, vocab));
        if (m == 0)
          ref_tokens[i].push_back(next[m][i]);
        else {
          stats[m].agree += next[m][i] == ref_tokens[i].back();
          ++stats[m].generated;
        }
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  nlohmann::json out;
  out["model"] = args.Get("model", DefaultModelPath());
  out["texts"] = names;
  int64_t total_tokens = 0;
  for (const auto& t : texts) total_tokens += static_cast<int64_t>(t.size());
  out["tokens"] = total_tokens;
  out["seconds"] = seconds;
  out["window"] = kv.window_tokens;
  out["sinks"] = kv.sink_tokens;
  out["critical_threshold"] = kv.critical_threshold;
  out["cold_threshold"] = kv.cold_threshold;
  out["bytes_per_token_budget"] = kv.bytes_per_token;
  out["budget_rank"] = std::string(KvBudgetRankName(kv.budget_rank));
  const double ref_ppl = std::exp(stats[0].nll / stats[0].scored);
  std::printf("%-6s %12s %10s %9s %12s %10s %22s\n", "mode", "KV B/token", "vs full", "ppl",
              "ppl change", "mean KL", "greedy agreement");
  for (const auto& s : stats) {
    const double ppl = std::exp(s.nll / s.scored);
    const double kl = s.mode == "full" ? 0.0 : s.kl / s.scored;
    const double agree = s.generated == 0 ? 1.0 : static_cast<double>(s.agree) / s.generated;
    const double ratio =
        s.bytes_per_token_sum > 0 ? stats[0].bytes_per_token_sum / s.bytes_per_token_sum : 0;
    std::printf("%-6s %12.0f %9.2fx %9.4f %+11.3f%% %10.5f %21.1f%%\n", s.mode.c_str(),
                s.bytes_per_token_sum, ratio, ppl, 100.0 * (ppl / ref_ppl - 1.0), kl,
                100.0 * agree);
    out["modes"].push_back({{"mode", s.mode},
                            {"kv_bytes_per_token", s.bytes_per_token_sum},
                            {"bytes_ratio_vs_full", ratio},
                            {"perplexity", ppl},
                            {"perplexity_change", ppl / ref_ppl - 1.0},
                            {"mean_kl", kl},
                            {"greedy_agreement", agree},
                            {"tokens_f16", s.tokens[0]},
                            {"tokens_int8", s.tokens[1]},
                            {"tokens_int4", s.tokens[2]},
                            {"tokens_int2", s.tokens[3]}});
  }
  if (args.Has("json")) std::printf("%s\n", out.dump().c_str());
  return absl::OkStatus();
}

}  // namespace

int RunKvEval(int argc, char** argv) {
  return RunModelCommand(
      "kv-eval", kHelp, argc, argv,
      {"model", "texts", "modes", "max-tokens", "prefill", "generate", "threads"}, {"json"}, Run);
}

}  // namespace specnode
