// MpiCommunicator under `mpirun -np 3` (see tests/CMakeLists.txt): collectives with odd and
// large (rendezvous-sized) counts, rank-ordered bit-identical sums, byte accounting, a
// sub-group from world ranks, and the deadline: rank 2 skips one collective, ranks 0 and 1
// get DeadlineExceeded naming rank 2 within the timeout, the communicator stays broken,
// then rank 2 reads the late rows (the abandoned sends complete from intact buffers), and
// every process still finishes and exits 0 (no hang, no MPI_Abort).
#include <time.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_communicator.h"
#include "tests/tensor-parallel/mpi_test_util.h"

namespace specnode {
namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

float Value(int rank, int64_t i) { return 0.1f * rank + 1.0f / (1 + i) + (i % 7) * 1e-3f; }

void CheckCollectives(MpiCommunicator& c) {
  const int T = c.size(), r = c.rank();
  int64_t expect_bytes = 0;
  for (int64_t count : {0, 1, 7, 577, 40000}) {  // 40000 floats: past the eager limit
    std::vector<float> x(count);
    for (int64_t i = 0; i < count; ++i) x[i] = Value(r, i);
    const absl::Status s = c.AllReduceSum(x.data(), count);
    MPI_TEST_CHECK(s.ok(), s);
    int bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      float want = Value(0, i);
      for (int q = 1; q < T; ++q) want += Value(q, i);
      bad += x[i] != want;  // the same order as LocalCommunicator: exact
    }
    MPI_TEST_CHECK(bad == 0, bad << " of " << count << " sums differ from the rank-order sum");
    expect_bytes += 4 * count * (T - 1);
  }
  const int64_t count = 13;
  std::vector<float> send(count), recv(T * count, -1);
  for (int64_t i = 0; i < count; ++i) send[i] = Value(r, i);
  absl::Status s = c.AllGather(send.data(), count, recv.data());
  MPI_TEST_CHECK(s.ok(), s);
  for (int q = 0; q < T; ++q) {
    for (int64_t i = 0; i < count; ++i) {
      MPI_TEST_CHECK(recv[q * count + i] == Value(q, i), "row " << q << " col " << i);
    }
  }
  expect_bytes += 4 * count * (T - 1);
  int64_t expect_received = expect_bytes, expect_sent = expect_bytes;
  for (int root = 0; root < T; ++root) {
    char msg[16] = {};
    if (r == root) std::snprintf(msg, sizeof(msg), "root %d", root);
    s = c.Broadcast(msg, 11, root);
    MPI_TEST_CHECK(s.ok(), s);
    MPI_TEST_CHECK(std::string(msg) == "root " + std::to_string(root), msg);
    if (r == root) {
      expect_sent += 11 * (T - 1);
    } else {
      expect_received += 11;
    }
  }
  s = c.Barrier();
  MPI_TEST_CHECK(s.ok(), s);
  MPI_TEST_CHECK(c.bytes_sent() == expect_sent, c.bytes_sent() << " vs " << expect_sent);
  MPI_TEST_CHECK(c.bytes_received() == expect_received, c.bytes_received()
                                                            << " vs " << expect_received);
}

// A barrier on MPI_COMM_WORLD with a deadline, so the test itself cannot hang.
void WorldBarrier(double timeout_s) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  const absl::Status s = MpiWaitWithDeadline(&req, MPI_STATUS_IGNORE, timeout_s, "world barrier");
  MPI_TEST_CHECK(s.ok(), s);
}

