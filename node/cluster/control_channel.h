// ControlChannel: point-to-point transport of control-protocol frames
// (node/control_protocol.h) between rank 0 and the target shards, over MPI_COMM_WORLD with
// one reserved tag. Only built with MPI (SPECNODE_HAVE_MPI).
//
// Every wait is non-busy and bounded: Send polls MPI_Test and Recv polls MPI_Iprobe (then
// an MPI_Irecv of the probed size from that sender, polled with MPI_Test: its payload comes
// from a sender that may die before it is copied), with a
// sleeping backoff of 20 µs doubling to 1 ms, so an idle rank costs a few percent of one
// core and a message is noticed within ~1 ms. While waiting, `check` (optional) is called
// about every 20 ms: a non-OK return ends the wait with that status (used for "is the peer
// process still alive?" and "was a stop requested?"). On the deadline: DeadlineExceeded.
// A send that timed out leaves its request pending (MPI cannot cancel it portably); the
// caller treats the channel to that peer as broken.
//
// Peer liveness (PeerAlive): on the same host, a pid that no longer exists (or is a
// zombie) is a dead peer — noticed in ~20 ms instead of at the deadline. Peers on other
// hosts are only noticed by the deadline (and by mpirun tearing the job down).
//
// Only point-to-point calls every MPI layer implements are used (no matched probes:
// MPI_Improbe / MPI_Imrecv fail under OpenMPI's cm layer with some RDMA providers), so the
// channel works under ob1, cm (OFI MTL) and UCX alike; CI runs its tests under each
// (docs/serving.md, "MPI transports"). A frame is always received from one named rank: the
// probe-then-receive pair relies on no other receive with kControlTag from that rank being
// posted in between, which one user thread at a time guarantees.
//
// Thread-safety: none; one thread uses a channel at a time (MPI is initialised with
// MPI_THREAD_SERIALIZED: rank 0 hands the channel from the main thread to the scheduler
// thread and back, never using it from two threads at once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

inline constexpr int kControlTag = 7101;

class ControlChannel {
 public:
  using Check = std::function<absl::Status()>;

  // Sends `frame` to world rank `dest`; `what` names the peer in messages ("target rank 2").
  absl::Status Send(int dest, const std::string& frame, double timeout_s, const std::string& what,
                    const Check& check = nullptr);

  // Receives the next frame from world rank `source`. DeadlineExceeded:
  // "<what> did not answer within <timeout_s> s".
  absl::StatusOr<std::string> Recv(int source, double timeout_s, const std::string& what,
                                   const Check& check = nullptr);

  // Non-blocking: a frame from `source` if one has arrived (nullopt-like: false). When an
  // envelope has arrived, `check` is called first: a failed check returns its status and
  // leaves the frame unreceived (a dead peer's last frame is dropped; see
  // control_channel.cc for the libfabric crash this avoids). The frame is then received in
  // full, which takes microseconds unless
  // the sender died before its payload was copied: that receive never completes, so it is
  // polled with `check` (as the waits above, about every 20 ms) and a failed check ends it
  // with that status. Without a check such a receive waits forever.
  absl::StatusOr<bool> TryRecv(int source, std::string* frame, const Check& check = nullptr);
};

// The host name of this machine ("" if unknown).
std::string ThisHost();

// False when `pid` on `host` is known to be gone: host is this machine and the process has
// exited (a zombie included) or the pid does not exist. True otherwise (including other
// hosts: unknown). About 1 µs per call after the first for a pid (a pidfd, kept open);
// about 10 µs through /proc where pidfds are unavailable. Thread-safe.
bool PeerAlive(int64_t pid, const std::string& host);

// PeerAlive's way without pidfds, for a pid on this host: false when kill(pid, 0) says it
// does not exist or /proc/PID/stat says it is a zombie ('Z', 'X').
bool PeerAliveByProc(int64_t pid);

// Sleeping backoff for poll loops: 20 µs doubling to 1 ms.
class PollBackoff {
 public:
  void Sleep();
  void Reset() { ns_ = 20'000; }

 private:
  int64_t ns_ = 20'000;
};

}  // namespace specnode
