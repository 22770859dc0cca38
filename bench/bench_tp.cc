// bench_tp: tokens/s and bytes exchanged per token versus tensor-parallel size, on CPU.
//
//   bench_tp [--model PATH] [--tp 1,2,3] [--threads-per-rank N] [--prompt-tokens 64]
//            [--decode-tokens 32] [--json]
//       in one process: LocalTpTarget (T shard threads + LocalCommunicator) per TP size.
//   mpirun -np T --oversubscribe --mca mpi_yield_when_idle 1 bench_tp --mpi [...]
//       T processes, one shard each, MpiCommunicator over MPI_COMM_WORLD; rank 0 reports.
//
// Per TP size: prefill tokens/s (one batch of --prompt-tokens), decode tokens/s (greedy,
// one token per step), payload bytes each rank sends per decoded token and per prefill
// token (Communicator::bytes_sent convention: an all-gather exchange of the partial sums),
// and the number of all-reduces per token (2 per layer). A size the model cannot take
// (ShardPlan) is reported with its error. One line of JSON per size with --json.
// Model: --model, else $SPECNODE_MODEL.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "model/llama/cpu_forward.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/llama_model.h"
#include "tensor-parallel/local_tp_target.h"
#include "tensor-parallel/shard_plan.h"
#ifdef SPECNODE_HAVE_MPI
#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_communicator.h"
#endif

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  std::vector<int> tp = {1, 2, 3};
  int threads_per_rank = 1;
  int prompt_tokens = 64;
  int decode_tokens = 32;
  bool json = false;
  bool mpi = false;
};

struct Result {
  int tp = 0;
  std::string error;
  double prefill_tok_s = 0, decode_tok_s = 0;
  double bytes_per_decode_token = 0, bytes_per_prefill_token = 0;  // per rank
  int allreduce_per_token = 0;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int32_t> PromptIds(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (i * 7919) % 20000;  // arbitrary, fixed
  return ids;
}

int Argmax(const std::vector<float>& v, size_t off, int vocab) {
  return static_cast<int>(std::max_element(v.begin() + off, v.begin() + off + vocab) -
                          (v.begin() + off));
}

// Runs prefill + greedy decode through `step(batch, logits)`; `bytes()` reads one rank's
// bytes sent so far.
template <typename Step, typename Bytes>
Result Measure(int tp, int vocab, int n_layers, const Args& a, Step step, Bytes bytes) {
  Result r;
  r.tp = tp;
  r.allreduce_per_token = tp > 1 ? 2 * n_layers : 0;
  std::vector<int32_t> prompt = PromptIds(a.prompt_tokens);
  std::vector<float> logits;
  const int64_t b0 = bytes();
  auto t0 = Clock::now();
  absl::Status s = step(std::vector<BatchEntry>{{1, prompt, false}}, &logits);
  auto t1 = Clock::now();
  if (!s.ok()) {
    r.error = s.ToString();
    return r;
  }
  const int64_t b1 = bytes();
  int32_t tok = Argmax(logits, 0, vocab);
  for (int i = 0; i < a.decode_tokens && s.ok(); ++i) {
    s = step(std::vector<BatchEntry>{{1, std::span<const int32_t>(&tok, 1), false}}, &logits);
    tok = Argmax(logits, 0, vocab);
  }
  auto t2 = Clock::now();
  if (!s.ok()) r.error = s.ToString();
  r.prefill_tok_s = a.prompt_tokens / Seconds(t0, t1);
  r.decode_tok_s = a.decode_tokens / Seconds(t1, t2);
  r.bytes_per_prefill_token = static_cast<double>(b1 - b0) / a.prompt_tokens;
  r.bytes_per_decode_token = static_cast<double>(bytes() - b1) / a.decode_tokens;
  return r;
}

void Print(const Result& r, const Args& a, const char* comm) {
  if (a.json) {
    std::printf(
        "{\"comm\":\"%s\",\"tp\":%d,\"threads_per_rank\":%d,\"prompt_tokens\":%d,"
        "\"decode_tokens\":%d,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,"
        "\"bytes_per_decode_token_per_rank\":%.0f,\"bytes_per_prefill_token_per_rank\":%.0f,"
        "\"allreduce_per_token\":%d,\"error\":\"%s\"}\n",
        comm, r.tp, a.threads_per_rank, a.prompt_tokens, a.decode_tokens, r.prefill_tok_s,
        r.decode_tok_s, r.bytes_per_decode_token, r.bytes_per_prefill_token, r.allreduce_per_token,
        r.error.c_str());
  } else if (!r.error.empty()) {
    std::printf("%-5s TP %d: %s\n", comm, r.tp, r.error.c_str());
  } else {
    std::printf(
        "%-5s TP %d  threads/rank %d  prefill %7.1f tok/s  decode %6.1f tok/s  "
        "sent/rank %7.0f B per decode token, %7.0f B per prefill token  (%d all-reduces/token)\n",
        comm, r.tp, a.threads_per_rank, r.prefill_tok_s, r.decode_tok_s, r.bytes_per_decode_token,
        r.bytes_per_prefill_token, r.allreduce_per_token);
  }
  std::fflush(stdout);
}

int RunLocal(const Args& a) {
  for (int tp : a.tp) {
    LocalTpTargetOptions o;
    o.tp_size = tp;
    o.threads_per_rank = a.threads_per_rank;
    o.comm.timeout_s = 60;
    auto target = LocalTpTarget::Load(a.model, o);
    if (!target.ok()) {
      Result r;
      r.tp = tp;
      r.error = std::string(target.status().message());
      Print(r, a, "local");
      continue;
    }
    LocalTpTarget& t = **target;
    // Warm-up step, then a fresh sequence is measured.
    std::vector<float> logits;
    const int32_t warm = 100;
    (void)t.Forward(std::vector<BatchEntry>{{99, std::span<const int32_t>(&warm, 1), false}},
                    &logits);
    t.Free(99);
    Result r = Measure(
        tp, t.config().vocab_size, t.config().n_layers, a,
        [&](std::vector<BatchEntry> b, std::vector<float>* l) { return t.Forward(b, l); },
        [&] { return t.bytes_sent() / tp; });
    Print(r, a, "local");
  }
  return 0;
}

#ifdef SPECNODE_HAVE_MPI
int RunMpi(Args a, int argc, char** argv) {
  auto env = MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "bench_tp: %s\n", env.status().ToString().c_str());
    return 1;
  }
  const int rank = (*env)->world_rank(), tp = (*env)->world_size();
  auto fail = [&](const absl::Status& s) {
    if (rank == 0) {
      Result r;
      r.tp = tp;
      r.error = std::string(s.message());
      Print(r, a, "mpi");
    }
    return 1;
  };
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD, {.timeout_s = 60});
  if (!comm.ok()) return fail(comm.status());
  auto file = GgufFile::Open(a.model);
  if (!file.ok()) return fail(file.status());
  auto config = LlamaConfig::FromGguf(**file);
  if (!config.ok()) return fail(config.status());
  auto plan = ShardPlan::Create(*config, tp);
  if (!plan.ok()) return fail(plan.status());
  LoadOptions lo;
  lo.shard = plan->Spec(rank);
  auto model = LlamaModel::Load(a.model, lo);
  if (!model.ok()) return fail(model.status());
  const LlamaConfig& c = (*model)->config();
  ThreadPool pool(a.threads_per_rank);
  CommunicatorReducer reducer(comm->get());
  CpuLlamaForward fwd(c, (*model)->weights(), &pool, tp > 1 ? &reducer : nullptr);
  DenseKvCache cache(c.n_layers, (*model)->weights().n_kv_heads_local, c.head_dim,
                     (*model)->weights().kv_heads_held().gqa_group, c.context_length, 4096);
  std::vector<float> logits;
  const int32_t warm = 100;
  (void)fwd.Forward(std::vector<BatchEntry>{{99, std::span<const int32_t>(&warm, 1), false}},
                    &cache, &logits);
  cache.Free(99);
  (void)(*comm)->Barrier();
  Result r = Measure(
      tp, c.vocab_size, c.n_layers, a,
      [&](std::vector<BatchEntry> b, std::vector<float>* l) { return fwd.Forward(b, &cache, l); },
      [&] { return (*comm)->bytes_sent(); });
  if (rank == 0) Print(r, a, "mpi");
  (void)(*comm)->Barrier();
  comm->reset();
  return r.error.empty() ? 0 : 1;
}
#endif

