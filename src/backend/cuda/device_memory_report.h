// What the CUDA backend says when a config does not fit on the GPU: the allocation that
// failed, what is already held by role, and what the device has. Plain host code (tested on
// CPU); docs/DESIGN.md §6.
#pragma once

#include <cstddef>
#include <string>

#include "backend/backend.h"

namespace gnmr {

// "GiB" figures with two decimals, e.g. "1.50 GiB".
std::string format_gib(size_t bytes);

// "cuda backend: out of device memory allocating blocks.3.mlp.act (256.00 MiB ...)": names the
// tensor, its size, what is held by role, the device's free and total bytes, and what to change.
std::string device_out_of_memory_message(const std::string& name, size_t bytes,
                                         const MemoryUse& held, size_t device_free,
                                         size_t device_total);

}  // namespace gnmr
