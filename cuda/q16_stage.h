// Where the quantised-activation matmul (cuda_qmatvec_kernels.cu) puts weight rows in shared
// memory, as code that compiles for the host and the GPU, so that a host test
// (cuda/tests/q16_dot_test.cc, Q16Stage) can replay every thread's copies and every lane's
// reads of a stage and check that each weight block is read back byte for byte.
//
// A thread block takes R = kThreads / G rows; a stage holds, per row, the chunk of `chunk`
// blocks it works on next, copied as 16-byte units: the chunk's bytes [start, start + n)
// are covered by units from start rounded down to 16, so row r's copy begins at
// r * upr * 16 + start % 16 in the stage, upr units a row (the most a chunk can span).
// Thread t copies units t, t + kThreads, ... of the stage: unit u is row u / upr's unit
// u % upr. Pure functions, thread-safe.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "cuda/q16_dot.h"

namespace specnode::q16 {

inline constexpr int kStageThreads = 128;  // threads of a matmul thread block

// 16-byte units a row's stage holds: enough for `chunk_blocks` blocks at any start.
SPECNODE_Q16_HD int UnitsPerRow(int chunk_blocks, int block_bytes) {
  return (chunk_blocks * block_bytes + 15) / 16 + 1;
}

// Units that cover `bytes` bytes from address `start`.
SPECNODE_Q16_HD int UnitsCovering(uintptr_t start, size_t bytes) {
  return static_cast<int>(((start & 15u) + bytes + 15) / 16);
}

// The stage's units for one type: R rows of UnitsPerRow(kPerLane G, bytes) with R G =
// kStageThreads, R <= 32, bounded for every G in 4..32 (UnitsPerRow <= per_lane G bytes
// / 16 + 2).
SPECNODE_Q16_HD constexpr int StageUnits(int per_lane, int block_bytes) {
  return kStageThreads * per_lane * block_bytes / 16 + 2 * 32;
}

// Unit u of the stage: row *r's unit *unit.
SPECNODE_Q16_HD void StageSlot(int u, int upr, int* r, int* unit) {
  *r = u / upr;
  *unit = u - *r * upr;
}

// Offset in the stage of the first byte of local row r's chunk that starts at `start`.
SPECNODE_Q16_HD size_t StagedRowOffset(int r, int upr, uintptr_t start) {
  return static_cast<size_t>(r) * upr * 16 + (start & 15u);
}

}  // namespace specnode::q16
