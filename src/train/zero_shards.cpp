#include "train/zero_shards.h"

#include <algorithm>

#include "util/error.h"

namespace gnmr {

int64_t param_numel(const ParamInfo& param) {
  int64_t n = 1;
  for (int64_t d : param.shape) n *= d;
  return n;
}

int64_t flat_elements_of(const std::vector<ParamInfo>& params) {
  int64_t end = 0;
  for (const ParamInfo& p : params) {
    end = std::max(
        end, (p.offset + param_numel(p) + kZeroShardAlign - 1) / kZeroShardAlign * kZeroShardAlign);
  }
  return end;
}

ZeroShardLayout make_zero_shard_layout(const std::vector<ParamInfo>& params, int64_t flat_elements,
                                       int world_size) {
  GNMR_CHECK(world_size >= 1, "ZeRO shard layout: world size " + std::to_string(world_size));
  ZeroShardLayout layout;
  layout.world_size = world_size;
  layout.flat_elements = flat_elements;
  const int64_t per_rank = (flat_elements + world_size - 1) / world_size;
  layout.shard_elements = (per_rank + kZeroShardAlign - 1) / kZeroShardAlign * kZeroShardAlign;
  layout.pieces.resize(size_t(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    const int64_t shard_begin = layout.shard_begin(rank);
    const int64_t shard_end = shard_begin + layout.shard_elements;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t begin = std::max(params[i].offset, shard_begin);
      const int64_t end = std::min(params[i].offset + param_numel(params[i]), shard_end);
      GNMR_CHECK(params[i].offset + param_numel(params[i]) <= flat_elements,
                 "ZeRO shard layout: parameter " + params[i].name + " ends past the flat buffer");
      if (begin >= end) continue;
      layout.pieces[size_t(rank)].push_back(
          {int(i), begin - params[i].offset, end - begin, begin - shard_begin});
    }
  }
  return layout;
}

}  // namespace gnmr
