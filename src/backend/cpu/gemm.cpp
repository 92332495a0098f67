// Row-major GEMM through the BLAS (OpenBLAS cblas_sgemm / cblas_dgemm).
// The CPU backend runs the BLAS single-threaded and splits the rows of C over its own
// OpenMP threads, so per-(batch, head) attention GEMMs can run inside a parallel region.
#include <cblas.h>

#include <algorithm>

#include "backend/cpu/ops.h"

namespace gnmr {
namespace cpu {

namespace {

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void gemm_parallel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, int threads) {
  // Blocks of whole 16-row panels; tiny problems stay on one thread.
  const int64_t panels = (m + 15) / 16;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, panels)));
  if (blocks == 1 || m * n * k < (int64_t{1} << 18)) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#pragma omp parallel for num_threads(blocks) schedule(static, 1)
  for (int block = 0; block < blocks; ++block) {
    const int64_t row0 = panels * block / blocks * 16;
    const int64_t row1 = std::min(m, panels * (block + 1) / blocks * 16);
    if (row1 <= row0) continue;
    // Rows of op(A): row i of A when not transposed, column i when transposed.
    const T* a_block = trans_a ? a + row0 : a + row0 * lda;
    gemm(trans_a, trans_b, row1 - row0, n, k, alpha, a_block, lda, b, ldb, beta, c + row0 * ldc,
         ldc);
  }
}

#define GNMR_INSTANTIATE(T)                                                                    \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                        int64_t, T, T*, int64_t);                                              \
  template void gemm_parallel<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t,  \
                                 const T*, int64_t, T, T*, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

}  // namespace cpu
}  // namespace gnmr
