// Private to coordinator/spec_engine*.cc: the engine's per-sequence record, shared by
// spec_engine.cc (the step) and spec_engine_route.cc (routing, shadow scoring).
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/spec_engine.h"
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
};

}  // namespace specnode
