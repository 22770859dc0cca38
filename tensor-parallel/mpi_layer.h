// Which point-to-point layer the MPI library chose for this process, in words for the
// messages that refuse a layer (node/cluster/transport_check.h) and the start-up log.
//
// OpenMPI picks a PML ("point-to-point messaging layer") per job: ob1 (over its BTLs:
// shared memory, TCP, ...), cm (over an MTL: ofi = libfabric, psm2) or ucx. Its own choice
// depends on the host: with an RDMA device present cm outranks ob1. A launch line picks one
// with `--mca pml ob1|cm|ucx` (or OMPI_MCA_pml=... in the environment). docs/serving.md,
// "MPI transports", says which layers specnode is tested under.
//
// Only built with MPI (SPECNODE_HAVE_MPI). Thread-safety: CurrentMpiLayer reads process-wide
// state the library set at MPI_Init; call it after MpiEnvironment::Init, from any thread.
#pragma once

#include <string>
#include <vector>

namespace specnode {

struct MpiLayer {
  std::string library;  // first line of MPI_Get_library_version ("Open MPI v4.1.4, ...")
  std::string pml;      // the selected PML ("ob1", "cm", "ucx"); "" when the library hides it
  std::string mtl;      // under pml cm, the selected MTL ("ofi", "psm2"); else ""
  std::vector<std::string> rdma_devices;  // entries of /sys/class/infiniband ("mlx5_0")

  // "pml cm (mtl ofi)", "pml ob1", or "the MPI library's point-to-point layer" when unknown;
  // then ", RDMA devices: mlx5_0, mlx5_1" when there are any.
  std::string Describe() const;
};

// The layer of this process. Requires MPI to be initialised.
MpiLayer CurrentMpiLayer();

// The launch setting that selects the layer every OpenMPI host can run and CI tests first,
// for the advice in refusals: "--mca pml ob1".
inline constexpr char kFallbackMpiLayerFlag[] = "--mca pml ob1";

}  // namespace specnode