int Main(int argc, char** argv) {
  Args a;
  if (const char* m = std::getenv("SPECNODE_MODEL")) a.model = m;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    auto int_value = [&](int* out) {
      if (!absl::SimpleAtoi(value(), out)) {
        std::fprintf(stderr, "bench_tp: %s takes an integer\n", arg.c_str());
        std::exit(2);
      }
    };
    if (arg == "--model") {
      a.model = value();
    } else if (arg == "--tp") {
      a.tp.clear();
      for (absl::string_view p : absl::StrSplit(value(), ',')) {
        int t = 0;
        if (!absl::SimpleAtoi(p, &t)) {
          std::fprintf(stderr, "bench_tp: --tp takes a list like 1,2,3\n");
          return 2;
        }
        a.tp.push_back(t);
      }
    } else if (arg == "--threads-per-rank") {
      int_value(&a.threads_per_rank);
    } else if (arg == "--prompt-tokens") {
      int_value(&a.prompt_tokens);
    } else if (arg == "--decode-tokens") {
      int_value(&a.decode_tokens);
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg == "--mpi") {
      a.mpi = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: bench_tp [--model PATH] [--tp 1,2,3] [--threads-per-rank N]\n"
          "                [--prompt-tokens N] [--decode-tokens N] [--json] [--mpi]\n"
          "  --mpi: run under mpirun -np T; TP = the number of processes\n");
      return 0;
    } else {
      std::fprintf(stderr, "bench_tp: unknown option %s (see --help)\n", arg.c_str());
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "bench_tp: no model (--model PATH or SPECNODE_MODEL)\n");
    return 2;
  }
  if (a.prompt_tokens < 1 || a.decode_tokens < 1 || a.threads_per_rank < 1) {
    std::fprintf(stderr, "bench_tp: token and thread counts must be >= 1\n");
    return 2;
  }
  if (a.mpi) {
#ifdef SPECNODE_HAVE_MPI
    return RunMpi(a, argc, argv);
#else
    std::fprintf(stderr, "bench_tp: built without MPI\n");
    return 2;
#endif
  }
  return RunLocal(a);
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
