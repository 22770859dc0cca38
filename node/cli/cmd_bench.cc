// specnode bench: prefill and decode throughput of the CPU engine at several batch sizes,
// on random (seeded) token ids. Each batch size gets a fresh cache: B sequences of P
// prompt tokens are prefilled in one batched pass, then D decode steps feed B tokens each.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "model/cpu/cpu_matmul.h"
#include "model/gguf/ggml_converted_types.h"
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
    "usage: specnode bench [--model PATH] [--threads N] [--batch 1,4,16]\n"
    "       [--prompt-tokens P] [--decode-tokens D] [--repeats R] [--verify 2,4,8] [--json]\n"
    "Reports prefill and decode tokens/s per batch size (best of R repeats, default 1).\n"
    "--verify K,...: the cost of a speculative verification pass of K + 1 tokens on one\n"
    "sequence after P prompt tokens (D passes, each rolled back to one accepted token),\n"
    "against a one-token step: ms per pass and per extra row (the engine's draft cost).\n";

struct Result {
  int64_t batch;
  double prefill_tps;
  double decode_tps;
};

absl::StatusOr<Result> RunBatch(ModelSession& s, int64_t batch, int64_t prompt_tokens,
                                int64_t decode_tokens, uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  const int32_t vocab = s.model().config().vocab_size;
  Rng rng(seed);
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(prompt_tokens));
  for (auto& p : prompts) {
    for (int32_t& t : p) t = static_cast<int32_t>(rng.Next() % vocab);
  }
  std::vector<BatchEntry> entries(batch);
  for (int64_t b = 0; b < batch; ++b) entries[b] = {1000 + b, prompts[b], false};
  std::vector<float> logits;
  auto t0 = Clock::now();
  SPECNODE_RETURN_IF_ERROR(s.runner().Forward(entries, &logits));
  auto t1 = Clock::now();
  std::vector<int32_t> next(batch);
  for (int64_t step = 0; step < decode_tokens; ++step) {
    for (int64_t b = 0; b < batch; ++b) {
      next[b] = ArgMax(std::span<const float>(logits).subspan(b * vocab, vocab));
      entries[b].tokens = std::span<const int32_t>(&next[b], 1);
    }
    SPECNODE_RETURN_IF_ERROR(s.runner().Forward(entries, &logits));
  }
  auto t2 = Clock::now();
  for (int64_t b = 0; b < batch; ++b) s.runner().Free(1000 + b);
  Result r;
  r.batch = batch;
  r.prefill_tps = batch * prompt_tokens / std::chrono::duration<double>(t1 - t0).count();
  r.decode_tps = batch * decode_tokens / std::chrono::duration<double>(t2 - t1).count();
  return r;
}

