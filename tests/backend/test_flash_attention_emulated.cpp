// The flash-attention kernels' device code run on the host (tests/emulated_cuda/emulated_cuda.h:
// every block in turn, its threads as fibers, barriers for __syncthreads and for a warp's
// exchanges, shared memory filled with NaN before each block). The code is what lies between the
// "device code" markers of the .cu files, rewritten by extract_device_code.sh.
// - The SIMT kernels (kernels/flash_attention.cu), with the host's expf / logf, follow the CPU
//   twin (cpu/flash_attention.cpp) in the order of every operation, so out, lse, dq, dk and dv
//   must equal the twin's bit for bit.
// - The tensor-core forward (kernels/flash_attention_mma.cu) runs on an emulated mma whose
//   fragments follow src/backend/mma_fragment.h (checked against the PTX ISA by
//   test_mma_fragment.cpp); out must lie within the bf16 bound of attention_bf16_reference.h and
//   lse within fp32 rounding of it; the backward's dq, dk and dv within the bounds of its
//   gradients, after its first pass, whose dout codes must be encode_bf16's and whose delta
//   must lie within fp32 rounding of the exact dot product.
// An indexing, tiling, masking, fragment or barrier error shows up here, without a GPU. What
// only a GPU can check (launch configuration, the hardware's mma and shuffles, CUDA's expf) is
// tests/gpu/test_gpu_flash_attention.cpp's job.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_bf16_reference.h"
#include "backend/cpu/flash_attention.h"
#include "backend/flash_layout.h"
#include "backend/mma_fragment.h"
#include "backend/wgmma_operand.h"
#include "emulated_cuda/emulated_cuda.h"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

#include "flash_attention_device_code.inc"
#include "flash_attention_mma_device_code.inc"

std::vector<float> random_normal(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) * scale;
  return x;
}

// The bf16 copies the host side of the tensor-core kernels makes (convert_to_bf16) before they
// run: each element's encode_bf16.
std::vector<uint16_t> bf16_codes(const std::vector<float>& x) {
  std::vector<uint16_t> codes(x.size());
  for (size_t i = 0; i < x.size(); ++i) codes[i] = encode_bf16(x[i]);
  return codes;
}

size_t count_bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differ;
}

