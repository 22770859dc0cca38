// A frame whose sender dies between its envelope and its payload, under `mpirun -np 2`
// (ctest: control_channel_dead_sender_mpi_test). Rank 1 posts a 4 MiB frame to rank 0
// (large enough to go by rendezvous: OpenMPI's shared-memory transport sends the envelope
// and lets the receiver copy the payload out of the sender's memory) and exits at once,
// without finalising. Rank 0 then receives: the receive can never complete, and
// ControlChannel::Recv must end it through its liveness check within a bound instead of
// waiting forever (as a blocking MPI_Recv did — what kept a coordinator from answering its
// clients when a target rank was killed mid-reply).
//
// Two ways to notice it, chosen by rank 0's argument:
//   (none)            the check is asked before the receive is posted and already fails:
//                     the frame is dropped unreceived (every layer; under cm-ofi posting
//                     the receive would crash libfabric's tcp provider);
//   --posted-receive  the check passes on its first call, so the receive is posted and
//                     its polling must notice the dead sender (ob1, ucx: the shared-memory
//                     payload copy that never completes).
//
// The job itself fails (a rank exited without MPI_Finalize and mpirun tears the job down),
// so ctest judges rank 0's output: it prints "PASS: ..." (PASS_REGULAR_EXPRESSION) only
// when Recv returned Unavailable from the check in time.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "node/cluster/control_channel.h"
#include "tensor-parallel/mpi_check.h"
#include "tests/support/mpi_test_main.h"

namespace specnode {
namespace {

constexpr size_t kFrameBytes = size_t{4} << 20;

int Sender() {
  ControlChannel channel;
  const std::string pid = std::to_string(getpid());
  if (!channel.Send(0, pid, 30, "rank 0").ok()) return 1;
  const std::string frame(kFrameBytes, 'x');
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Isend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, 0, kControlTag, MPI_COMM_WORLD,
            &req);
  int done = 0;
  MPI_Test(&req, &done, MPI_STATUS_IGNORE);  // push the envelope out
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  _exit(0);  // dead before rank 0 asks for the payload
}

int Receiver(bool posted_receive) {
  // mpirun answers rank 1's exit by tearing the job down (SIGTERM, then SIGKILL): rank 0
  // outlives the SIGTERM to report (the test runs mpirun with a long sigkill timeout).
  signal(SIGTERM, SIG_IGN);
  ControlChannel channel;
  absl::StatusOr<std::string> pid = channel.Recv(1, 30, "rank 1");
  if (!pid.ok()) {
    std::printf("FAIL: no pid from rank 1: %s\n", std::string(pid.status().message()).c_str());
    return 1;
  }
  const int64_t sender = std::stoll(*pid);
  // Rank 1 is gone by then; its envelope is here.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto start = std::chrono::steady_clock::now();
  int checks = 0;
  absl::StatusOr<std::string> frame = channel.Recv(1, 10, "rank 1", [&]() -> absl::Status {
    if (posted_receive && checks++ == 0) return absl::OkStatus();
    if (PeerAlive(sender, ThisHost())) return absl::OkStatus();
    return absl::UnavailableError("rank 1 exited");
  });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (frame.ok()) {
    std::printf("FAIL: received %zu bytes from a dead sender\n", frame->size());
  } else if (frame.status().code() != absl::StatusCode::kUnavailable || waited > 3.0) {
    std::printf("FAIL: after %.2f s: %s\n", waited, std::string(frame.status().message()).c_str());
  } else {
    std::printf("PASS: the dead sender was noticed after %.2f s (%s)\n", waited,
                std::string(frame.status().message()).c_str());
  }
  std::fflush(stdout);
  _exit(0);  // MPI_Finalize could wait for the dead rank
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) {
  return specnode::testing_support::RunUnderMpirun(
      argc, argv, 2, [](int rank, int argc, char** argv) {
        const bool posted_receive = argc > 1 && std::string(argv[1]) == "--posted-receive";
        return rank == 0 ? specnode::Receiver(posted_receive) : specnode::Sender();
      });
}
