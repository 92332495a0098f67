#!/usr/bin/env bash
# extract_device_code.sh IN.cu OUT.inc: the lines of a kernel file between its "---- device
# code begin" and "---- device code end" markers, rewritten to compile as plain C++ on the
# host: __global__ / __device__ / __launch_bounds__ dropped, `extern __shared__` memory and
# __syncthreads() routed to the emulation's block state, #pragma unroll removed.
# Used by tests/backend/test_flash_attention_emulated.cpp (built by CMake, not run by hand).
set -euo pipefail
awk '/---- device code begin/{p=1; next} /---- device code end/{p=0} p' "$1" \
  | sed -e 's/__global__ void __launch_bounds__([A-Za-z0-9_, <>]*)/void/' \
        -e 's/__global__ void/void/' \
        -e 's/__device__ //g' \
        -e 's/extern __shared__ \(__align__([0-9]*) \)\{0,1\}float \([a-z_]*\)\[\];/float* \2 = emulated_shared_memory();/' \
        -e 's/__syncthreads()/emulated_syncthreads()/g' \
        -e '/#pragma unroll/d' >"$2.tmp"
grep -q emulated_syncthreads "$2.tmp" || { echo "extract_device_code.sh: no device code in $1" >&2; exit 1; }
mv "$2.tmp" "$2"