template <int HD>
void expect_kernels_equal_the_twin(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads) {
  const AttentionShape s{batch, seq, heads, kv_heads, HD};
  SCOPED_TRACE("B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
               " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
               " hd=" + std::to_string(HD));
  const size_t nq = size_t(batch * seq * heads * HD), nkv = size_t(batch * seq * kv_heads * HD);
  const size_t rows = size_t(batch * heads * seq);
  // q scaled by 2: scores spread enough for the running max to move across key tiles.
  const std::vector<float> q = random_normal(nq, 1, 2.0f), k = random_normal(nkv, 2, 1.0f),
                           v = random_normal(nkv, 3, 1.0f), dout = random_normal(nq, 4, 1.0f);
  const float nan = std::nanf("");
  std::vector<float> out(nq, nan), lse(rows, nan), delta(rows, nan), dq(nq, nan), dk(nkv, nan),
      dv(nkv, nan);
  const FlashTiling tiles = flash_gpu_tiling(seq);
  const FlashDims d{batch, seq, heads, kv_heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const auto shared = [&](FlashKernel kernel) {
    return flash_shared_layout(kernel, HD, tiles).total_floats;
  };
  const auto blocks = [&](FlashKernel kernel) {
    return flash_grid_blocks(kernel, batch, heads, kv_heads, tiles);
  };
  emulated_launch(blocks(FlashKernel::Forward), kFlashThreads, shared(FlashKernel::Forward), [&] {
    flash_forward_kernel<HD>(q.data(), k.data(), v.data(), out.data(), lse.data(), d, tiles, scale);
  });
  emulated_launch((int64_t(rows) + kFlashThreads - 1) / kFlashThreads, kFlashThreads, 0,
                  [&] { flash_delta_kernel<HD>(out.data(), dout.data(), delta.data(), d); });
  emulated_launch(blocks(FlashKernel::BackwardKeyValue), kFlashThreads,
                  shared(FlashKernel::BackwardKeyValue), [&] {
                    flash_backward_key_value_kernel<HD>(q.data(), k.data(), v.data(), lse.data(),
                                                        delta.data(), dout.data(), dk.data(),
                                                        dv.data(), d, tiles, scale);
                  });
  emulated_launch(
      blocks(FlashKernel::BackwardQuery), kFlashThreads, shared(FlashKernel::BackwardQuery), [&] {
        flash_backward_query_kernel<HD>(q.data(), k.data(), v.data(), lse.data(), delta.data(),
                                        dout.data(), dq.data(), d, tiles, scale);
      });

  std::vector<float> twin_out(nq), twin_lse(rows), twin_dq(nq), twin_dk(nkv), twin_dv(nkv);
  cpu::flash_attention_forward(q.data(), k.data(), v.data(), twin_out.data(), twin_lse.data(), s,
                               tiles, 1);
  cpu::flash_attention_backward(q.data(), k.data(), v.data(), twin_out.data(), twin_lse.data(),
                                dout.data(), twin_dq.data(), twin_dk.data(), twin_dv.data(), s,
                                tiles, 1);
  EXPECT_EQ(count_bit_differences(out, twin_out), 0u) << "out";
  EXPECT_EQ(count_bit_differences(lse, twin_lse), 0u) << "lse";
  EXPECT_EQ(count_bit_differences(dq, twin_dq), 0u) << "dq";
  EXPECT_EQ(count_bit_differences(dk, twin_dk), 0u) << "dk";
  EXPECT_EQ(count_bit_differences(dv, twin_dv), 0u) << "dv";
}

TEST(FlashAttentionEmulated, KernelsEqualTheCpuTwinBitForBit) {
  expect_kernels_equal_the_twin<64>(2, 1, 4, 2);     // one key
  expect_kernels_equal_the_twin<64>(2, 17, 8, 2);    // one partial tile, GQA group of 4
  expect_kernels_equal_the_twin<64>(1, 130, 4, 4);   // two full tiles and a partial one
  expect_kernels_equal_the_twin<128>(1, 200, 4, 2);  // hd 128, partial last tile of 8
  expect_kernels_equal_the_twin<128>(1, 64, 2, 1);   // exactly one tile, all heads share kv
}

// The tensor-core forward as flash_attention_forward_mma launches it, with query tiles of
// `query_tile` rows (64 or 128), on the bf16 codes of q, k, v; out and lse written.
template <int HD>
void launch_mma_forward(const std::vector<uint16_t>& qb, const std::vector<uint16_t>& kb,
                        const std::vector<uint16_t>& vb, std::vector<float>& out,
                        std::vector<float>& lse, const FlashDims& d, int64_t query_tile) {
  const FlashTiling tiles = flash_mma_query_tiling(d.seq, query_tile);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  // Shared memory in floats: the bf16 tiles' bytes rounded up.
  const int64_t shared_floats = (flash_mma_shared_bytes(FlashKernel::Forward, HD, tiles) + 3) / 4;
  const int64_t blocks =
      flash_grid_blocks(FlashKernel::Forward, d.batch, d.heads, d.kv_heads, tiles);
  emulated_launch(blocks, kFlashMmaThreads, shared_floats, [&] {
    if (query_tile == 2 * kFlashQTile) {
      flash_forward_mma_kernel<HD, 2>(qb.data(), kb.data(), vb.data(), out.data(), lse.data(), d,
                                      tiles, scale);
    } else {
      flash_forward_mma_kernel<HD, 1>(qb.data(), kb.data(), vb.data(), out.data(), lse.data(), d,
                                      tiles, scale);
    }
  });
}

// The tensor-core forward against the double-precision reference of the bf16-rounded inputs,
// and, as the SIMT kernel, every output written (NaN-poisoned before) and the same bits twice;
// and the same bits from 64- and 128-row query tiles (each row takes the same key tiles in the
// same order; the 128-row tile's first half skips the key tile past its queries).
template <int HD>
void expect_mma_forward_within_the_bf16_bound(int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads) {
  const AttentionShape s{batch, seq, heads, kv_heads, HD};
  SCOPED_TRACE("B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
               " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
               " hd=" + std::to_string(HD));
  const size_t nq = size_t(batch * seq * heads * HD), nkv = size_t(batch * seq * kv_heads * HD);
  const size_t rows = size_t(batch * heads * seq);
  const std::vector<float> q = random_normal(nq, 11, 2.0f), k = random_normal(nkv, 12, 1.0f),
                           v = random_normal(nkv, 13, 1.0f);
  const std::vector<uint16_t> qb = bf16_codes(q), kb = bf16_codes(k), vb = bf16_codes(v);
  const FlashDims d{batch, seq, heads, kv_heads};
  const auto run = [&](std::vector<float>& out, std::vector<float>& lse, int64_t query_tile) {
    out.assign(nq, std::nanf(""));
    lse.assign(rows, std::nanf(""));
    launch_mma_forward<HD>(qb, kb, vb, out, lse, d, query_tile);
  };
  const int64_t other_tile = kFlashMmaForwardQueryTile == 128 ? 64 : 128;
  std::vector<float> out, lse, out_again, lse_again, out_other, lse_other;
  run(out, lse, kFlashMmaForwardQueryTile);
  run(out_again, lse_again, kFlashMmaForwardQueryTile);
  run(out_other, lse_other, other_tile);
  const attention_bf16_reference::Reference ref = attention_bf16_reference::reference(q, k, v, s);
  EXPECT_EQ(attention_bf16_reference::out_violations(out, ref), "");
  EXPECT_EQ(attention_bf16_reference::lse_violations(lse, ref), "");
  EXPECT_EQ(count_bit_differences(out, out_again), 0u) << "out differs between two runs";
  EXPECT_EQ(count_bit_differences(lse, lse_again), 0u) << "lse differs between two runs";
  EXPECT_EQ(count_bit_differences(out, out_other), 0u)
      << "out differs with " << other_tile << "-row query tiles";
  EXPECT_EQ(count_bit_differences(lse, lse_other), 0u)
      << "lse differs with " << other_tile << "-row query tiles";
}

TEST(FlashAttentionEmulated, TensorCoreForwardIsWithinTheBf16BoundOfTheReference) {
  // Small head counts: every emulated mma is two barriers of 32 threads, the cost of this test.
  expect_mma_forward_within_the_bf16_bound<64>(2, 1, 4, 2);    // one key
  expect_mma_forward_within_the_bf16_bound<64>(1, 17, 8, 2);   // one partial tile, GQA 4
  expect_mma_forward_within_the_bf16_bound<64>(1, 130, 2, 1);  // two full tiles and 2 rows
  expect_mma_forward_within_the_bf16_bound<128>(1, 70, 2, 2);  // hd 128, last tile of 6 rows
  expect_mma_forward_within_the_bf16_bound<128>(1, 64, 2, 1);  // exactly one tile
  // Three full 64-row tiles: pairs (1, 0), (2, 0), (2, 1) skip the mask (flash_tile_needs_mask);
  // in 128-row tiles, a full one and a half one whose last two warps have no rows.
  expect_mma_forward_within_the_bf16_bound<128>(1, 192, 2, 1);
  // Two full 128-row tiles: pairs (1, 0) and (1, 1) unmasked, and on (1, 3) and (0, 1) the first
  // half's warps skip their math.
  expect_mma_forward_within_the_bf16_bound<64>(1, 256, 2, 1);
}

// The wgmma forward (flash_forward_wgmma_kernel, sm_90a's warpgroup MMA, emulated by
// emulated_cuda.h through src/backend/wgmma_operand.h's descriptors), with query tiles of 64 and
// 128 rows, against the 64-row mma.sync forward: the same bits, since both emulated instructions
// sum each output's 16 products and its accumulator in double in the same k order, and the kernels
// share the softmax and the output. A wrong tile layout, descriptor, fragment or pipeline step
// moves some output; every output is NaN-poisoned before, so one left unwritten differs too.
template <int HD>
void expect_wgmma_forward_gives_the_mma_bits(int64_t batch, int64_t seq, int64_t heads,
                                             int64_t kv_heads) {
  SCOPED_TRACE("B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
               " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
               " hd=" + std::to_string(HD));
  const size_t nq = size_t(batch * seq * heads * HD), nkv = size_t(batch * seq * kv_heads * HD);
  const size_t rows = size_t(batch * heads * seq);
  const std::vector<uint16_t> qb = bf16_codes(random_normal(nq, 21, 2.0f)),
                              kb = bf16_codes(random_normal(nkv, 22, 1.0f)),
                              vb = bf16_codes(random_normal(nkv, 23, 1.0f));
  const FlashDims d{batch, seq, heads, kv_heads};
  std::vector<float> out(nq, std::nanf("")), lse(rows, std::nanf(""));
  launch_mma_forward<HD>(qb, kb, vb, out, lse, d, kFlashQTile);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  for (const int64_t query_tile : {kFlashQTile, 2 * kFlashQTile}) {
    SCOPED_TRACE("query tiles of " + std::to_string(query_tile) + " rows");
    std::vector<float> wgmma_out(nq, std::nanf("")), wgmma_lse(rows, std::nanf(""));
    const FlashTiling tiles = flash_mma_query_tiling(seq, query_tile);
    const int64_t shared_floats =
        (flash_wgmma_shared_layout(HD, int(query_tile)).total_bytes + 3) / 4;
    emulated_launch(
        flash_grid_blocks(FlashKernel::Forward, batch, heads, kv_heads, tiles), kFlashMmaThreads,
        shared_floats, [&] {
          if (query_tile == kFlashQTile) {
            flash_forward_wgmma_kernel<HD, 1>(qb.data(), kb.data(), vb.data(), wgmma_out.data(),
                                              wgmma_lse.data(), d, tiles, scale);
          } else {
            flash_forward_wgmma_kernel<HD, 2>(qb.data(), kb.data(), vb.data(), wgmma_out.data(),
                                              wgmma_lse.data(), d, tiles, scale);
          }
        });
    EXPECT_EQ(count_bit_differences(wgmma_out, out), 0u) << "out";
    EXPECT_EQ(count_bit_differences(wgmma_lse, lse), 0u) << "lse";
  }
}

TEST(FlashAttentionEmulated, WgmmaForwardGivesTheMmaForwardsBits) {
  expect_wgmma_forward_gives_the_mma_bits<64>(2, 1, 4, 2);     // one key: warps 1-3 have no rows
  expect_wgmma_forward_gives_the_mma_bits<64>(1, 17, 8, 2);    // one partial tile, GQA 4
  expect_wgmma_forward_gives_the_mma_bits<64>(1, 130, 2, 1);   // two full tiles and 2 rows
  expect_wgmma_forward_gives_the_mma_bits<128>(1, 70, 2, 2);   // hd 128, last tile of 6 rows
  expect_wgmma_forward_gives_the_mma_bits<128>(1, 192, 2, 1);  // 128 rows: a full and a half tile
  // Two full 128-row tiles: the first slab skips the last key tile of each.
  expect_wgmma_forward_gives_the_mma_bits<64>(1, 256, 2, 1);
}

// The tensor-core backward (its dK/dV and dQ passes, after the emulated tensor-core forward and
// the SIMT delta kernel, as flash_attention_backward_mma runs them) against the gradients of
// the bf16 reference, within their derived bounds; every output written (NaN-poisoned before).
template <int HD>
void expect_mma_backward_within_the_bounds(int64_t batch, int64_t seq, int64_t heads,
                                           int64_t kv_heads) {
  const AttentionShape s{batch, seq, heads, kv_heads, HD};
  SCOPED_TRACE("B=" + std::to_string(batch) + " T=" + std::to_string(seq) +
               " H=" + std::to_string(heads) + " Hkv=" + std::to_string(kv_heads) +
               " hd=" + std::to_string(HD));
  const size_t nq = size_t(batch * seq * heads * HD), nkv = size_t(batch * seq * kv_heads * HD);
  const size_t rows = size_t(batch * heads * seq);
  const std::vector<float> q = random_normal(nq, 31, 2.0f), k = random_normal(nkv, 32, 1.0f),
                           v = random_normal(nkv, 33, 1.0f), dout = random_normal(nq, 34, 1.0f);
  const std::vector<uint16_t> qb = bf16_codes(q), kb = bf16_codes(k), vb = bf16_codes(v);
  const FlashTiling tiles = flash_gpu_tiling(seq);
  const FlashDims d{batch, seq, heads, kv_heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const float nan = std::nanf("");
  std::vector<float> out(nq, nan), lse(rows, nan), delta(rows, nan), dq(nq, nan), dk(nkv, nan),
      dv(nkv, nan);
  std::vector<uint16_t> doutb(nq, 0x7FC1);  // a NaN code: every one must be overwritten
  const auto shared_floats = [&](FlashKernel kernel) {
    return (flash_mma_shared_bytes(kernel, HD, tiles) + 3) / 4;
  };
  const auto blocks = [&](FlashKernel kernel) {
    return flash_grid_blocks(kernel, batch, heads, kv_heads, tiles);
  };
  launch_mma_forward<HD>(qb, kb, vb, out, lse, d, kFlashMmaForwardQueryTile);
  // The backward's first pass: delta, and dout's bf16 codes (encode_bf16's, every one), kernel
  // rows of 4 warps x 4 rows.
  const int64_t delta_rows_per_block = kFlashMmaWarps * (kWarpSize / kFlashDeltaLanes);
  emulated_launch((int64_t(rows) + delta_rows_per_block - 1) / delta_rows_per_block,
                  kFlashMmaThreads, 0, [&] {
                    flash_delta_and_dout_bf16_kernel<HD>(out.data(), dout.data(), delta.data(),
                                                         doutb.data(), d);
                  });
  EXPECT_TRUE(doutb == bf16_codes(dout)) << "dout's bf16 codes";
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        // delta = dout . out of the row, in double; fp32 products and sums: within HD 2^-23
        // of the sum of the products' magnitudes.
        double dot = 0.0, magnitude = 0.0;
        for (int64_t e = 0; e < HD; ++e) {
          const size_t i = size_t(flash_q_offset(d, b, t, h, HD) + e);
          dot += double(dout[i]) * out[i];
          magnitude += std::fabs(double(dout[i]) * out[i]);
        }
        const float got = delta[size_t(flash_stat_offset(d, b, h, t))];
        ASSERT_LE(std::fabs(got - dot), HD * std::ldexp(magnitude, -23) + 1e-30)
            << "delta of b " << b << " t " << t << " h " << h;
      }
    }
  }
  emulated_launch(blocks(FlashKernel::BackwardKeyValue), kFlashMmaThreads,
                  shared_floats(FlashKernel::BackwardKeyValue), [&] {
                    flash_backward_key_value_mma_kernel<HD>(qb.data(), kb.data(), vb.data(),
                                                            lse.data(), delta.data(), doutb.data(),
                                                            dk.data(), dv.data(), d, tiles, scale);
                  });
  // The dq pass at the backend's query tile and, at hd 64, the other: the same bits.
  const auto run_dq_pass = [&](std::vector<float>& out_dq, int64_t query_tile) {
    out_dq.assign(nq, nan);
    const FlashTiling q_tiles = flash_mma_query_tiling(seq, query_tile);
    emulated_launch(flash_grid_blocks(FlashKernel::BackwardQuery, batch, heads, kv_heads, q_tiles),
                    kFlashMmaThreads,
                    (flash_mma_shared_bytes(FlashKernel::BackwardQuery, HD, q_tiles) + 3) / 4, [&] {
                      if (query_tile == 2 * kFlashQTile) {
                        flash_backward_query_mma_kernel<HD, 2>(
                            qb.data(), kb.data(), vb.data(), lse.data(), delta.data(), doutb.data(),
                            out_dq.data(), d, q_tiles, scale);
                      } else {
                        flash_backward_query_mma_kernel<HD, 1>(
                            qb.data(), kb.data(), vb.data(), lse.data(), delta.data(), doutb.data(),
                            out_dq.data(), d, q_tiles, scale);
                      }
                    });
  };
  const int64_t dq_tile = flash_mma_query_pass_tile(HD);
  run_dq_pass(dq, dq_tile);
  if (HD == 64) {
    std::vector<float> dq_other;
    run_dq_pass(dq_other, dq_tile == 64 ? 128 : 64);
    EXPECT_EQ(count_bit_differences(dq, dq_other), 0u) << "dq differs with the other query tile";
  }
  // The dK/dV pass on wgmma (flash_backward_key_value_wgmma_kernel): the mma kernel's bits.
  {
    std::vector<float> wgmma_dk(nkv, nan), wgmma_dv(nkv, nan);
    emulated_launch(blocks(FlashKernel::BackwardKeyValue), kFlashMmaThreads,
                    (flash_wgmma_key_value_layout(HD).total_bytes + 3) / 4, [&] {
                      flash_backward_key_value_wgmma_kernel<HD>(
                          qb.data(), kb.data(), vb.data(), lse.data(), delta.data(), doutb.data(),
                          wgmma_dk.data(), wgmma_dv.data(), d, tiles, scale);
                    });
    EXPECT_EQ(count_bit_differences(wgmma_dk, dk), 0u) << "dk of the wgmma dk/dv pass";
    EXPECT_EQ(count_bit_differences(wgmma_dv, dv), 0u) << "dv of the wgmma dk/dv pass";
  }
  // The dQ pass on wgmma (flash_backward_query_wgmma_kernel) at each tile it takes: the mma
  // kernel's bits, since the emulated instructions sum alike (every output NaN-poisoned before).
  for (const int64_t wgmma_tile : {kFlashQTile, 2 * kFlashQTile}) {
    if (wgmma_tile == 2 * kFlashQTile && HD != 64) continue;
    std::vector<float> wgmma_dq(nq, nan);
    const FlashTiling q_tiles = flash_mma_query_tiling(seq, wgmma_tile);
    emulated_launch(
        flash_grid_blocks(FlashKernel::BackwardQuery, batch, heads, kv_heads, q_tiles),
        kFlashMmaThreads,
        (flash_wgmma_shared_layout(HD, int(wgmma_tile), true).total_bytes + 3) / 4, [&] {
          if (wgmma_tile == 2 * kFlashQTile) {
            flash_backward_query_wgmma_kernel<HD, 2>(qb.data(), kb.data(), vb.data(), lse.data(),
                                                     delta.data(), doutb.data(), wgmma_dq.data(), d,
                                                     q_tiles, scale);
          } else {
            flash_backward_query_wgmma_kernel<HD, 1>(qb.data(), kb.data(), vb.data(), lse.data(),
                                                     delta.data(), doutb.data(), wgmma_dq.data(), d,
                                                     q_tiles, scale);
          }
        });
    EXPECT_EQ(count_bit_differences(wgmma_dq, dq), 0u)
        << "the wgmma dq pass at " << wgmma_tile << "-row tiles";
  }
  namespace ref = attention_bf16_reference;
  const ref::Gradients want = ref::backward_reference(q, k, v, dout, s);
  EXPECT_EQ(ref::violations("dq", dq, want.dq, want.dq_bound), "");
  EXPECT_EQ(ref::violations("dk", dk, want.dk, want.dk_bound), "");
  EXPECT_EQ(ref::violations("dv", dv, want.dv, want.dv_bound), "");
}

