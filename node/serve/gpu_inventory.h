// The GPUs ranks will see, for `serve --check-config`'s layout check (gpu_layout.h): this
// host's, as the CUDA runtime reports them, or N per node for planning on a machine
// without them. Both read this process's CUDA_VISIBLE_DEVICES, which the documented launch
// forwards to every rank (mpirun -x; docs/serving.md, "Multi-node GPU launch").
#pragma once

#include "absl/status/statusor.h"
#include "node/serve/gpu_layout.h"

namespace specnode {

// This host: cudaGetDeviceCount (CUDA_VISIBLE_DEVICES applied) in a CUDA build, 0 GPUs
// with the runtime's reason when it has none ("no CUDA device: ..."), 0 in a build without
// the CUDA backend (said in `origin`). InvalidArgument for a repeated CUDA_VISIBLE_DEVICES
// entry.
absl::StatusOr<NodeGpus> ThisHostGpus();

// A node with `gpus` GPUs under this process's CUDA_VISIBLE_DEVICES (`--gpus-per-node`).
absl::StatusOr<NodeGpus> PlannedNodeGpus(int gpus);

}  // namespace specnode
