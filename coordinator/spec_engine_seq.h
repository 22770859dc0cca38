// Private to coordinator/spec_engine*.cc: the engine's per-sequence record and a step's
// pass per target, shared by spec_engine.cc (the step), spec_engine_accept.cc (acceptance)
// and spec_engine_route.cc (routing, shadow scoring).
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/acceptance.h"
#include "coordinator/spec_engine.h"
#include "coordinator/tree_gain.h"
#include "model/llama/sampling.h"

namespace specnode {

struct SpeculativeEngine::Seq {
  explicit Seq(const SpecRequest& r) : request(r), sampler(r.sampling) {}
  SpecRequest request;  // prompt moved into tokens
  std::vector<int32_t> tokens;
  int32_t n_prompt = 0;
  int32_t prefilled = 0;  // prompt tokens in the target cache
  Sampler sampler;
  int group = -1;
  SpecSeqStats stats;
  bool finished = false;
  bool in_run = false;  // the last step was speculative and accepted every draft
  bool parked = false;  // KV swapped out to the host tier (Park)
  // Routing (spec_engine_route.cc).
  int route_checks = 0;  // move checks done (kRouteChecks at most)
  // Per group, for shadow scoring: where its simulated run stands in `tokens` (the context
  // length of its next proposal), and whether that run's last step matched fully.
  std::vector<size_t> shadow_cursor;
  std::vector<uint8_t> shadow_in_run;
  // This step's plan.
  int k = 0;
  int32_t chunk = 0;
  std::vector<int32_t> drafts;
  std::vector<float> q;
  // A draft tree's parents ([drafts.size()], draft_tree.h), empty for a chain; then the
  // pass rows' parents and depths (row 0 the last committed token) and the kept nodes.
  std::vector<int32_t> parents;
  std::vector<int32_t> row_parents, row_depth;
  int tree_depth = 0;  // the deepest node's depth + 1: what "every draft accepted" means
  std::vector<int32_t> kept;
  bool tree() const { return !parents.empty(); }
  // Trees drafted for this sequence (verified or cut to their chain) waiting for the
  // tokens that decide what they would have kept (tree_gain.h ScoreTree).
  struct PendingTree {
    int group = 0;
    size_t position = 0;  // committed tokens when drafted
    std::vector<int32_t> tokens, parents;
  };
  std::vector<PendingTree> pending_trees;
};

// One target's share of a step.
struct SpeculativeEngine::Pass {
  ModelRunner* runner = nullptr;
  std::vector<BatchEntry> batch;
  // What the runner returns (acceptance.h HeadPlan): each row's head.k largest (`ids`,
  // `values`: ModelRunner::EndForwardArgMax / EndForwardTopK) when every sequence draws from
  // those alone, which a GPU target then keeps the logits for on the device; else (k == 0)
  // the rows (`logits`).
  HeadPlan head;
  // Instead of the rows (head.k == 0), each row's draw (ModelRunner::EndForwardDrawn with
  // `draws`, one per row; into `ids`) when every sequence's sampler prunes nothing and needs
  // no distribution (PlanDraws).
  bool drawn = false;
  std::vector<sample::DrawParams> draws;
  std::vector<float> logits;
  std::vector<int32_t> ids;
  std::vector<float> values;
  size_t tokens = 0;     // input tokens of the batch
  double seconds = 0.0;  // from the step's first BeginForward to this pass's EndForward
};

}  // namespace specnode
