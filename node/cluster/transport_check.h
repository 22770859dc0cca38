// The start-up check of the MPI point-to-point layer (docs/serving.md, "MPI transports"):
// every rank of a `specnode serve` job runs it right after MPI_Init, before any weights
// load, so that a layer the node cannot work with is refused at start, naming the layer and
// the launch setting that works, instead of failing mid-job.
//
// It exercises what the job then relies on, through the same ControlChannel:
//   1. rank 0 sends each rank a short frame, which comes back (eager path);
//   2. rank 0 sends each rank a 4 MiB frame of a known byte pattern; the rank checks every
//      byte and sends it back; rank 0 checks the echo (the large-message path: rendezvous
//      under ob1, the MTL's or UCX's protocol otherwise);
//   3. a barrier over MPI_COMM_WORLD (the collective path), with the same deadline.
// Each wait is bounded by `timeout_s`; a peer that does not answer is a failure.
//
// Only built with MPI. Thread-safety: call from the thread that owns MPI, before any other
// control traffic (the check's frames use the control tag).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "node/cluster/control_channel.h"
#include "tensor-parallel/mpi_layer.h"

namespace specnode {

inline constexpr size_t kTransportCheckFrameBytes = size_t{4} << 20;

struct TransportCheckOptions {
  double timeout_s = 30.0;  // each wait's bound
  // Testing only (SPECNODE_TRANSPORT_CHECK_FAULT=<rank>, docs/testing.md): that rank flips
  // one byte of the large frame it echoes, as a layer that corrupts data would; rank 0's
  // check must catch it and refuse the layer. -1: off.
  int corrupt_echo_rank = -1;
};

// Runs this rank's side of the check. OK when every step above passed; otherwise the
// step's error (DataLoss for a frame that came back changed, DeadlineExceeded for a peer
// that did not answer, Internal for an MPI call that failed).
absl::Status CheckMpiTransport(ControlChannel* channel, int rank, int world_size,
                               const TransportCheckOptions& options);

// The refusal for a failed check: FailedPrecondition
//   "the MPI point-to-point layer (<layer.Describe()>) failed specnode's start-up check:
//    <failure>. Relaunch with `mpirun --mca pml ob1 ...` (or OMPI_MCA_pml=ob1) ..."
absl::Status RefuseMpiLayer(const absl::Status& failure, const MpiLayer& layer);

}  // namespace specnode
