// Test-only: which MPI point-to-point layer a launch line opens (tests/support/mpi_layer_run).
// Run as `mpirun -np 2 mpi_layer_probe <pml>`: initialises MPI, and rank 0 prints
// "layer: <CurrentMpiLayer().Describe()>" and exits 0 when the selected PML is <pml>, 3 when
// OpenMPI selected another one (a matrix entry that would silently run under the wrong
// layer), 1 when MPI did not initialise; with `--any` it prints the layer and exits 0
// (scripts/device-check: what OpenMPI picks on its own). A layer that cannot open makes
// MPI_Init fail, and mpirun exits non-zero with OpenMPI's reason and no "layer:" line; the
// line is flushed at once, so a failure after MPI opened (a crash, a sanitizer's report at
// finalize) is told apart from a layer that cannot open.
#include <cstdio>
#include <string>

#include "tensor-parallel/mpi_layer.h"
#include "tests/support/mpi_test_main.h"

int main(int argc, char** argv) {
  return specnode::testing_support::RunUnderMpirun(argc, argv, 2, [](int rank, int ac, char** av) {
    if (ac != 2) {
      std::fprintf(stderr, "usage: mpirun -np 2 mpi_layer_probe <pml>|--any\n");
      return 2;
    }
    if (rank != 0) return 0;
    const specnode::MpiLayer layer = specnode::CurrentMpiLayer();
    std::printf("layer: %s; %s\n", layer.Describe().c_str(), layer.library.c_str());
    std::fflush(stdout);
    if (std::string(av[1]) != "--any" && layer.pml != av[1]) {
      std::printf("expected pml %s, OpenMPI selected '%s'\n", av[1], layer.pml.c_str());
      return 3;
    }
    return 0;
  });
}