// Rank 2 skips one AllReduceSum: ranks 0 and 1 get DeadlineExceeded naming rank 2 within
// the timeout, without spinning, and the communicator stays broken; rank 2 then reads the
// late rows.
void CheckDeadline(int world_rank) {
  constexpr double kTimeout = 1.0;  // generous: ctest may run other tests alongside
  auto c = MpiCommunicator::Create(MPI_COMM_WORLD, {.timeout_s = kTimeout});
  MPI_TEST_CHECK(c.ok(), c.status());
  if (!c.ok()) return;
  std::vector<float> x(40000, 1.0f);
  absl::Status s = (*c)->AllReduceSum(x.data(), 64);
  MPI_TEST_CHECK(s.ok(), s);
  if (world_rank != 2) {
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = CpuSeconds();
    s = (*c)->AllReduceSum(x.data(), 40000);
    const double cpu = CpuSeconds() - cpu0;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Waiting polls with a sleeping backoff: far from a core's worth of CPU.
    MPI_TEST_CHECK(cpu < 0.25 * waited, "used " << cpu << " s CPU while waiting " << waited);
    std::fprintf(stderr, "[rank %d] deadline wait: %.3f s wall, %.3f s CPU\n", world_rank, waited,
                 cpu);
    MPI_TEST_CHECK(s.code() == absl::StatusCode::kDeadlineExceeded, s);
    MPI_TEST_CHECK(std::string(s.message()).find("from rank 2 (world 2)") != std::string::npos,
                   s);
    MPI_TEST_CHECK(
        std::string(s.message()).find("rank 1 (world 1)") == std::string::npos || world_rank == 0,
        s);
    MPI_TEST_CHECK(waited >= kTimeout * 0.9 && waited < kTimeout + 2.0, waited << " s");
    s = (*c)->Barrier();
    MPI_TEST_CHECK(s.code() == absl::StatusCode::kFailedPrecondition, s);
    MPI_TEST_CHECK(std::string(s.message()).find("broken") != std::string::npos, s);
  }
  WorldBarrier(30);  // rank 2 waits here until ranks 0 and 1 have timed out
  if (world_rank == 2) {
    // The late peer finally reads what ranks 0 and 1 sent it for the skipped collective:
    // their abandoned sends complete from the staging buffers they gave up (intact: the
    // first AllReduceSum's 64 sums of 1 + 1 + 1, then 1s), and no send is left pending at
    // MPI_Finalize (under OpenMPI's OFI MTL a pending send fails fi_close there).
    for (int from : {0, 1}) {
      std::vector<float> late(40000, 0.0f);
      MPI_Request req = MPI_REQUEST_NULL;
      MPI_Irecv(late.data(), 40000, MPI_FLOAT, from, MPI_ANY_TAG, (*c)->comm(), &req);
      s = MpiWaitWithDeadline(&req, MPI_STATUS_IGNORE, 30, "the late message");
      MPI_TEST_CHECK(s.ok(), s);
      int bad = 0;
      for (int i = 0; i < 40000; ++i) bad += late[i] != (i < 64 ? 3.0f : 1.0f);
      MPI_TEST_CHECK(bad == 0, bad << " values of rank " << from << "'s late row differ");
    }
  }
  WorldBarrier(30);
  }

int Main(int argc, char** argv) {
  auto env = MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "MpiEnvironment::Init: %s\n", env.status().ToString().c_str());
    return 1;
  }
  const int world_rank = (*env)->world_rank(), world_size = (*env)->world_size();
  mpi_test::WorldRank() = world_rank;
  MPI_TEST_CHECK(MpiEnvironment::InMpiJob(), "InMpiJob() under mpirun");
  if (world_size != 3) {
    std::fprintf(stderr, "run with mpirun -np 3 (got %d ranks)\n", world_size);
    return 1;
  }

  {  // The whole world.
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD, {.timeout_s = 30});
    MPI_TEST_CHECK(c.ok(), c.status());
    if (c.ok()) {
      MPI_TEST_CHECK((*c)->kind() == "mpi", (*c)->kind());
      MPI_TEST_CHECK((*c)->rank() == world_rank && (*c)->size() == 3, "numbering");
      CheckCollectives(**c);
    }
  }
  {  // A sub-group in a chosen order: world ranks 2 and 0 (group ranks 0 and 1).
    if (world_rank != 1) {
      const int members[] = {2, 0};
      auto c = MpiCommunicator::CreateFromWorldRanks(members, {.timeout_s = 30});
      MPI_TEST_CHECK(c.ok(), c.status());
      if (c.ok()) {
        MPI_TEST_CHECK((*c)->rank() == (world_rank == 2 ? 0 : 1), (*c)->rank());
        MPI_TEST_CHECK((*c)->world_rank(0) == 2, (*c)->world_rank(0));
        CheckCollectives(**c);
      }
    } else {
      const int members[] = {2, 0};
      auto c = MpiCommunicator::CreateFromWorldRanks(members);
      MPI_TEST_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument, c.status());
    }
    WorldBarrier(30);
  }
  CheckDeadline(world_rank);
  {  // Error macro format.
    const absl::Status s = SPECNODE_MPI_STATUS(MPI_ERR_COUNT);
    MPI_TEST_CHECK(s.code() == absl::StatusCode::kInternal, s);
    MPI_TEST_CHECK(std::string(s.message()).find("MPI_ERR_COUNT failed: ") != std::string::npos, s);
  }
  const int failures = mpi_test::Failures();
  std::fprintf(stderr, "[rank %d] mpi_communicator_test: %s (%d failed checks)\n", world_rank,
               failures == 0 ? "PASSED" : "FAILED", failures);
  env->reset();  // MPI_Finalize
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
