// Batched launches: one kernel grid over the items (blocks, chunks) of several tensors, so a
// step's many small tensors cost a few launches instead of one each, and the blocks of one
// tensor overlap with those of the next instead of each launch ramping up and draining on its
// own. The host lays the members' items end to end (first[t]: member t's first item, first[num]
// one past the last); each block finds its member with batch_member. Used by the multi-tensor
// sum of squares (kernels/sum_squares.cu), the batched 128x128 weight quantizer
// (kernels/quantize_fp_block_128x128.cu) and AdamW (kernels/adamw.cu).
#pragma once

#include <cstdint>

#include "precision/host_device.h"

namespace gnmr {

// The member holding item `index` (0 <= index < first[num]): the t in [0, num) with
// first[t] <= index < first[t + 1]. first: num + 1 non-decreasing offsets, first[0] <= index.
// A member without items (first[t] == first[t + 1]) is never returned. A binary search: a few
// reads of the batch for any num.
GNMR_HD_INLINE int batch_member(const int64_t* first, int num, int64_t index) {
  int lo = 0, hi = num;  // first[lo] <= index < first[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (first[mid] <= index) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace gnmr
