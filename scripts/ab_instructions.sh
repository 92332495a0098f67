#!/usr/bin/env bash
# Compares the work two builds do for the same training steps, by instruction count under
# valgrind (callgrind), so a regression shows on a busy or noisy machine where wall-clock
# benchmarks cannot tell ±10%. Counts everything the process executes (setup included) on
# one thread with OpenBLAS's generic kernel, so both builds run the same BLAS code.
#   scripts/ab_instructions.sh OLD_BENCH_MODEL NEW_BENCH_MODEL [RECIPE...]
# BENCH_MODEL: tests/model/bench_model of each build (a portable build: valgrind cannot run
# -march=native code). RECIPE: fp32 bf16 actq fp8mix int8 (default: fp32 fp8mix).
# Instruction counts say nothing about cache misses: a change in memory layout needs the
# wall-clock comparison too (gnmr bench, alternated on a quiet machine).
set -euo pipefail
(($# >= 2)) || { sed -n 2,10p "$0" >&2; exit 2; }
old=$1 new=$2
shift 2
recipes=("$@")
((${#recipes[@]})) || recipes=(fp32 fp8mix)
command -v valgrind >/dev/null || { echo "ab_instructions.sh: needs valgrind (apt install valgrind)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gnmr_ab.XXXXXX")
# A small model (dim 256, 2 layers, vocab 4000, batch 2 x 128), 2 steps: minutes under callgrind.
shape=(1 2 256 688 4 4 2 4000 2 128)
instructions() {  # instructions BINARY RECIPE
  GNMR_BLAS_AUTOTUNE=0 GNMR_RECIPE=$2 OPENBLAS_CORETYPE=Prescott OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    "$1" "${shape[@]}" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/log"
}
printf "%-8s %16s %16s %9s\n" recipe old new new/old
for recipe in "${recipes[@]}"; do
  a=$(instructions "$old" "$recipe")
  b=$(instructions "$new" "$recipe")
  printf "%-8s %16s %16s %9s\n" "$recipe" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.5f", b/a}')"
done
rm -rf "$work"
