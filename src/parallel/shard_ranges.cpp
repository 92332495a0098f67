#include "parallel/shard_ranges.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "util/error.h"

namespace gnmr {

std::vector<ShardRange> shard_ranges_of(int64_t shard, int world, int64_t begin, int64_t end) {
  if (world < 1 || shard < 0 || begin < 0 || begin > end || end > int64_t(world) * shard) {
    throw std::invalid_argument("shard_ranges_of: [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") is not a range of " +
                                std::to_string(world) + " shards of " + std::to_string(shard) +
                                " elements");
  }
  std::vector<ShardRange> ranges;
  if (begin == end) return ranges;
  // Only the owners the range can meet: from the shard holding `begin` to the one holding
  // end - 1.
  for (int64_t r = begin / shard; r < world && r * shard < end; ++r) {
    const int64_t lo = std::max(begin, r * shard), hi = std::min(end, (r + 1) * shard);
    if (hi > lo) ranges.push_back(ShardRange{int(r), lo, hi});
  }
  return ranges;
}

size_t shard_elements(const Tensor& tensor, int world_size, const char* op) {
  GNMR_CHECK(tensor.dtype == DType::F32,
             std::string(op) + " takes F32 tensors, got " + dtype_name(tensor.dtype));
  const auto count = static_cast<size_t>(tensor.numel());
  GNMR_CHECK(count % size_t(world_size) == 0,
             std::string(op) + ": " + tensor.shape_string() + " does not split into " +
                 std::to_string(world_size) + " equal shards (pad it, train/zero_shards.h)");
  GNMR_CHECK(count == 0 || tensor.data != nullptr, std::string(op) + " of an unallocated tensor");
  return count / size_t(world_size);
}

void check_element_range(const Tensor& tensor, int64_t begin, int64_t end, const char* op) {
  GNMR_CHECK(begin >= 0 && begin <= end && end <= tensor.numel(),
             std::string(op) + ": [" + std::to_string(begin) + ", " + std::to_string(end) +
                 ") is not a range of " + tensor.shape_string());
}

}  // namespace gnmr