TEST(FlashAttentionEmulated, TensorCoreBackwardIsWithinTheBoundsOfTheReferenceGradients) {
  expect_mma_backward_within_the_bounds<64>(2, 1, 2, 1);    // one key
  expect_mma_backward_within_the_bounds<64>(1, 17, 8, 2);   // one partial tile, GQA 4
  expect_mma_backward_within_the_bounds<64>(1, 130, 2, 1);  // two full tiles and 2 rows
  expect_mma_backward_within_the_bounds<128>(1, 70, 2, 2);  // hd 128, last tile of 6 rows
  expect_mma_backward_within_the_bounds<128>(1, 192, 2,
                                             1);  // unmasked pairs (1, 0), (2, 0), (2, 1)
  // Two full 128-row query tiles at hd 64 (the dq pass's tile there): unmasked pairs, and the
  // first half's warps skipping the last key tile.
  expect_mma_backward_within_the_bounds<64>(1, 256, 2, 1);
}

// The bound is tight enough to catch a wrong key: the same kernel with one key row of v
// changed by 10 after the fact (as a kernel that read the wrong row would see) fails it.
TEST(FlashAttentionEmulated, TheBf16BoundRejectsAnOutputOfTheWrongKeys) {
  const AttentionShape s{1, 70, 2, 1, 64};
  const size_t nq = size_t(70 * 2 * 64), nkv = size_t(70 * 64);
  const std::vector<float> q = random_normal(nq, 21, 2.0f), k = random_normal(nkv, 22, 1.0f),
                           v = random_normal(nkv, 23, 1.0f);
  std::vector<float> v_shifted = v;
  for (int d = 0; d < 64; ++d) v_shifted[size_t(65 * 64 + d)] += 10.0f;  // key 65, second tile
  const std::vector<uint16_t> qb = bf16_codes(q), kb = bf16_codes(k),
                              vb_shifted = bf16_codes(v_shifted);
  const FlashDims dims{1, 70, 2, 1};
  std::vector<float> out(nq, std::nanf("")), lse(size_t(2 * 70), std::nanf(""));
  launch_mma_forward<64>(qb, kb, vb_shifted, out, lse, dims, kFlashMmaForwardQueryTile);
  const attention_bf16_reference::Reference ref = attention_bf16_reference::reference(q, k, v, s);
  EXPECT_NE(attention_bf16_reference::out_violations(out, ref), "");
  EXPECT_EQ(attention_bf16_reference::lse_violations(lse, ref), "");  // lse does not read v
}

}  // namespace
}  // namespace gnmr::cuda
