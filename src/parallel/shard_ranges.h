// The ZeRO-1 collectives' index rules (docs/DESIGN.md §7), shared by the MPI and NCCL
// communicators: a reduce-scatter or all-gather tensor is F32 [world * shard], shard r being
// elements [r * shard, (r + 1) * shard), owned by rank r; a gradient bucket [begin, end) of it
// meets one or more shards, and each piece it has in a shard is reduced to that shard's owner.
// Plain functions of plain data, tested on the CPU (tests/parallel/test_shard_ranges.cpp), so the
// GPU path's roots, offsets and counts are checked on a machine without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace gnmr {

// Elements [begin, end) of the flat buffer, inside the shard of rank `owner`.
struct ShardRange {
  int owner = 0;
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
};

// The pieces of [begin, end) in each shard of a world of `world` ranks holding `shard`
// elements each, in rank order, empty pieces left out: together exactly [begin, end).
// Requires world >= 1, shard >= 0, 0 <= begin <= end <= world * shard (std::invalid_argument
// otherwise).
std::vector<ShardRange> shard_ranges_of(int64_t shard, int world, int64_t begin, int64_t end);

// The shard size of a reduce-scatter / all-gather tensor: F32, split evenly over the world.
// Error(Runtime) naming `op` and the tensor's shape when it is not (the caller pads the buffer,
// train/zero_shards.h).
size_t shard_elements(const Tensor& tensor, int world_size, const char* op);

// Error(Runtime) naming `op` when [begin, end) is not a range of tensor's elements.
void check_element_range(const Tensor& tensor, int64_t begin, int64_t end, const char* op);

}  // namespace gnmr
