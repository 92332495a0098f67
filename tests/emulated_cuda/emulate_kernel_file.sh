#!/usr/bin/env bash
# emulate_kernel_file.sh IN.cu OUT.cpp: a kernels/*.cu file as host C++ for the CUDA emulation
# (emulated_cuda.h), its launch wrappers included:
# - kernel_prelude.h first (CUDA keywords and built-ins), then `#line` so compiler messages
#   name the .cu file's lines;
# - `kernel<<<grid, block[, shared[, stream]]>>>(args);` becomes
#   emulated_kernel_launch([&] { kernel(args); }, &kernel, grid, block[, shared[, stream]]);
#   followed by the line breaks the launch spanned, so later lines keep their numbers;
# - `extern __shared__ [__align__(N)] T name[];` becomes a pointer to the block's emulated
#   dynamic shared memory (which starts on a 16-byte boundary);
# - what lies between "---- hardware only begin" and "---- hardware only end" (inline PTX the
#   emulation provides itself), and every `#pragma unroll` (nvcc's, unknown to g++), become
#   blank lines.
# Used by tests/emulated_cuda/CMakeLists.txt (built by CMake, not run by hand).
set -euo pipefail
in=$1 out=$2
{
  echo '#include "emulated_cuda/kernel_prelude.h"'
  echo "#line 1 \"$in\""
  perl -0777 -pe '
    s{^[ \t]*#pragma unroll[^\n]*}{}gm;
    s{^[^\n]*---- hardware only begin.*?---- hardware only end[^\n]*}{"\n" x ($& =~ tr/\n//)}gsme;
    s{extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\[\]\s*;}
     {$1* $2 = reinterpret_cast<$1*>(::gnmr::cuda::emulated_shared_memory());}g;
    s{(\b[A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*;}{
      my ($kernel, $config, $args) = ($1, $2, $3);
      my $lost = ($& =~ tr/\n//) - ($config =~ tr/\n//) - ($args =~ tr/\n//);
      "::gnmr::cuda::emulated_kernel_launch([&] { $kernel($args); }, " .
      "reinterpret_cast<const void*>(&$kernel), $config);" . ("\n" x $lost)
    }gse;
  ' "$in"
} >"$out.tmp"
grep -q 'emulated_kernel_launch(' "$out.tmp" || { echo "emulate_kernel_file.sh: no kernel launch in $in" >&2; exit 1; }
if grep -n '<<<' "$out.tmp" >&2; then
  echo "emulate_kernel_file.sh: a launch in $in was not rewritten (the lines above)" >&2
  exit 1
fi
mv "$out.tmp" "$out"
