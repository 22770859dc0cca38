// Test-only: the main() of a test binary run under `mpirun -np N`: initialises MPI
// (MpiEnvironment), checks the world size and runs `body(world_rank, argc, argv)`, whose
// return value is the process's exit code. The environment (and MPI) is finalised when
// main returns; bodies that must not finalise (a dead peer) _exit instead.
#pragma once

#include <cstdio>
#include <string>

#include "tensor-parallel/mpi_check.h"

namespace specnode::testing_support {

template <typename Body>
int RunUnderMpirun(int argc, char** argv, int world_size, Body body) {
  auto env = MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", std::string(env.status().message()).c_str());
    return 1;
  }
  if ((*env)->world_size() != world_size) {
    std::fprintf(stderr, "run me with mpirun -np %d\n", world_size);
    return 1;
  }
  return body((*env)->world_rank(), argc, argv);
}

}  // namespace specnode::testing_support
