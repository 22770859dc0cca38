// specnode generate: load a model, stream a completion of one prompt, report tokens/s.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/domain_router.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "model/tokenizer/chat_template.h"
#include "model/llama/llama_model.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/session/model_session.h"
#include "node/session/router_config.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode generate [--model PATH] (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
    "\n"
    "  --model PATH        GGUF file (default: $SPECNODE_MODEL or the fetch-model cache)\n"
    "  --prompt TEXT       prompt text\n"
    "  --prompt-ids IDS    prompt as comma-separated token ids (instead of --prompt)\n"
    "  --chat              wrap the prompt in the model's chat template as a user turn\n"
    "  --max-tokens N      tokens to generate (default 128)\n"
    "  --temperature T     0 = greedy (default %g)\n"
    "  --top-k K           keep the K most likely tokens, 0 = off (default %d)\n"
    "  --top-p P           nucleus sampling threshold in (0, 1], 1 = off (default %g)\n"
    "  --seed S            sampling seed (default %d); same seed, same output, the same\n"
    "                      as a ZeroMQ request with these values (docs/protocol.md)\n"
    "  --threads N         CPU threads (default: all cores available)\n"
    "  --ignore-eos        keep generating past end-of-generation tokens\n"
    "  --draft SPEC        speculative decoding with a drafter: ngram[:N] (prompt lookup,\n"
    "                      suffixes up to N tokens), suffix[:N] (frequency-ranked suffix\n"
    "                      drafting), recycle[:N] (token recycling: the model's own top-N\n"
    "                      candidates after each token), self:L (the model's first L\n"
    "                      layers), or a GGUF file with the same vocabulary (default: none)\n"
    "  --tree-nodes N      draft trees of up to N nodes (suffix, recycle, a draft model's\n"
    "                      runners-up), verified in one pass where they measure faster\n"
    "                      (default 0: chains)\n"
    "                      pass (default 0: chains)\n"
    "  --spec-k K          most tokens drafted per step (default 4); the controller adapts\n"
    "                      K in [1, K] per domain, or turns speculation off where it loses\n"
    "  --spec-fixed        always draft K tokens (no adaptation)\n"
    "  --acceptance RULE   sampled drafts: match (default: the text of a seed does not\n"
    "                      depend on the drafter) or ratio (min(1, p/q) test)\n"
    "  --domain NAME       the request's domain, for per-domain acceptance (default: from\n"
    "                      --router-rules, else \"default\")\n"
    "  --router-rules FILE JSON rules naming a prompt's domain (bench/prompts/router-rules.json)\n"
    "  --json              print a JSON summary as the last line of stdout\n"
    "  --quiet             do not stream text or show load progress\n";

