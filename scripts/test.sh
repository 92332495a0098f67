#!/usr/bin/env bash
# Builds the release preset and runs the test suite (ctest). Tests labelled `gpu` compare
# each CUDA kernel with the CPU backend and skip when no GPU is present.
#   scripts/test.sh            release build + all tests
#   scripts/test.sh asan       the CPU suite under ASan + UBSan (less the learning-quality run),
#                              and most gpu tests on the host emulation of CUDA
#   scripts/test.sh emulated   every test, the gpu ones on the host emulation of CUDA
# GNMR_CUDA_ARCHITECTURES=90a compiles the CUDA code for that architecture only (default "80;90a").
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset "$preset" ${GNMR_CUDA_ARCHITECTURES:+"-DGNMR_CUDA_ARCHITECTURES=$GNMR_CUDA_ARCHITECTURES"}
cmake --build --preset "$preset" -j "$(nproc)"
if [ "$preset" = asan ]; then
  # Leaves out the one learning-quality run (250 steps, over 2 minutes under ASan): it trains
  # through the code the shorter CLI runs already take under the sanitizers, and the release
  # stage runs it.
  ctest --preset asan -L cpu -j "$(nproc)" -E 'TinyModelLearnsWellBelowTheUnigramEntropy'
  # The asan preset builds the CUDA backend on the host emulation of CUDA (tests/emulated_cuda),
  # so the gpu tests run here too, under the sanitizers: every kernel, GEMM, projection and
  # attention test, of the end-to-end runs fp8mix against the CPU (its FP8 GEMMs, scales and
  # quantizers through the whole backend) and bf16 on the wgmma flash kernels (the emulated
  # device is sm_90), the nccl communicator on the emulated NCCL, one
  # rank and 2-3 rank processes, the command-line runs (resume, blocking launches) and the
  # data-parallel training runs on 1 and 2 GPU ranks (overlap, ZeRO-1, resume, an mpirun
  # launch): 1-3.5 minutes each under ASan. Left out for time (`ctest --preset emulated` runs
  # them all): the other end-to-end runs and the long-sequence attention tests.
  ctest --preset asan -L gpu -j "$(nproc)" -E 'AtALongSequence|IsDeterministicAndReadsNoUnwrittenMemory|MatchesTheCpuBackendWithOneWaitPerStep/(fp32|bf16|actq|int8|bf16_flash_bf16)( |$)'
else
  ctest --preset "$preset" -j "$(nproc)"
fi
