#include "node/cluster/transport_check.h"

#include <mpi.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "model/status_macros.h"
#include "tensor-parallel/mpi_check.h"

namespace specnode {
namespace {

std::string ShortFrame(int rank) {
  return absl::StrFormat("specnode transport check: rank 0 -> rank %d", rank);
}

// A pattern that differs per rank and per byte, so a frame cut short, zero-filled, shifted
// or delivered to the wrong rank does not pass.
std::string LargeFrame(int rank) {
  std::string frame(kTransportCheckFrameBytes, '\0');
  uint32_t x = 2166136261u ^ static_cast<uint32_t>(rank);
  for (char& c : frame) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return frame;
}

absl::Status Expect(const std::string& got, const std::string& want, const std::string& what) {
  if (got.size() != want.size()) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes arrived, %d were sent", what, got.size(), want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::DataLossError(
          absl::StrFormat("%s: byte %d of %d arrived changed", what, i, got.size()));
    }
  }
  return absl::OkStatus();
}

std::string RankName(int rank) { return absl::StrFormat("rank %d", rank); }

// Rank 0: each frame out to every rank, then every echo back, for both frame sizes.
absl::Status CheckFromCoordinator(ControlChannel* channel, int world_size, double timeout_s) {
  for (auto make : {&ShortFrame, &LargeFrame}) {
    for (int r = 1; r < world_size; ++r) {
      SPECNODE_RETURN_IF_ERROR(channel->Send(r, make(r), timeout_s, RankName(r)));
    }
    for (int r = 1; r < world_size; ++r) {
      SPECNODE_ASSIGN_OR_RETURN(std::string echo, channel->Recv(r, timeout_s, RankName(r)));
      SPECNODE_RETURN_IF_ERROR(
          Expect(echo, make(r), absl::StrFormat("the frame echoed by rank %d", r)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFromShard(ControlChannel* channel, int rank, double timeout_s,
                            bool corrupt_echo) {
  for (auto make : {&ShortFrame, &LargeFrame}) {
    SPECNODE_ASSIGN_OR_RETURN(std::string frame, channel->Recv(0, timeout_s, "rank 0"));
    SPECNODE_RETURN_IF_ERROR(Expect(frame, make(rank), "the frame from rank 0"));
    if (corrupt_echo && frame.size() == kTransportCheckFrameBytes) frame[frame.size() / 2] ^= 1;
    SPECNODE_RETURN_IF_ERROR(channel->Send(0, frame, timeout_s, "rank 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMpiTransport(ControlChannel* channel, int rank, int world_size,
                               const TransportCheckOptions& options) {
  if (world_size > 1) {
    SPECNODE_RETURN_IF_ERROR(
        rank == 0 ? CheckFromCoordinator(channel, world_size, options.timeout_s)
                  : CheckFromShard(channel, rank, options.timeout_s,
                                   rank == options.corrupt_echo_rank));
  }
  MPI_Request barrier = MPI_REQUEST_NULL;
  SPECNODE_MPI_RETURN_IF_ERROR(MPI_Ibarrier(MPI_COMM_WORLD, &barrier));
  return MpiWaitWithDeadline(&barrier, MPI_STATUS_IGNORE, options.timeout_s,
                             "the start-up barrier over every rank");
}

absl::Status RefuseMpiLayer(const absl::Status& failure, const MpiLayer& layer) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "the MPI point-to-point layer (%s%s) failed specnode's start-up check: %s. Relaunch "
      "with `mpirun %s ...` (or OMPI_MCA_pml=ob1 in the environment); docs/serving.md, "
      "\"MPI transports\", lists the layers specnode is tested under",
      layer.Describe(), layer.library.empty() ? "" : "; " + layer.library, failure.message(),
      kFallbackMpiLayerFlag));
}

}  // namespace specnode
