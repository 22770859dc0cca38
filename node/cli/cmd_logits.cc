// specnode logits: run one forward pass over a token list and write every position's
// logits as raw little-endian float32 [n_tokens, vocab] (no header) for the oracle tests.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/session/model_session.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode logits [--model PATH] --tokens 1,2,3 --out FILE [--threads N]\n"
    "       [--chunk N]\n"
    "Writes float32 [n_tokens, vocab] logits of every position to FILE. --chunk N feeds the\n"
    "tokens N at a time through the KV cache (default: all in one pass).\n";

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(std::vector<int64_t> ids64, args.GetIntList("tokens"));
  if (!args.Has("out")) return absl::InvalidArgumentError("--out is required");
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
  SPECNODE_ASSIGN_OR_RETURN(int64_t chunk, args.GetInt("chunk", 1 << 30, 1, 1 << 30));
  SPECNODE_ASSIGN_OR_RETURN(KvOptions kv, KvOptionsFromArgs(args));
  // Oracle comparisons default to the f32 reference cache on the CPU; a GPU keeps its pages
  // (auto: f16), and refuses dense.
  if (!args.Has("kv-mode") && compute.device.is_cpu()) kv.mode = KvMode::kDense;
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(args.Get("model", DefaultModelPath()),
                                               static_cast<int>(threads), false, kv,
                                               compute));
  std::vector<int32_t> ids(ids64.begin(), ids64.end());
  SPECNODE_RETURN_IF_ERROR(session->ValidateRequest(ids, 1));
  std::vector<float> all, logits;
  for (size_t begin = 0; begin < ids.size(); begin += chunk) {
    const size_t count = std::min<size_t>(chunk, ids.size() - begin);
    BatchEntry entry{0, std::span<const int32_t>(ids).subspan(begin, count), true};
    SPECNODE_RETURN_IF_ERROR(session->runner().Forward({&entry, 1}, &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  const std::string path = args.Get("out");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
  const size_t written = std::fwrite(all.data(), sizeof(float), all.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != all.size() || !closed)
    return absl::InternalError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

}  // namespace

int RunLogits(int argc, char** argv) {
  return RunModelCommand("logits", kHelp, argc, argv,
                         {"model", "tokens", "out", "threads", "chunk"}, {}, Run);
}

}  // namespace specnode