// Mean seconds of a pass of `rows` tokens on one sequence of `prompt_tokens` context, each
// pass followed by a rollback that keeps one new token (as a speculative step with every
// draft rejected), over `passes` passes.
absl::StatusOr<double> VerifyPassSeconds(ModelSession& s, int64_t prompt_tokens, int64_t rows,
                                         int64_t passes) {
  using Clock = std::chrono::steady_clock;
  const int32_t vocab = s.model().config().vocab_size;
  Rng rng(7);
  std::vector<int32_t> prompt(prompt_tokens);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.Next() % vocab);
  const SeqId seq = 5000;
  std::vector<float> logits;
  BatchEntry entry{seq, prompt, false};
  SPECNODE_RETURN_IF_ERROR(s.runner().Forward({&entry, 1}, &logits));
  std::vector<int32_t> tokens(rows);
  double total = 0.0;
  for (int64_t p = 0; p < passes; ++p) {
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.Next() % vocab);
    const int32_t before = s.runner().Length(seq);
    entry = {seq, tokens, rows > 1};
    const auto t0 = Clock::now();
    SPECNODE_RETURN_IF_ERROR(s.runner().Forward({&entry, 1}, &logits));
    total += std::chrono::duration<double>(Clock::now() - t0).count();
    SPECNODE_RETURN_IF_ERROR(s.runner().Truncate(seq, before + 1));
  }
  s.runner().Free(seq);
  return total / static_cast<double>(passes);
}

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
  SPECNODE_ASSIGN_OR_RETURN(int64_t prompt_tokens, args.GetInt("prompt-tokens", 128, 1, 1 << 16));
  SPECNODE_ASSIGN_OR_RETURN(int64_t decode_tokens, args.GetInt("decode-tokens", 64, 1, 1 << 16));
  SPECNODE_ASSIGN_OR_RETURN(int64_t repeats, args.GetInt("repeats", 1, 1, 100));
  SPECNODE_ASSIGN_OR_RETURN(std::vector<int64_t> batches, args.GetIntList("batch"));
  if (batches.empty()) batches = {1, 4, 16};
  SPECNODE_ASSIGN_OR_RETURN(std::vector<int64_t> verify, args.GetIntList("verify"));
  for (int64_t k : verify) {
    if (k < 1 || k > 64) return absl::InvalidArgumentError("--verify K must be in [1, 64]");
  }
  for (int64_t b : batches) {
    if (b < 1 || b > 256) return absl::InvalidArgumentError("--batch sizes must be in [1, 256]");
  }
  SPECNODE_ASSIGN_OR_RETURN(KvOptions kv, KvOptionsFromArgs(args));
  if (!args.Has("kv-capacity-mb")) kv.capacity_bytes = int64_t{4} << 30;
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> s,
                            ModelSession::Open(args.Get("model", DefaultModelPath()),
                                               static_cast<int>(threads), false, kv,
                                               compute));
  SPECNODE_RETURN_IF_ERROR(s->ValidateRequest(std::vector<int32_t>(prompt_tokens, 0), decode_tokens));
  // Warm-up: touches code paths and scratch buffers once.
  SPECNODE_RETURN_IF_ERROR(RunBatch(*s, 1, 8, 4, 99).status());
  nlohmann::json results = nlohmann::json::array();
  for (int64_t b : batches) {
    Result best{b, 0.0, 0.0};
    for (int64_t r = 0; r < repeats; ++r) {
      SPECNODE_ASSIGN_OR_RETURN(Result res, RunBatch(*s, b, prompt_tokens, decode_tokens, 1 + r));
      best.prefill_tps = std::max(best.prefill_tps, res.prefill_tps);
      best.decode_tps = std::max(best.decode_tps, res.decode_tps);
    }
    std::fprintf(stderr, "batch %3lld: prefill %8.1f tokens/s, decode %8.1f tokens/s\n",
                 static_cast<long long>(b), best.prefill_tps, best.decode_tps);
    results.push_back({{"batch", b},
                       {"prefill_tokens_per_s", best.prefill_tps},
                       {"decode_tokens_per_s", best.decode_tps}});
  }
  nlohmann::json verify_results = nlohmann::json::array();
  if (!verify.empty()) {
    SPECNODE_RETURN_IF_ERROR(
        s->ValidateRequest(std::vector<int32_t>(prompt_tokens, 0), decode_tokens + 65));
    SPECNODE_ASSIGN_OR_RETURN(const double one,
                              VerifyPassSeconds(*s, prompt_tokens, 1, decode_tokens));
    for (int64_t k : verify) {
      SPECNODE_ASSIGN_OR_RETURN(const double pass,
                                VerifyPassSeconds(*s, prompt_tokens, k + 1, decode_tokens));
      const double per_row = (pass - one) / static_cast<double>(k);
      std::fprintf(stderr,
                   "verify K=%2lld: %6.2f ms per pass, one-token step %5.2f ms, %5.2f ms per "
                   "extra row (%.2f of a step)\n",
                   static_cast<long long>(k), pass * 1e3, one * 1e3, per_row * 1e3, per_row / one);
      verify_results.push_back({{"k", k},
                                {"pass_s", pass},
                                {"one_token_step_s", one},
                                {"per_extra_row_s", per_row}});
    }
  }
  if (args.Has("json")) {
    nlohmann::json j;
    j["model"] = args.Get("model", DefaultModelPath());
    j["threads"] = threads;
    j["kernels"] = s->kernel_name();
    j["kv_mode"] = std::string(KvModeName(kv.mode));
    j["activations"] = ActivationsName(compute);
    j["device"] = compute.device.name();
    j["prompt_tokens"] = prompt_tokens;
    j["decode_tokens"] = decode_tokens;
    j["results"] = results;
    if (!verify.empty()) j["verify"] = verify_results;
    // What one token costs the matmuls (every layer's matrices and the head; the embedding
    // lookup reads one row): bytes of weights read and multiply-adds, so a report can state
    // its fraction of the machine's bandwidth and compute limits (bench/bench_decode.py).
    // The bytes are what the kernels read: on the CPU the packed or converted copies
    // (MatMulReadBytes), on a GPU the compute type's rows.
    const LlamaWeights& w = s->model().weights();
    int64_t bytes = 0, macs = 0;
    auto add = [&](const WeightView& m) {
      bytes += compute.device.is_cpu()
                   ? MatMulReadBytes(m, compute.activations.value_or(ActQuant::kInt16))
                   : m.rows * static_cast<int64_t>(GgmlRowBytes(ComputeTypeOf(m.type), m.cols));
      macs += m.rows * m.cols;
    };
    for (const LayerWeights& l : w.layers) {
      for (const WeightView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*m);
    }
    add(w.output);
    j["matmul_bytes_per_token"] = bytes;
    j["matmul_macs_per_token"] = macs;
    std::printf("%s\n", j.dump().c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunBench(int argc, char** argv) {
  return RunModelCommand("bench", kHelp, argc, argv,
                         {"model", "threads", "batch", "prompt-tokens", "decode-tokens", "repeats",
                          "verify"},
                         {"json"}, Run);
}

}  // namespace specnode
