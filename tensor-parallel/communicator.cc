#include "tensor-parallel/communicator.h"

// The interface is header-only; this file anchors the library target.
