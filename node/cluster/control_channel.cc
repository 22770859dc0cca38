#include "node/cluster/control_channel.h"

#include <mpi.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_format.h"
#include "tensor-parallel/mpi_check.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kCheckEvery = std::chrono::milliseconds(20);

// PollUntil's timeout for a wait that only `check` can end.
constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

// Runs `poll` (true when done) until it is done, the deadline passes (none for kNoDeadline)
// or `check` fails.
template <typename Poll>
absl::Status PollUntil(Poll poll, double timeout_s, const std::string& what,
                       const ControlChannel::Check& check) {
  const auto start = Clock::now();
  const bool has_deadline = std::isfinite(timeout_s);
  const auto deadline = has_deadline ? start + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(timeout_s))
                                     : Clock::time_point::max();
  auto next_check = start + kCheckEvery;
  PollBackoff backoff;
  while (true) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    const auto now = Clock::now();
    if (check && now >= next_check) {
      absl::Status s = check();
      if (!s.ok()) return s;
      next_check = now + kCheckEvery;
    }
    if (has_deadline && now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s did not answer within %.1f s", what, timeout_s));
    }
    backoff.Sleep();
  }
}

}  // namespace

void PollBackoff::Sleep() {
  timespec ts{0, static_cast<long>(ns_)};
  nanosleep(&ts, nullptr);
  ns_ = std::min<int64_t>(ns_ * 2, 1'000'000);
}

absl::Status ControlChannel::Send(int dest, const std::string& frame, double timeout_s,
                                  const std::string& what, const Check& check) {
  if (frame.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control frame of %d bytes is too large for one message", frame.size()));
  }
  MPI_Request req = MPI_REQUEST_NULL;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Isend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE,
                                         dest, kControlTag, MPI_COMM_WORLD, &req));
  return PollUntil(
      [&req]() -> absl::StatusOr<bool> {
        int flag = 0;
        SPECNODE_MPI_RETURN_IF_ERROR(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
        return flag != 0;
      },
      timeout_s, what, check);
}

absl::StatusOr<bool> ControlChannel::TryRecv(int source, std::string* frame, const Check& check) {
  assert(source >= 0 && "a frame is received from one known rank (see control_channel.h)");
  int flag = 0;
  MPI_Status st;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Iprobe(source, kControlTag, MPI_COMM_WORLD, &flag, &st));
  if (!flag) return false;
  // A frame from a peer already known dead is not received: libfabric's tcp provider
  // (OpenMPI's cm layer) crashes in MPI_Irecv for a sender whose connection has closed, and
  // the channel to a dead peer is broken anyway.
  if (check) {
    absl::Status alive = check();
    if (!alive.ok()) return alive;
  }
  int count = 0;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Get_count(&st, MPI_BYTE, &count));
  // The receive below matches the probed frame: messages from one sender with one tag are
  // not overtaken, and no other receive with kControlTag from `source` is posted meanwhile
  // (one thread uses the channel). Matched probes (MPI_Improbe / MPI_Imrecv) would say the
  // same, but fail under OpenMPI's cm layer on some RDMA providers (docs/serving.md, "MPI
  // transports"); a plain probe and receive work under every layer.
  //
  // Only the envelope has arrived for a large frame: OpenMPI's shared-memory transport then
  // copies the payload out of the sender's memory (process_vm_readv), which fails — and
  // leaves the receive pending forever — when the sender died in between (seen: "Read -1,
  // expected 196753, errno = 3" when a target rank was killed mid-reply). So the receive is
  // polled, with `check`, never waited for in MPI_Recv. Its buffer is owned here until the
  // receive completes: a receive given up on keeps it (leaked on purpose; MPI may still
  // write into it, and the channel to that peer is broken anyway).
  auto buf = std::make_unique<std::string>(static_cast<size_t>(count), '\0');
  MPI_Request req = MPI_REQUEST_NULL;
  SPECNODE_MPI_RETURN_IF_ERROR(
      MPI_Irecv(buf->data(), count, MPI_BYTE, source, kControlTag, MPI_COMM_WORLD, &req));
  absl::Status received = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        int done = 0;
        MPI_Status got;
        absl::Status tested = SPECNODE_MPI_STATUS(MPI_Test(&req, &done, &got));
        if (tested.ok() && done) {
          int n = 0;
          tested = SPECNODE_MPI_STATUS(MPI_Get_count(&got, MPI_BYTE, &n));
          if (tested.ok() && n != count) {
            return absl::InternalError(absl::StrFormat(
                "a control frame from rank %d was probed at %d bytes but %d arrived", source,
                count, n));
          }
        }
        if (tested.ok()) return done != 0;
        // A failed receive: from a dead sender, say that rather than MPI's text.
        if (check) {
          absl::Status alive = check();
          if (!alive.ok()) return alive;
        }
        return tested;
      },
      kNoDeadline, "", check);
  if (!received.ok()) {
    (void)buf.release();  // see above
    return received;
  }
  *frame = std::move(*buf);
  return true;
}

absl::StatusOr<std::string> ControlChannel::Recv(int source, double timeout_s,
                                                 const std::string& what, const Check& check) {
  std::string frame;
  absl::Status s =
      PollUntil([&]() { return TryRecv(source, &frame, check); }, timeout_s, what, check);
  if (!s.ok()) return s;
  return frame;
}

std::string ThisHost() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

namespace {

// A pidfd for `pid` (pidfd_open, Linux 5.3+), opened on first use and kept for the
// process's life (one per peer rank): polling it costs one cheap syscall, where /proc/PID/stat
// costs about 10 µs, and TryRecv asks for every frame. -1 where pidfds are unavailable
// (ENOSYS, a seccomp filter); kGone when the pid no longer exists.
constexpr int kGone = -2;
int PidFdOf(int64_t pid) {
  static std::mutex mu;
  static auto* fds = new std::map<int64_t, int>;  // never freed: used until exit
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = fds->find(pid); it != fds->end()) return it->second;
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  if (fd < 0 && errno == ESRCH) return kGone;
  (*fds)[pid] = fd < 0 ? -1 : fd;
  return (*fds)[pid];
}

}  // namespace

bool PeerAliveByProc(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

bool PeerAlive(int64_t pid, const std::string& host) {
  static const std::string this_host = ThisHost();
  if (pid <= 0 || host.empty() || host != this_host) return true;
  // A killed child of mpirun is a zombie until it is reaped: its pidfd is readable from
  // the moment it exits.
  const int fd = PidFdOf(pid);
  if (fd == kGone) return false;
  if (fd < 0) return PeerAliveByProc(pid);
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 1;
}

}  // namespace specnode
