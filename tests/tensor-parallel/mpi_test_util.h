// Minimal checks for tests that run as several MPI processes under mpirun (GoogleTest's
// output and exit codes do not compose across ranks). A failed CHECK prints
// "[rank R] file:line: CHECK(expr) failed: detail" and counts a failure; main returns
// non-zero when any check failed on this rank (mpirun then exits non-zero). Exit code 77
// means "skipped" (ctest SKIP_RETURN_CODE).
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

namespace specnode::mpi_test {

inline int& Failures() {
  static int n = 0;
  return n;
}
inline int& WorldRank() {
  static int r = -1;
  return r;
}

inline constexpr int kSkipExitCode = 77;

}  // namespace specnode::mpi_test

#define MPI_TEST_CHECK(expr, detail)                                             \
  do {                                                                           \
    if (!(expr)) {                                                               \
      std::ostringstream mpi_test_os_;                                           \
      mpi_test_os_ << detail;                                                    \
      std::fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: %s\n",            \
                   ::specnode::mpi_test::WorldRank(), __FILE__, __LINE__, #expr, \
                   mpi_test_os_.str().c_str());                                  \
      ++::specnode::mpi_test::Failures();                                        \
    }                                                                            \
  } while (0)
