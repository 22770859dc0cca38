// SmolLM2 split over 3 MPI processes (`mpirun -np 3`, see tests/CMakeLists.txt): each
// process loads shard r of ShardPlan(3) and runs LlamaForward with a CommunicatorReducer
// over MpiCommunicator. World rank 0 then checks the logits against
//   - one process, unsharded: max |diff| < 3e-2 (as tp_forward_test; it prints the value);
//   - LocalTpTarget with TP 3 in this process: bit-identical, since MpiCommunicator and
//     LocalCommunicator both sum partial results in rank order.
// Exits 77 (skipped) on every rank when SPECNODE_MODEL is unset, unless
// SPECNODE_REQUIRE_MODEL=1 (then 1).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/llama/cpu_forward.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/llama_model.h"
#include "tensor-parallel/local_tp_target.h"
#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_communicator.h"
#include "tensor-parallel/shard_plan.h"
#include "tests/tensor-parallel/mpi_test_util.h"

namespace specnode {
namespace {

constexpr double kTolerance = 3e-2;
constexpr int kTp = 3;

int Argmax(const std::vector<float>& v, size_t off, int vocab) {
  return static_cast<int>(std::max_element(v.begin() + off, v.begin() + off + vocab) -
                          (v.begin() + off));
}

int Main(int argc, char** argv) {
  const char* path = std::getenv("SPECNODE_MODEL");
  if (path == nullptr || *path == '\0') {
    const char* req = std::getenv("SPECNODE_REQUIRE_MODEL");
    std::fprintf(stderr, "SPECNODE_MODEL is unset: %s\n",
                 req && std::string(req) == "1" ? "FAILED (SPECNODE_REQUIRE_MODEL=1)" : "skipped");
    return req && std::string(req) == "1" ? 1 : mpi_test::kSkipExitCode;
  }
  auto env = MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "MpiEnvironment::Init: %s\n", env.status().ToString().c_str());
    return 1;
  }
  const int rank = (*env)->world_rank();
  mpi_test::WorldRank() = rank;
  if ((*env)->world_size() != kTp) {
    std::fprintf(stderr, "run with mpirun -np %d\n", kTp);
    return 1;
  }
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD, {.timeout_s = 60});
  MPI_TEST_CHECK(comm.ok(), comm.status());
  if (!comm.ok()) return 1;

  auto file = GgufFile::Open(path);
  MPI_TEST_CHECK(file.ok(), file.status());
  if (!file.ok()) return 1;
  auto config = LlamaConfig::FromGguf(**file);
  auto plan = ShardPlan::Create(*config, kTp);
  MPI_TEST_CHECK(plan.ok(), plan.status());
  if (!plan.ok()) return 1;
  LoadOptions lo;
  lo.shard = plan->Spec(rank);
  auto model = LlamaModel::Load(path, lo);
  MPI_TEST_CHECK(model.ok(), model.status());
  if (!model.ok()) return 1;
  const LlamaConfig& c = (*model)->config();
  const int vocab = c.vocab_size;
  ThreadPool pool(1);
  CommunicatorReducer reducer(comm->get());
  CpuLlamaForward fwd(c, (*model)->weights(), &pool, &reducer);
  DenseKvCache cache(c.n_layers, (*model)->weights().n_kv_heads_local, c.head_dim,
                     (*model)->weights().kv_heads_held().gqa_group, c.context_length, 1024);

  // Prefill with every row's logits, then 6 greedy decode steps; all on every rank.
  auto ids = (*model)->tokenizer().Encode("The capital of France is", false);
  MPI_TEST_CHECK(ids.ok(), ids.status());
  std::vector<int32_t> tokens = *ids;
  std::vector<float> mpi_rows, logits;
  absl::Status s = fwd.Forward(std::vector<BatchEntry>{{1, tokens, true}}, &cache, &logits);
  MPI_TEST_CHECK(s.ok(), s);
  mpi_rows = logits;
  const size_t n_prompt = tokens.size();
  for (int i = 0; i < 6 && s.ok(); ++i) {
    const int32_t next = Argmax(logits, logits.size() - vocab, vocab);
    tokens.push_back(next);
    s = fwd.Forward(
        std::vector<BatchEntry>{{1, std::span<const int32_t>(&tokens.back(), 1), false}}, &cache,
        &logits);
    MPI_TEST_CHECK(s.ok(), s);
    mpi_rows.insert(mpi_rows.end(), logits.begin(), logits.end());
  }
  const int64_t bytes = (*comm)->bytes_sent();

  if (rank == 0) {
    // The same token sequence in one process (prefill all, then the 6 generated tokens).
    for (const int tp : {1, kTp}) {
      LocalTpTargetOptions o;
      o.tp_size = tp;
      o.comm.timeout_s = 60;
      auto target = LocalTpTarget::Load(path, o);
      MPI_TEST_CHECK(target.ok(), target.status());
      if (!target.ok()) break;
      std::vector<float> rows, l;
      std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n_prompt);
      s = (*target)->Forward(std::vector<BatchEntry>{{1, prompt, true}}, &l);
      rows = l;
      for (size_t i = n_prompt; i < tokens.size() && s.ok(); ++i) {
        s = (*target)->Forward(
            std::vector<BatchEntry>{{1, std::span<const int32_t>(&tokens[i], 1), false}}, &l);
        rows.insert(rows.end(), l.begin(), l.end());
      }
      MPI_TEST_CHECK(s.ok(), s);
      MPI_TEST_CHECK(rows.size() == mpi_rows.size(), rows.size() << " vs " << mpi_rows.size());
      if (rows.size() != mpi_rows.size()) break;
      double max_diff = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(static_cast<double>(rows[i]) - mpi_rows[i]));
      }
      if (tp == 1) {
        std::fprintf(stderr, "[rank 0] max |logit(MPI TP=3) - logit(1 process)| = %.3g\n",
                     max_diff);
        MPI_TEST_CHECK(max_diff < kTolerance, max_diff);
        // Greedy tokens: the reference's argmax at every generated position.
        for (size_t i = 0; i + n_prompt < tokens.size(); ++i) {
          const size_t row = n_prompt - 1 + i;
          MPI_TEST_CHECK(Argmax(rows, row * vocab, vocab) == tokens[n_prompt + i], "step " << i);
        }
      } else {
        MPI_TEST_CHECK(max_diff == 0, "MPI vs Local TP=3 differ by " << max_diff);
      }
    }
    std::fprintf(stderr, "[rank 0] %zu tokens, %lld payload bytes sent per rank\n", tokens.size(),
                 static_cast<long long>(bytes));
  }
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  s = MpiWaitWithDeadline(&req, MPI_STATUS_IGNORE, 120, "final barrier");
  MPI_TEST_CHECK(s.ok(), s);
  comm->reset();
  const int failures = mpi_test::Failures();
  std::fprintf(stderr, "[rank %d] mpi_tp_forward_test: %s\n", rank,
               failures == 0 ? "PASSED" : "FAILED");
  env->reset();
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
