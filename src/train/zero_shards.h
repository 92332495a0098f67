// ZeRO-1 shard layout (docs/DESIGN.md §7): which part of the flat parameter vector each rank
// owns. The model's flat weight / gradient buffers (ParamInfo::offset, ParamTable::flat_size)
// are cut into world_size contiguous shards of equal size; rank r owns shard r, i.e. flat
// elements [r * shard_elements, (r + 1) * shard_elements). Equal shards let reduce-scatter
// and all-gather move one block per rank; the last shard runs past flat_size by
// padding_elements(), and the model allocates its flat buffers that long (padded_elements()).
//
// A shard holds whole parameters and at most two partial ones (where it starts and ends);
// ShardPiece says which elements of which parameter. The gaps between parameters (each starts
// on a 64-element boundary) belong to shards too and stay zero.
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_table.h"

namespace gnmr {

// Shards are a whole number of these elements (256 bytes), so every shard starts aligned like
// the parameters do.
constexpr int64_t kZeroShardAlign = 64;

// Elements [param_begin, param_begin + count) of parameter param_index, stored at
// shard_offset elements into the owning rank's shard.
struct ShardPiece {
  int param_index = 0;
  int64_t param_begin = 0;
  int64_t count = 0;
  int64_t shard_offset = 0;
};

struct ZeroShardLayout {
  int world_size = 1;
  int64_t flat_elements = 0;                    // ParamTable::flat_size
  int64_t shard_elements = 0;                   // per rank, a multiple of kZeroShardAlign
  std::vector<std::vector<ShardPiece>> pieces;  // [rank]: the shard's pieces, by flat offset

  int64_t padded_elements() const { return shard_elements * world_size; }
  int64_t padding_elements() const { return padded_elements() - flat_elements; }
  int64_t shard_begin(int rank) const { return int64_t(rank) * shard_elements; }
};

// The layout of `params` (offsets and shapes as build_param_table gives them) over
// world_size ranks: shard_elements = flat_elements / world_size rounded up to
// kZeroShardAlign, so the padding is under world_size * kZeroShardAlign elements.
ZeroShardLayout make_zero_shard_layout(const std::vector<ParamInfo>& params, int64_t flat_elements,
                                       int world_size);

// Elements of parameter `param`'s shape (product of ParamInfo::shape).
int64_t param_numel(const ParamInfo& param);

// ParamTable::flat_size recomputed from the parameters (the last one's end, rounded up to the
// 64-element alignment build_param_table uses), for code that holds params() only.
int64_t flat_elements_of(const std::vector<ParamInfo>& params);

}  // namespace gnmr