absl::Status Run(const CliArgs& args) {
  const bool json = args.Has("json");
  const bool quiet = args.Has("quiet");
  SPECNODE_ASSIGN_OR_RETURN(const SamplingParams sp, SamplingFromArgs(args, kDefaultSampling));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 128, 1, 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
  if (args.Has("prompt") == args.Has("prompt-ids")) {
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-ids");
  }

  std::string domain = args.Get("domain", "");
  std::unique_ptr<DomainRouter> router;
  if (args.Has("router-rules")) {
    SPECNODE_ASSIGN_OR_RETURN(router, LoadRouterRules(args.Get("router-rules")));
  } else {
    SPECNODE_ASSIGN_OR_RETURN(router, DomainRouter::Create({}));
  }
  domain = router->Classify(domain, args.Get("prompt"));
  SPECNODE_ASSIGN_OR_RETURN(KvOptions kv, KvOptionsFromArgs(args));
  std::optional<DraftSpec> draft;
  if (args.Has("draft")) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(args.Get("draft"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--draft: ", d.status().message()));
    draft = *d;
  }
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(args.Get("model", DefaultModelPath()),
                                               static_cast<int>(threads), !quiet, kv,
                                               compute));
  const Tokenizer& tok = session->model().tokenizer();

  std::vector<int32_t> prompt;
  if (args.Has("prompt-ids")) {
    SPECNODE_ASSIGN_OR_RETURN(std::vector<int64_t> ids, args.GetIntList("prompt-ids"));
    prompt.assign(ids.begin(), ids.end());
  } else {
    SPECNODE_ASSIGN_OR_RETURN(prompt, session->EncodePrompt(args.Get("prompt"), args.Has("chat")));
  }
  // The checks every request passes (the node's too: coordinator/request_validator.h).
  SPECNODE_RETURN_IF_ERROR(session->ValidateRequest(
      prompt, max_tokens, sp,
      args.Has("domain") ? std::optional<std::string_view>(domain) : std::nullopt));

  // Every generation runs on the speculative engine; without --draft it is target-only.
  std::unique_ptr<Drafter> drafter;
  std::unique_ptr<SpecController> controller;
  std::vector<DraftGroup> groups;
  SPECNODE_ASSIGN_OR_RETURN(int64_t spec_k, args.GetInt("spec-k", 4, 1, SpecController::kMaxK));
  SpecEngineOptions options;
  options.adaptive = !args.Has("spec-fixed");
  options.fixed_k = static_cast<int>(spec_k);
  SPECNODE_ASSIGN_OR_RETURN(int64_t tree_nodes, args.GetInt("tree-nodes", 0, 0, 64));
  options.tree_nodes = static_cast<int>(tree_nodes);
  SPECNODE_ASSIGN_OR_RETURN(options.acceptance, AcceptanceFromArgs(args));
  if (draft.has_value() && !draft->none()) {
    SPECNODE_ASSIGN_OR_RETURN(drafter, MakeDrafter(*draft, session->model(), session->pool(), kv));
    SpecControllerConfig cc;
    cc.k_max = static_cast<int>(spec_k);
    cc.k_initial = std::min(cc.k_max, 4);
    cc.probe_k = std::min(cc.probe_k, cc.k_max);
    SPECNODE_ASSIGN_OR_RETURN(controller, SpecController::Create(cc));
    groups.push_back({drafter.get(), controller.get()});
  }
  const std::vector<int32_t> eog = tok.EndOfGenerationIds();
  options.stop_tokens.insert(eog.begin(), eog.end());
  SpeculativeEngine engine(&session->runner(), groups, options);

  SpecRequest request;
  request.id = 0;
  request.prompt = prompt;
  request.sampling = sp;
  request.max_new_tokens = static_cast<int32_t>(max_tokens);
  request.domain = domain;
  request.ignore_stop = args.Has("ignore-eos");
  SPECNODE_RETURN_IF_ERROR(engine.Start(request));

  Utf8StreamDecoder utf8;
  std::string text;
  std::vector<int32_t> generated;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto t1 = t0;
  std::vector<SeqStepResult> results;
  const SeqId ids[] = {request.id};
  while (true) {
    const bool prefilling = engine.Prefilling(request.id);
    SPECNODE_RETURN_IF_ERROR(engine.Step(ids, &results));
    // The first token comes from the prefill's logits: decode timing starts after it.
    if (prefilling) t1 = Clock::now();
    for (int32_t t : results[0].tokens) {
      generated.push_back(t);
      std::string piece = utf8.Push(tok.TokenToBytes(t));
      text += piece;
      if (!quiet) std::fwrite(piece.data(), 1, piece.size(), stdout);
    }
    if (!quiet) std::fflush(stdout);
    if (results[0].finish != FinishReason::kNone) break;
  }
  auto t2 = Clock::now();
  const SpecSeqStats stats = engine.Stats(request.id);
  const std::string kv_summary = session->KvSummary(request.id);  // before its KV is freed
  engine.Finish(request.id);
  std::string tail = utf8.Flush();
  text += tail;
  if (!quiet) std::printf("%s\n", tail.c_str());

  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  // The first generated token comes from the prefill's logits; decode steps = n - 1.
  const double decode_steps = generated.empty() ? 0.0 : generated.size() - 1.0;
  const double prompt_tps = prompt.size() / std::max(prefill_s, 1e-9);
  const double decode_tps = decode_steps / std::max(decode_s, 1e-9);
  std::fprintf(stderr,
               "\nprompt: %zu tokens, %.1f tokens/s | decode: %zu tokens, %.1f tokens/s | "
               "%lld threads, %s kernels\n",
               prompt.size(), prompt_tps, generated.size(), decode_tps,
               static_cast<long long>(threads), session->kernel_name().c_str());
  const double tokens_per_pass =
      stats.steps == 0 ? 0.0 : static_cast<double>(generated.size() - 1) / stats.steps;
  const double acceptance = stats.drafted == 0 ? 0.0 : double(stats.accepted) / stats.drafted;
  if (drafter != nullptr) {
    const DomainSnapshot snap = controller->Snapshot(domain);
    std::fprintf(stderr,
                 "speculation (%s, domain %s): %d of %d drafts accepted (%.1f%%), %.2f tokens "
                 "per target pass (%d passes, %d speculative), next K %d (%s)\n",
                 drafter->name().c_str(), domain.c_str(), stats.accepted, stats.drafted,
                 100.0 * acceptance, tokens_per_pass, stats.steps, stats.spec_steps, snap.k,
                 std::string(SpecModeName(snap.mode)).c_str());
  }
  if (!kv_summary.empty()) std::fprintf(stderr, "%s\n", kv_summary.c_str());
  if (json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["generated_ids"] = generated;
    j["text"] = text;
    j["prompt_tokens_per_s"] = prompt_tps;
    j["decode_tokens_per_s"] = decode_tps;
    j["threads"] = threads;
    j["drafter"] = drafter ? drafter->name() : "";
    j["domain"] = domain;
    j["drafted"] = stats.drafted;
    j["accepted"] = stats.accepted;
    j["acceptance"] = acceptance;
    j["target_passes"] = stats.steps;
    j["tokens_per_pass"] = tokens_per_pass;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  return RunModelCommand(
      "generate",
      absl::StrFormat(kHelp, kDefaultSampling.temperature, kDefaultSampling.top_k,
                      kDefaultSampling.top_p, static_cast<int>(kDefaultSampling.seed)),
      argc, argv,
      {"model", "prompt", "prompt-ids", "max-tokens", "temperature", "top-k", "top-p", "seed",
       "threads", "draft", "spec-k", "tree-nodes", "domain", "router-rules", "acceptance"},
      {"chat", "ignore-eos", "json", "quiet", "spec-fixed"}, Run);
}

}  // namespace specnode
