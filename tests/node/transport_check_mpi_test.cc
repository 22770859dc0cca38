// The start-up check of the MPI layer (node/cluster/transport_check.h) as 3 ranks under
// mpirun (ctest: transport_check_mpi_test, and _cm_ofi / _ucx under the other layers).
// Every rank runs the same sequence of checks; rank 0 runs the GoogleTest assertions and
// the other ranks play their side, reporting failures through their exit code.
//   1. a clean check passes on every rank;
//   2. rank 2 corrupting its echo (the testing fault) fails rank 0's check with DataLoss
//      naming rank 2 and the byte, while ranks 1 and 2 see their own side pass;
//   3. control frames flow normally after both checks (nothing left queued on the tag).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "node/cluster/control_channel.h"
#include "node/cluster/transport_check.h"
#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_layer.h"
#include "tests/support/mpi_test_main.h"

namespace specnode {
namespace {

constexpr int kWorld = 3;
constexpr int kCorruptRank = 2;

ControlChannel& Channel() {
  static ControlChannel channel;
  return channel;
}

TransportCheckOptions Options(int corrupt_rank) {
  TransportCheckOptions o;
  o.timeout_s = 30;
  o.corrupt_echo_rank = corrupt_rank;
  return o;
}

// Ranks 1..2: the same three steps as rank 0's tests, in order.
int Peer(int rank) {
  if (!CheckMpiTransport(&Channel(), rank, kWorld, Options(-1)).ok()) return 1;
  if (!CheckMpiTransport(&Channel(), rank, kWorld, Options(kCorruptRank)).ok()) return 2;
  absl::StatusOr<std::string> frame = Channel().Recv(0, 30, "rank 0");
  if (!frame.ok() || *frame != "after") return 3;
  return Channel().Send(0, "after:" + std::to_string(rank), 30, "rank 0").ok() ? 0 : 4;
}

TEST(TransportCheck, PassesOnEveryRank) {
  absl::Status st = CheckMpiTransport(&Channel(), 0, kWorld, Options(-1));
  EXPECT_TRUE(st.ok()) << st;
}

TEST(TransportCheck, CatchesAnEchoThatCameBackChanged) {
  absl::Status st = CheckMpiTransport(&Channel(), 0, kWorld, Options(kCorruptRank));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(st.message(), "the frame echoed by rank 2: byte 2097152 of 4194304 arrived changed");
  // Rank 0's check ended before its barrier (the node aborts the job there); the peers'
  // checks passed and wait in theirs.
  MPI_Request barrier = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Ibarrier(MPI_COMM_WORLD, &barrier), MPI_SUCCESS);
  EXPECT_TRUE(MpiWaitWithDeadline(&barrier, MPI_STATUS_IGNORE, 30, "barrier").ok());
}

TEST(TransportCheck, ControlFramesFlowAfterTheChecks) {
  for (int r = 1; r < kWorld; ++r) ASSERT_TRUE(Channel().Send(r, "after", 30, "peer").ok());
  for (int r = 1; r < kWorld; ++r) {
    absl::StatusOr<std::string> frame = Channel().Recv(r, 30, "peer");
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(*frame, "after:" + std::to_string(r));
  }
}

TEST(TransportCheck, TheRefusalNamesTheLayerAndTheSettingThatWorks) {
  const MpiLayer layer = CurrentMpiLayer();
  EXPECT_FALSE(layer.pml.empty()) << "OpenMPI's selected PML was not found";
  // One printable line (OpenMPI counts the version string's NUL in its length).
  EXPECT_EQ(layer.library.find_first_of(std::string("\0\r\n", 3)), std::string::npos);
  EXPECT_EQ(layer.library.rfind("Open MPI", 0), 0u) << layer.library;
  const absl::Status refusal =
      RefuseMpiLayer(absl::DataLossError("the frame echoed by rank 2: ..."), layer);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(refusal.message());
  EXPECT_NE(msg.find("the MPI point-to-point layer (pml " + layer.pml), std::string::npos) << msg;
  EXPECT_NE(msg.find("failed specnode's start-up check: the frame echoed by rank 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Relaunch with `mpirun --mca pml ob1 ...`"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\0'), std::string::npos);
  std::printf("layer under test: %s\n", layer.Describe().c_str());
}

TEST(MpiLayer, DescribesWhatItKnows) {
  MpiLayer layer;
  EXPECT_EQ(layer.Describe(), "the MPI library's point-to-point layer");
  layer.pml = "cm";
  layer.mtl = "ofi";
  layer.rdma_devices = {"mlx5_0", "mlx5_1"};
  EXPECT_EQ(layer.Describe(), "pml cm (mtl ofi), RDMA devices: mlx5_0, mlx5_1");
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) {
  return specnode::testing_support::RunUnderMpirun(argc, argv, specnode::kWorld,
                                                   [](int rank, int argc, char** argv) {
    if (rank != 0) return specnode::Peer(rank);
    ::testing::InitGoogleTest(&argc, argv);
    ::testing::GTEST_FLAG(shuffle) = false;
    return RUN_ALL_TESTS();
  });
}
