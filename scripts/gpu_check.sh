#!/usr/bin/env bash
# Verifies gnmr on a machine with an NVIDIA GPU, from a bundle made by scripts/gpu_bundle.sh:
# needs the NVIDIA driver and a CUDA 13 toolkit (for cudart, cuBLASLt, compute-sanitizer), none
# of our Debian packages, no network, no root. Prints each stage's row of a pass/fail table as
# the stage ends, and the whole table last; exits 1 if any stage failed (a stage that cannot run
# here says why and is not a failure).
#
#   scripts/gpu_check.sh [--bundle DIR] [--logs DIR] [--require-gpu] [all | STAGE...]
#     --bundle DIR    the bundle (default build/gpu-bundle); DIR.tar.gz, as gpu_bundle.sh packs
#                     it, is unpacked to DIR first when DIR is missing or older than it
#     --logs DIR      gets STAGE.log per stage and table.txt, nothing else: at most 10 files
#                     (default gpu-check-logs)
#     --require-gpu   no GPU found is a failure, not a row of SKIPs
#     --archive FILE  also packs the logs directory into FILE (a .tar.gz) after every stage, so
#                     a run cut off later still leaves one file with what finished
#   stages, in order (default, or `all`: the first seven), each under its own timeout, together
#   at most 10.1 minutes:
#     preflight   the GPU (name, compute capability, driver), the CUDA libraries the bundle
#                 needs found on this machine, every bundle binary's libraries resolved, and
#                 `gnmr version` running                                              (20 s)
#     gemm-sweep  cuBLASLt has an algorithm for every GEMM of tiny-gpu and llama2-1b-gpu
#                 (each projection and the lm_head, each role, fp32 / bf16 / FP8); then
#                 per bf16 and FP8 GEMM of a llama2-1b-gpu step, the heuristic's first
#                 algorithm timed against the next 15 it ranks (bench_gpu_gemm)      (45 s)
#     gpu-tests   the bundle's `gpu` tests, one process per test suite (a sticky CUDA error
#                 fails its suite, not every later one; on 9.0 a suite's wgmma tests get a
#                 process of their own after the rest): each CUDA kernel vs its CPU twin,
#                 the backend vs the CPU backend; a test that skips here fails; a suite
#                 that hangs is killed after 45 s and the later suites still run      (180 s)
#     e2e         tiny-model runs per recipe on the GPU vs the CPU losses recorded in the
#                 bundle (reference/cpu_runs.json)                                     (60 s)
#     memcheck    compute-sanitizer: memcheck over the kernel tests and an fp8mix training
#                 run, initcheck over the training run                                 (60 s)
#     bench       gnmr bench on llama2-1b-gpu at seq 1024: bf16, fp8mix (GNMR controller),
#                 fp8mix under static_low, actq (each on model.attention auto: the tensor-
#                 core flash kernels under the config's bf16 GEMMs), and bf16 on the v1
#                 attention, on the flash kernels' wgmma versions and on auto without them
#                 (GNMR_AUTO_WGMMA=0; both compute capability 9.0 only); tokens/s, MFU, the
#                 GEMMs' share and the attention variants chosen each; 45 s per run   (170 s)
#     racecheck   compute-sanitizer: racecheck (shared-memory races, which the emulation
#                 cannot see) and synccheck over the tests of our kernels              (90 s)
#   and, only when named (not in the default run):
#     attention-bench  flash (SIMT, tensor cores: mma.sync, and wgmma on sm_90a) vs v1 attention, TFLOP/s and memory at
#                 T = 1024, 2048, 4096 at hd 128, T = 1024 at hd 64 (bench_gpu_attention) (60 s)
#     profile     Nsight Compute (ncu) over one llama2-1b-gpu bench step per kernel family:
#                 each kernel shape's time, share of the DRAM bandwidth and of issue slots
#                 (scripts/ncu_summary.py's table in profile.log)                    (180 s)
# e2e and bench need a gnmr built with the CUDA backend.
#
# A dry run without a GPU: `GNMR_BUNDLE_EMULATED=1 scripts/gpu_bundle.sh` builds the bundle on
# the host emulation of CUDA (build/gpu-bundle-emulated), and `scripts/gpu_check.sh --bundle
# build/gpu-bundle-emulated` then runs every stage on it, so a fault of this script, the bundle
# or a code path shows here and not in the one GPU run. Such a run says DRY RUN on every row:
# the emulation is the "GPU" (8 devices, GNMR_EMULATED_DEVICES), NCCL is the emulated one, the
# timeouts are the emulation's (about 30 minutes in all), memcheck, racecheck and profile skip
# (compute-sanitizer and ncu need a GPU), bench and gemm-sweep's bench run tiny-gpu and
# attention-bench T = 128 (the real shapes would take hours), e2e validates on 2048 tokens;
# --require-gpu fails it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

bundle=build/gpu-bundle
logs=gpu-check-logs
require_gpu=0
archive=""
default_stages=(preflight gemm-sweep gpu-tests e2e memcheck bench racecheck)
stages=()
while (($#)); do
  case "$1" in
    --bundle | --logs | --archive)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_check.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    --require-gpu) require_gpu=1; shift ;;
    --archive) archive="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; exit 0 ;;
    all) stages+=("${default_stages[@]}"); shift ;;
    preflight | gemm-sweep | gpu-tests | e2e | memcheck | bench | racecheck | attention-bench | profile) stages+=("$1"); shift ;;
    *) echo "gpu_check.sh: unknown argument \"$1\" (see --help; the logs directory is --logs DIR)" >&2; exit 2 ;;
  esac
done
((${#stages[@]})) || stages=("${default_stages[@]}")
bundle="${bundle%/}"
# The packed bundle travels (a third of the size); unpack it unless the directory is newer
# (tar -m stamps the unpacked files now, so an unpacked bundle is newer than its archive).
if [ -f "$bundle.tar.gz" ] && { [ ! -f "$bundle/BUNDLE.json" ] || [ "$bundle.tar.gz" -nt "$bundle/BUNDLE.json" ]; }; then
  rm -rf "$bundle"
  mkdir -p "$bundle"
  tar -xzmf "$bundle.tar.gz" -C "$bundle" --strip-components=1 \
    || { echo "gpu_check.sh: could not unpack $bundle.tar.gz" >&2; exit 2; }
  echo "gpu_check.sh: unpacked $bundle.tar.gz"
fi
bundle="$(cd "$bundle" 2>/dev/null && pwd)" || { echo "gpu_check.sh: no bundle at $bundle (scripts/gpu_bundle.sh makes one)" >&2; exit 2; }
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"
# Everything but the stage logs and the table (status files, e2e runs, bench JSON) goes here.
work="$(mktemp -d "${TMPDIR:-/tmp}/gnmr-gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# A copy that lost its exec bits on the way still runs.
chmod +x "$bundle"/bin/* "$bundle"/tests/* 2>/dev/null || true

declare -A result detail seconds
note() { echo "[$stage] $*" | tee -a "$logs/$stage.log"; }

# An emulated bundle (gpu_bundle.sh with GNMR_BUNDLE_EMULATED=1): the dry run above.
emulated=0
grep -q '"emulated": true' "$bundle/BUNDLE.json" 2>/dev/null && emulated=1

# ---- what this machine has ----
cuda_root=""
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda; do
  [ -n "$dir" ] && [ -d "$dir" ] && { cuda_root="$dir"; break; }
done
cuda_lib=""
for dir in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib"; do
  [ -e "$dir/libcudart.so.13" ] && { cuda_lib="$dir"; break; }
done
# No toolkit libraries: PyTorch's CUDA wheels (nvidia/*/lib) hold cudart and cuBLASLt too.
if [ -z "$cuda_lib" ] && command -v python3 >/dev/null 2>&1; then
  cuda_lib="$(python3 -c 'import glob, os, sys
hits = sorted(glob.glob(os.path.join(p, "nvidia", "**", "libcudart.so.13*"), recursive=True)
              for p in sys.path if os.path.isdir(os.path.join(p, "nvidia")))
print(os.path.dirname(hits[0][0]) if hits and hits[0] else "")' 2>/dev/null || true)"
fi
[ -n "$cuda_lib" ] && export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "$cuda_root" ] && [ -d "$cuda_root/bin" ] && export PATH="$cuda_root/bin:$PATH"
# NCCL is loaded at run time (src/parallel/nccl_library.h): a GNMR_NCCL_LIBRARY already set
# wins, else the toolkit's, else the copy PyTorch installs (the nvidia-nccl wheel), else the
# dynamic loader's own search (ldconfig) when the tests run.
nccl_lib="${GNMR_NCCL_LIBRARY:-}"
[ -z "$nccl_lib" ] && [ -n "$cuda_lib" ] && [ -e "$cuda_lib/libnccl.so.2" ] && nccl_lib="$cuda_lib/libnccl.so.2"
if [ -z "$nccl_lib" ] && command -v python3 >/dev/null 2>&1; then
  nccl_lib="$(python3 -c 'import glob, os, nvidia.nccl as n
print(next(iter(sorted(q for d in n.__path__ for q in glob.glob(os.path.join(d, "lib", "libnccl.so.2*")))), ""))' 2>/dev/null || true)"
fi
[ -n "$nccl_lib" ] && export GNMR_NCCL_LIBRARY="$nccl_lib"
gpu_name=""
gpu_count=0
gpu_compute_mode=""
smi="$(command -v nvidia-smi || true)"
for candidate in /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
  [ -z "$smi" ] && [ -x "$candidate" ] && smi="$candidate"
done
if [ -n "$smi" ]; then
  gpu_name="$("$smi" --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  gpu_count="$("$smi" -L 2>/dev/null | grep -c '^GPU ' || true)"
  gpu_compute_mode="$("$smi" --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)"
fi
# Without nvidia-smi, the device files still say a GPU is there (its capability unknown).
if [ -z "$gpu_name" ] && ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  gpu_count="$(ls /dev/nvidia[0-9]* | wc -l)"
  gpu_name="unknown NVIDIA GPU (no nvidia-smi), unknown, unknown"
fi
if ((emulated)); then
  # The emulation is the GPU (an H100's properties, as emulated_cudart.cpp answers them) and its
  # NCCL the NCCL: the emulated gnmr refuses a real one.
  gpu_name="CUDA emulated on the host (dry run: no GPU), 9.0, none"
  gpu_count="${GNMR_EMULATED_DEVICES:-8}"
  export GNMR_NCCL_LIBRARY="$bundle/lib/libgnmr_emulated_nccl.so"
fi
have_gpu() { [ -n "$gpu_name" ]; }
# (grep -q reading a here-string, not a pipe: under pipefail a writer that outlives grep -q dies
# of SIGPIPE and fails the test although it matched.)
cuda_backend_built() { grep -q "^backends:.*cuda" <<<"$("$bundle/bin/gnmr" version 2>/dev/null)"; }
export GNMR_TEST_SOURCE_DIR="$bundle/share" GNMR_TEST_BINARY="$bundle/bin/gnmr"

# ---- stages: each sets status (PASS / FAIL / SKIP) and a one-line why ----
stage_preflight() {
  local missing=0
  note "bundle: $(tr -d '\n' <"$bundle/BUNDLE.json" 2>/dev/null)"
  # A bundle of another commit verifies that commit's code, not this checkout's.
  local built_from head
  built_from=$(grep -o '"commit": "[^"]*"' "$bundle/BUNDLE.json" 2>/dev/null | cut -d'"' -f4)
  head=$(git rev-parse --short HEAD 2>/dev/null || true)
  # Short hashes of two clones may differ in length: one a prefix of the other is the same.
  if [ -n "$head" ] && [ -n "$built_from" ] && [[ "$head" != "$built_from"* && "$built_from" != "$head"* ]]; then
    note "WARNING: the bundle was built from commit $built_from, this checkout is at $head: what passes here is $built_from's code (scripts/gpu_bundle.sh rebuilds it)"
  elif grep -q '"dirty": true' "$bundle/BUNDLE.json" 2>/dev/null; then
    note "note: the bundle was built from $built_from with uncommitted changes"
  fi
  note "CUDA toolkit: ${cuda_root:-not found} (libcudart.so.13 in ${cuda_lib:-nowhere})"
  note "NCCL: ${GNMR_NCCL_LIBRARY:-not in the toolkit nor in PyTorch, so the dynamic loader decides (the GpuNccl tests skip, and gpu-tests fails, where it finds none)}"
  note "cuBLASLt and cudart as test_gpu loads them: $(ldd "$bundle/tests/test_gpu" 2>/dev/null | grep -o 'lib\(cublasLt\|cudart\)[^ ]* => [^ ]*' | tr '\n' ' ')"
  for binary in "$bundle"/bin/* "$bundle"/tests/*; do
    [ -e "$binary" ] || continue
    if ldd "$binary" | grep "not found" >>"$logs/preflight.log"; then
      note "$(basename "$binary"): libraries not found (above)"
      missing=1
    fi
  done
  if ! "$bundle/bin/gnmr" version >>"$logs/preflight.log" 2>&1; then
    status=FAIL why="bin/gnmr version does not run (see preflight.log)"; return
  fi
  ((missing)) && { status=FAIL why="libraries not found (see preflight.log)"; return; }
  if ((emulated)); then
    if ((require_gpu)); then status=FAIL why="--require-gpu, but the bundle is the emulated dry run's (no GPU code in it)"
    else status=PASS why="emulated bundle: the dry run, no GPU"; fi
    return
  fi
  if ! have_gpu; then
    if ((require_gpu)); then status=FAIL why="no GPU found (no nvidia-smi answer, no /dev/nvidia0)"
    else status=SKIP why="no GPU (nvidia-smi finds none); the bundle itself runs"; fi
    return
  fi
  note "GPU: $gpu_name"
  # Exclusive_Process admits one process's CUDA context a GPU: the wgmma trial's own process
  # then runs only before its parent's context (bench and train do that; the gpu tests that start
  # it from a test process cannot, and print that it failed).
  [ -n "$gpu_compute_mode" ] && note "compute mode: $gpu_compute_mode"
  local cap
  cap="$(gpu_compute_capability)"
  case "$cap" in
    8.0 | 9.0) status=PASS why="$gpu_name" ;;
    unknown) status=PASS why="$gpu_name: compute capability unknown, the tests will tell" ;;
    *) status=FAIL why="compute capability $cap: the bundle has code for 8.0 and 9.0 only ($gpu_name)" ;;
  esac
}

# The first GPU's compute capability as nvidia-smi gives it ("9.0"), or "unknown".
gpu_compute_capability() {
  local cap
  cap="$(echo "$gpu_name" | awk -F', ' '{print $2}')"
  echo "${cap:-unknown}"
}

# One process of stage_gpu_tests: the bundle's tests that FILTER (a --gtest_filter) selects,
# its output added to gpu-tests.log, its counts added to the stage's, LABEL in its note (none
# where the filter selects no test and the process ends well).
run_test_part() {
  local filter="$1" label="$2" out="$work/suite.log" rc n_ok n_failed n_skipped
  timeout -k 5 "$suite_timeout_s" "$bundle/tests/test_gpu" --gtest_filter="$filter" >"$out" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && echo "[gpu-tests] killed after $suite_timeout_s s (a hang?)" >>"$out"
  cat "$out" >>"$logs/gpu-tests.log"
  n_ok=$(grep -c '^\[       OK \] .*([0-9]* ms)$' "$out" || true)
  n_failed=$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$out" || true)
  n_skipped=$(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$out" || true)
  passed=$((passed + n_ok)) failed=$((failed + n_failed)) skipped=$((skipped + n_skipped))
  if ((rc == 124 || rc == 137)); then crashed+="$label (hung: killed after $suite_timeout_s s) "
  elif ((rc != 0 && n_failed == 0)); then crashed+="$label (exit $rc) "; fi
  ((rc == 0 && n_ok + n_failed + n_skipped == 0)) && return
  note "suite $label: $n_ok passed, $n_failed failed, $n_skipped skipped, exit $rc"
}

stage_gpu_tests() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  [ -x "$bundle/tests/test_gpu" ] || { status=FAIL why="the bundle has no tests/test_gpu"; return; }
  local negative='GpuGemmSweep.*' suite passed=0 failed=0 skipped=0 crashed=""
  # Tests named *TwoGpus* need two devices (NCCL takes one rank per GPU): on one they are left
  # out, and the log says so, rather than skipped (a skip here is a failure).
  if ((gpu_count < 2)); then
    negative+=':*TwoGpus*'
    note "$gpu_count GPU(s): the *TwoGpus* tests (2-rank NCCL training, the multi-process NCCL checks) are left out"
  fi
  # The flash kernels' wgmma versions run on compute capability 9.0 only (sm_90a): elsewhere
  # their tests skip, so they are left out, and the log says so.
  if [ "$(gpu_compute_capability)" != 9.0 ]; then
    negative+=':*Wgmma*:*flash_wgmma*'
    note "compute capability $(gpu_compute_capability): the wgmma tests (*Wgmma*, *flash_wgmma*) are left out (wgmma is sm_90a's)"
  fi
  # One process per suite: an illegal access leaves the CUDA context unusable, and every later
  # test of that process would fail with it. On 9.0 a suite's wgmma tests get a process of their
  # own after the rest: those kernels have not run on a GPU before, and a fault in one must not
  # take the suite's mma.sync tests with it.
  local wgmma_tests='*Wgmma*:*flash_wgmma*' cc
  cc="$(gpu_compute_capability)"
  while read -r suite; do
    [ "$suite" = "GpuGemmSweep." ] && continue
    if [ "$cc" != 9.0 ] || [[ $suite == *Wgmma* ]]; then  # one process: the whole suite
      run_test_part "${suite}*-$negative" "${suite%.}"
    else
      run_test_part "${suite}*-$negative:$wgmma_tests" "${suite%.}"
      run_test_part "${suite}*Wgmma*:${suite}*flash_wgmma*-$negative" "${suite%.} (wgmma)"
    fi
  done < <("$bundle/tests/test_gpu" --gtest_list_tests 2>/dev/null | grep -v '^ ' | grep '\.$')
  # What the wgmma tests found (written on the emulation, unrun on a GPU before), here so the
  # run's own output shows it: how the GPU reads the operand layouts (GpuWgmma's lines), and
  # how many of the kernels' outputs have mma.sync's bits (their lines counted, the first that
  # differs shown; all of them in the log), whether model.attention=auto offered them to its
  # timing (it does where they give mma.sync's bits), and whether their trial process passed
  # (train/wgmma_trial.h: auto offers them only after it does).
  local comparisons compared differing
  grep -E "^wgmma.*D matches|^auto flash attention, |^wgmma trial process, " "$logs/gpu-tests.log" 2>/dev/null | sort -u | while read -r line; do note "$line"; done
  comparisons=$(grep -E "^wgmma.* as mma.sync's$" "$logs/gpu-tests.log" 2>/dev/null)
  if [ -n "$comparisons" ]; then
    compared=$(grep -c . <<<"$comparisons") differing=$(grep -c differs <<<"$comparisons")
    note "wgmma kernels: $((compared - differing)) of $compared runs give mma.sync's bits in every output"
    ((differing)) && note "first that differs: $(grep -m1 differs <<<"$comparisons")"
  fi
  if [ -n "$crashed" ]; then status=FAIL why="crashed: $crashed; $failed failed, $passed passed (gpu-tests.log)"
  elif ((failed)); then status=FAIL why="$failed failed, $passed passed (gpu-tests.log)"
  elif ((skipped)); then status=FAIL why="$skipped tests skipped although a GPU is present"
  elif ((passed == 0)); then status=FAIL why="no test ran (gpu-tests.log)"
  else status=PASS why="$passed tests"; fi
}

# The sanitizer stages' common start: a GPU (not the emulation), the toolkit's compute-sanitizer
# (a separate part of the toolkit: into `sanitizer`) and the bundle's test binary; else sets
# status and why and fails.
sanitizer_ready() {
  have_gpu || { status=SKIP why="no GPU"; return 1; }
  ((emulated)) && { status=SKIP why="compute-sanitizer needs a GPU"; return 1; }
  sanitizer="$(command -v compute-sanitizer || true)"
  [ -z "$sanitizer" ] && [ -x "$cuda_root/compute-sanitizer/compute-sanitizer" ] && sanitizer="$cuda_root/compute-sanitizer/compute-sanitizer"
  [ -n "$sanitizer" ] || { status=SKIP why="compute-sanitizer is not installed with the CUDA toolkit here"; return 1; }
  [ -x "$bundle/tests/test_gpu" ] || { status=FAIL why="the bundle has no tests/test_gpu"; return 1; }
  return 0
}

# One compute-sanitizer run over the bundle's tests: its output in $out (and added to LOG), its
# exit code in rc, its seconds in the stage's log; fails where the device is not supported.
run_sanitizer() {
  local tool="$1" filter="$2" log="$3" begin
  begin=$(date +%s) out="$work/sanitizer.log"
  "$sanitizer" --tool "$tool" --error-exitcode 99 "$bundle/tests/test_gpu" \
    --gtest_filter="$filter" >"$out" 2>&1
  rc=$?
  cat "$out" >>"$log"
  note "$tool on $filter: exit $rc in $(($(date +%s) - begin)) s"
  ! grep -q "Device not supported" "$out"
}

stage_memcheck() {
  local sanitizer
  sanitizer_ready || return
  # Under the sanitizer (10-100x slower): memcheck over every kernel test and the flash kernels
  # on the short sequences (plain SIMT at T = 1000 is too slow; the short ones cover every code
  # path), then memcheck and initcheck over one training run, fp8mix, the recipe with the most
  # kernels. Not the sweep (no kernels of ours), the NCCL tests (a death test re-runs the
  # binary) nor the command-line tests (they run gnmr in child processes). Each run's seconds
  # and exit code go to memcheck.log, so a stage cut off by its timeout still says which ran.
  local errors=0 unsupported=0 tool filter rc out failing=""
  local kernels='-GpuGemmSweep.*:*GpuTraining.*:GpuCli.*:GpuDataParallel.*:GpuNccl*:GpuFlashAttention.*LongSequence*:GpuFlashAttention.GivesTheSameBitsOnEveryRun'
  local training='*GpuTraining.MatchesTheCpuBackend*/fp8mix'
  for run in "memcheck $kernels" "memcheck $training" "initcheck $training"; do
    tool="${run%% *}" filter="${run#* }"
    run_sanitizer "$tool" "$filter" "$logs/memcheck.log" || { unsupported=1; break; }
    # The sanitizer's own findings: its exit code, or a nonzero error summary. A test that
    # fails under it (exit 1, no finding) is gpu-tests' failure, not a memory error.
    if ((rc == 99)) || grep -q "ERROR SUMMARY: [1-9]" "$out"; then errors=$((errors + 1))
    elif ((rc != 0)); then failing+="$tool run exit $rc without a finding; "; fi
  done
  if ((unsupported)); then status=SKIP why="compute-sanitizer: device not supported on this machine"
  elif ((errors)); then status=FAIL why="$errors of 3 sanitizer runs reported errors (memcheck.log)"
  else status=PASS why="memcheck (kernel tests, fp8mix training) and initcheck (training) clean${failing:+; tests failing under it, see gpu-tests: $failing}"; fi
}

stage_racecheck() {
  local sanitizer
  sanitizer_ready || return
  # The shared-memory races the CUDA emulation cannot see (its fibers switch only at barriers,
  # so a plain store and another thread's load with no __syncthreads between them pass there):
  # racecheck over the tests of our kernels that stage data in shared memory (block reductions,
  # the staged quantizers, the flash kernels' cp.async / ldmatrix tiles), synccheck (barriers
  # and warp syncs a divergent thread skips) over the same. Not the long-sequence flash tests,
  # the timed tile choice, nor the 2^32-quotient conversion test: minutes under the tool.
  local errors=0 unsupported=0 tool rc out hazards summary="" failing=""
  local filter='GpuTrainOps.*:GpuQuantize.*:GpuModelOps.*:GpuCausalSoftmax.*:GpuAttention.*:GpuFlashAttention.*'
  filter+='-*LongSequence*:GpuFlashAttention.GivesTheSameBitsOnEveryRun:GpuFlashAttention.TimedQueryTiles*:GpuQuantize.FpConversionInstructions*'
  for tool in racecheck synccheck; do
    run_sanitizer "$tool" "$filter" "$logs/racecheck.log" || { unsupported=1; break; }
    # racecheck ends with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)",
    # synccheck with "ERROR SUMMARY: N errors"; a warning (two writes of one value, say) is
    # logged, not a failure.
    hazards="$(grep -oE 'RACECHECK SUMMARY: .*' "$out" | tail -1)"
    [ -n "$hazards" ] && summary+="$hazards; "
    if ((rc == 99)) || grep -q "ERROR SUMMARY: [1-9]" "$out" || grep -qE '\([1-9][0-9]* errors?' <<<"$hazards"; then
      errors=$((errors + 1))
    elif ((rc != 0)); then failing+="$tool run exit $rc without a finding; "; fi
  done
  if ((unsupported)); then status=SKIP why="compute-sanitizer: device not supported on this machine"
  elif ((errors)); then status=FAIL why="$errors of 2 sanitizer runs reported errors: ${summary}see racecheck.log"
  else status=PASS why="racecheck and synccheck over the kernel tests clean${summary:+ (${summary%; })}${failing:+; tests failing under them, see gpu-tests: $failing}"; fi
}

needs_backend() {
  have_gpu || { status=SKIP why="no GPU"; return 1; }
  cuda_backend_built || { status=SKIP why="not built: this gnmr has no CUDA backend"; return 1; }
  return 0
}

stage_gemm_sweep() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  [ -x "$bundle/tests/test_gpu" ] || { status=FAIL why="the bundle has no tests/test_gpu"; return; }
  if "$bundle/tests/test_gpu" --gtest_filter='GpuGemmSweep.*' >>"$logs/gemm-sweep.log" 2>&1; then
    local checked
    checked="$(grep "GEMMs checked" "$logs/gemm-sweep.log" | tail -1)"
    if [ -n "$checked" ]; then status=PASS why="$checked"
    else status=FAIL why="the sweep did not run (skipped? gemm-sweep.log)"; return; fi
  else
    status=FAIL why="$(grep -c "  NONE" "$logs/gemm-sweep.log") GEMMs without an algorithm (gemm-sweep.log)"
    return
  fi
  # Then the heuristic's first algorithm, which training runs, against the next it ranks, timed
  # per GEMM of a bench step (llama2-1b-gpu at 8192 tokens; the dry run: tiny-gpu): whether
  # timing them at start would pay, and whether the fastest gives the same bits.
  [ -x "$bundle/bin/bench_gpu_gemm" ] || { status=FAIL why="$why; the bundle has no bin/bench_gpu_gemm"; return; }
  local model=llama2-1b-gpu tokens=8192
  ((emulated)) && model=tiny-gpu tokens=1024
  echo "=== bench_gpu_gemm $model $tokens" >>"$logs/gemm-sweep.log"
  if timeout -k 5 30 "$bundle/bin/bench_gpu_gemm" "$bundle/share/configs/models/$model.json" "$tokens" \
    >"$work/gemm-bench.json" 2>>"$logs/gemm-sweep.log"; then
    cat "$work/gemm-bench.json" >>"$logs/gemm-sweep.log"
    why="$why; $(python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("; ".join("%(summary)s GEMMs %(step_ms_first)s ms a step on the first algorithms, %(step_ms_best)s on the fastest (%(gemms_faster_elsewhere)s of %(gemms)s faster elsewhere, %(best_with_other_bits)s with other bits)" % r for r in rows if "summary" in r))' "$work/gemm-bench.json")"
  else
    status=FAIL why="$why; bench_gpu_gemm failed or ran past 30 s (gemm-sweep.log)"
  fi
}

stage_e2e() {
  needs_backend || return
  command -v python3 >/dev/null || { status=FAIL why="python3 not found (the comparison needs it)"; return; }
  local work="$work/e2e"
  rm -rf "$work" && mkdir -p "$work"
  # The same shards the reference was made from: the bundled corpus and tokenizer.
  "$bundle/bin/gnmr" prepare --no-progress --val-fraction 0.05 \
    --tokenizer "$bundle/share/data/brown/tokenizer.model" --out "$work/shards" \
    "$bundle/share/data/brown/brown.jsonl.gz" >>"$logs/e2e.log" 2>&1 \
    || { status=FAIL why="gnmr prepare failed (e2e.log)"; return; }
  local verdict
  verdict="$(python3 - "$bundle" "$work" "$((run_timeout_s * 2 / 3))" "$emulated" <<'EOF_PY' 2>>"$logs/e2e.log"
import json, subprocess, sys
bundle, work, run_timeout_s, emulated = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
reference = json.load(open(f"{bundle}/reference/cpu_runs.json"))
# Relative |gpu - cpu| / cpu allowed per step (tests/gpu/test_gpu_training.cpp explains them):
# step 1 runs on the same weights, later steps compound the GEMMs' different summation order.
# bf16 runs model.attention auto, which under bf16 GEMMs is the bf16 tensor-core attention
# (q, k, v, P, dO, dS rounded to bf16) against the CPU's fp32 attention: bf16_flash_bf16's bounds.
tolerance = {"fp32": (1e-5, 1e-4), "bf16": (2e-3, 5e-3), "actq": (1e-4, 1e-3),
             "fp8mix": (2e-3, 5e-3), "fp8mix-fp4": (2e-3, 1e-2), "int8": (1e-4, 1e-3)}
failed, worst = [], {}
for name, run in reference["runs"].items():
    config = run["config"]
    config["include"] = f"{bundle}/share/configs/models/tiny.json"
    config["data"].update({"train": f"{work}/shards/train_*.bin", "val": f"{work}/shards/val_*.bin",
                           "tokenizer": f"{bundle}/share/data/brown/tokenizer.model"})
    config["backend"] = "cuda"
    # The final validation is not compared (the train losses are). On a GPU its 32768 tokens
    # take under a second; on the emulation up to 140 s a recipe (int8, session 25), which ran
    # a dry run's int8 past its limit: there it reads 2048.
    if emulated:
        config.setdefault("eval", {})["tokens"] = 2048
    path = f"{work}/{name}.json"
    json.dump(config, open(path, "w"))
    with open(f"{work}/{name}.log", "w") as log:
        try:  # a hung run costs its own time, not the later recipes'
            done = subprocess.run([f"{bundle}/bin/gnmr", "train", "--config", path, "--out",
                                   f"{work}/{name}", "--force"], stdout=log,
                                  stderr=subprocess.STDOUT, timeout=int(run_timeout_s))
        except subprocess.TimeoutExpired:
            failed.append(f"{name} killed after {run_timeout_s} s")
            continue
    if done.returncode != 0:
        failed.append(f"{name} exited {done.returncode}")
        print(f"--- {name}: gnmr train exited {done.returncode}; its log:", file=sys.stderr)
        print(open(f"{work}/{name}.log").read()[-4000:], file=sys.stderr)
        continue
    losses = [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl")
              if json.loads(l).get("kind") == "train"]
    first, later = tolerance.get(name, (2e-3, 1e-2))
    errors = [abs(g - c) / c for g, c in zip(losses, run["losses"])]
    worst[name] = max(errors) if errors else float("nan")
    if len(losses) != len(run["losses"]):
        failed.append(f"{name}: {len(losses)} steps, reference {len(run['losses'])}")
    elif any(e > (first if i == 0 else later) for i, e in enumerate(errors)):
        failed.append(f"{name}: max rel. loss error {worst[name]:.1e}")
    print(f"{name}: gpu {losses[-1]:.5f} cpu {run['losses'][-1]:.5f} max rel err {worst[name]:.1e}",
          file=sys.stderr)
summary = ", ".join(f"{n} {e:.0e}" for n, e in worst.items())
print(("FAIL " + "; ".join(failed)) if failed else f"PASS {len(worst)} recipes within tolerance ({summary})")
EOF_PY
)"
  status="${verdict%% *}" why="${verdict#* }"
  [ -n "$verdict" ] || { status=FAIL why="the comparison did not run (e2e.log)"; }
}

stage_bench() {
  needs_backend || return
  local config="$bundle/share/configs/bench/llama2-1b-gpu-seq1024.json" failed=0 lines="" shape=()
  # The dry run benches tiny-gpu: the 1B shape takes hours on the emulation.
  if ((emulated)); then
    config="$bundle/share/configs/models/tiny-gpu.json"
    shape=(--steps 2 --warmup 1 --set data.seq_len=128 --set train.micro_batch=2 --set train.global_batch_tokens=256)
    lines="tiny-gpu: "
  else
    shape=(--steps 5 --warmup 3)
  fi
  [ -f "$config" ] || { status=FAIL why="no $config in the bundle"; return; }
  # The recipes on the default attention (auto: on 9.0 the wgmma kernels too where their trial
  # process passes and their bits are mma.sync's), then bf16 on the v1 attention, on the flash
  # kernels' wgmma versions, and on auto with mma.sync alone (GNMR_AUTO_WGMMA=0; both left out
  # off compute capability 9.0), so one GPU run measures the MFU each gives. Each run: a label, its --set overrides, and environment assignments. The
  # GNMR-controlled fp8mix next to static_low is issue 11's "within 2% of static low's step time".
  local label set out rc runs=(
    "bf16|precision.recipe=bf16|"
    "fp8mix|precision.recipe=fp8mix|"
    "fp8mix-static_low|precision.recipe=fp8mix gnmr.controller=static_low|"
    "actq|precision.recipe=actq|"
    "bf16+materialized|precision.recipe=bf16 model.attention=materialized|"
    "bf16+flash_wgmma|precision.recipe=bf16 model.attention=flash_wgmma|"
    "bf16+no_wgmma|precision.recipe=bf16|GNMR_AUTO_WGMMA=0")
  local run sets envs set_args=()
  for run in "${runs[@]}"; do
    label=${run%%|*} sets=${run#*|} envs=${run##*|} set_args=()
    sets=${sets%|*}
    if [[ $label == *wgmma* && "$(gpu_compute_capability)" != 9.0 ]]; then
      lines+="$label left out (wgmma is sm_90a's); "
      continue
    fi
    for set in $sets; do set_args+=(--set "$set"); done
    out="$work/bench-run.log"
    # shellcheck disable=SC2086  # $envs: whole NAME=value words, none with spaces
    env $envs timeout -k 5 "$run_timeout_s" "$bundle/bin/gnmr" bench --config "$config" --backend cuda \
      "${shape[@]}" "${set_args[@]}" >"$out" 2>&1
    rc=$?
    { echo "=== $label: ${envs:+$envs }gnmr bench ${set_args[*]} (exit $rc)"; cat "$out"; } >>"$logs/bench.log"
    if ((rc == 0)); then
      lines+="$label $(grep -o 'tokens/s *[0-9.]*' "$out" | tail -1 | tr -s ' ')"
      # MFU against the bf16 peak bench measured, then against the datasheet's.
      lines+=" MFU $(grep -o 'MFU [0-9.]*%' "$out" | awk '{print $2}' | paste -sd/)"
      # The GEMMs' share of the step's device time (bench's breakdown by op family).
      lines+=" gemm $(grep -oE '^ +gemm +[0-9.]+ ms +[0-9.]+%' "$out" | tail -1 | awk '{print $4}')"
      # The device memory the backend planned (peak), which the saved copies' choices change.
      lines+=" mem $(grep -oE '[0-9.]+ MiB planned by the backend' "$out" | tail -1 |
        awk '{printf "%.1f GiB", $1 / 1024}')"
      # The tensor-core attention variant each pass runs (timed at the first step; under auto
      # wgmma only where it gave mma.sync's bits, else a warning), and any such warning.
      local variants
      variants=$(sed -nE 's/.*: the (forward|backward) runs ([a-z.]+), ([0-9]+)-row query tiles.*/\1 \2 \3/p' "$out" |
        sort -u | paste -sd, -)
      [ -n "$variants" ] && lines+=" attention $variants"
      grep -q "wgmma kernels wrote other bits" "$out" && lines+=" (wgmma left out: other bits)"
      grep -q "the wgmma kernels are left out" "$out" && lines+=" (wgmma left out by its trial process)"
      lines+="; "
    elif ((rc == 124 || rc == 137)); then
      failed=$((failed + 1)) lines+="$label killed after $run_timeout_s s; "
    else
      failed=$((failed + 1)) lines+="$label failed (exit $rc); "
    fi
  done
  if ((failed)); then status=FAIL why="$lines(bench.log)"; else status=PASS why="$lines"; fi
}

# Attention speed, flash next to v1 (forward and backward TFLOP/s, memory), one JSON line per
# kernel and shape (T, hd) in attention-bench.log. Not in the default stages (they fill 10.1 minutes):
# run it as `gpu_check.sh attention-bench`.
stage_attention_bench() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  [ -x "$bundle/bin/bench_gpu_attention" ] || { status=FAIL why="the bundle has no bin/bench_gpu_attention"; return; }
  local shapes=()
  ((emulated)) && shapes=(--small)  # T = 128: the real shapes would take the emulation hours
  if "$bundle/bin/bench_gpu_attention" "${shapes[@]}" >"$work/attention-bench.json" 2>>"$logs/attention-bench.log"; then
    cat "$work/attention-bench.json" >>"$logs/attention-bench.log"
    status=PASS why="$(python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
def text(r):
    if "pass" in r:  # one pass'"'"'s kernel alone
        return "%(kernel)s T=%(T)s hd=%(hd)s %(pass)s %(tflops)s TFLOP/s" % r
    return "%(kernel)s T=%(T)s hd=%(hd)s fwd %(forward_tflops)s bwd %(backward_tflops)s TFLOP/s %(memory_mib)s MiB" % r
print("; ".join(text(r) for r in rows))' "$work/attention-bench.json")"
  else
    status=FAIL why="bench_gpu_attention failed (attention-bench.log)"
  fi
}

# Where a step's device time goes, kernel by kernel: ncu over one bench step of llama2-1b-gpu per
# kernel family (fp8mix's quantizers and sum of squares, bf16's attention, element-wise kernels
# of the forward and the backward, and AdamW), each kernel shape's average time, DRAM bandwidth
# share and issue-slot share, the figures that tell a kernel waiting on memory from one waiting
# on its instructions. The raw
# ncu output and the table (scripts/ncu_summary.py) go to profile.log. Not in the default
# stages: run it as `gpu_check.sh profile`.
stage_profile() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  ((emulated)) && { status=SKIP why="ncu reads a GPU's counters: nothing to profile on the emulation"; return; }
  needs_backend || return
  local ncu
  ncu="$(command -v ncu || true)"
  [ -n "$ncu" ] || { status=SKIP why="no ncu (Nsight Compute) on PATH or in the CUDA toolkit's bin"; return; }
  local config="$bundle/share/configs/bench/llama2-1b-gpu-seq1024.json"
  [ -f "$config" ] || { status=FAIL why="no $config in the bundle"; return; }
  local metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active
  # The tensor-core attention's run adds L2's throughput, the tensor pipe's HMMA cycles and the
  # warp slots held (achieved occupancy): the figures that say whether its 128-row tiles
  # (session 24) trade occupancy for L2 traffic well; and the XU and FMA pipes' instruction
  # rates. XU takes the exponentials, 16 a cycle per multiprocessor against the tensor pipe's
  # 2048 bf16 multiply-adds (the datasheet's 989 TFLOP/s: 132 multiprocessors at 1.83 GHz): at
  # hd 64 a score's exponential and its QK^T and PV products (2 x 64 multiply-adds) take the
  # same time on the two, so XU near its peak says the exponentials bound the forward.
  local tensor_metrics=lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
  # The wgmma kernels' run (compute capability 9.0 only) adds the tensor pipe's cycles busy with
  # any MMA: the HMMA column counts mma.sync's, and wgmma's may not be HMMA to ncu. A run of its
  # own, so that a metric this ncu lacks fails that run alone.
  local wgmma_metrics="$tensor_metrics,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
  # recipe | kernel regex | launches profiled (ncu replays each one: a few seconds a run) |
  # matching launches skipped first | "tensor" or "wgmma" where the run adds those metrics |
  # another setting, if any. The attention's:
  # the step runs llama2-1b-gpu's 24 layers' forward kernels, then per layer from the last the
  # backward's three (delta, dK/dV, dQ), so skipping 22 profiles the last two forwards and the
  # last two layers' backward. The element-wise kernels run in three: the forward's (its first
  # layers; RoPE's kernel, which rotates q and k into the flash kernels' bf16 copies, is also
  # the backward's, so it is left out of the backward's run, where its 48 forward launches
  # would fill the window), the backward's (the loss, then the last layers'), and AdamW's
  # launches at the step's end, which one run over all would never reach in its first launches.
  # actq's saved activations: their quantizers in the forward, their dequantization (to bf16,
  # for the weight gradients) in the backward.
  local runs=(
    "fp8mix|regex:quantize_fp|60|0||"
    "fp8mix|regex:sum_squares_chunks|4|0||"
    "bf16|regex:flash|8|22|tensor|"
    "bf16|regex:wgmma|8|22|wgmma|model.attention=flash_wgmma"
    "bf16|regex:rmsnorm_forward|swiglu_forward|residual|convert_to_bf16|rope|24|0||"
    "bf16|regex:cross_entropy|rmsnorm_backward|swiglu_backward|swiglu_gradient|30|0||"
    "bf16|regex:adamw|7|0||"
    "actq|regex:quantize_int_groups|quantize_pack|group_scales|8|0||"
    "actq|regex:dequantize_int|8|0||")
  local run recipe regex count skip extra setting run_metrics out failed=0 files=() ran=0
  for run in "${runs[@]}"; do
    recipe=${run%%|*} regex=${run#*|} setting=${regex##*|} regex=${regex%|*}
    extra=${regex##*|} regex=${regex%|*}
    skip=${regex##*|} regex=${regex%|*} count=${regex##*|} regex=${regex%|*}
    if [ "$extra" = wgmma ] && [ "$(gpu_compute_capability)" != 9.0 ]; then
      echo "=== $recipe, kernels $regex: left out (wgmma is sm_90a's)" >>"$logs/profile.log"
      continue
    fi
    run_metrics=$metrics
    [ "$extra" = tensor ] && run_metrics="$metrics,$tensor_metrics"
    [ "$extra" = wgmma ] && run_metrics="$metrics,$wgmma_metrics"
    out="$work/profile-${#files[@]}.txt"
    ran=$((ran + 1))
    timeout -k 5 25 "$ncu" --clock-control none --metrics "$run_metrics" --print-summary per-kernel \
      -k "$regex" --launch-skip "$skip" --launch-count "$count" "$bundle/bin/gnmr" bench \
      --config "$config" --backend cuda --steps 1 --warmup 0 --set "precision.recipe=$recipe" \
      ${setting:+--set "$setting"} >"$out" 2>&1 || failed=$((failed + 1))
    { echo "=== $recipe, kernels $regex (at most $count launches after $skip)"; cat "$out"; } >>"$logs/profile.log"
    files+=("$out")
  done
  { echo "=== the table"; python3 scripts/ncu_summary.py "${files[@]}"; } >>"$logs/profile.log" 2>&1
  local line
  line="$(python3 scripts/ncu_summary.py --line "${files[@]}" 2>&1)" || { status=FAIL why="ncu profiled no kernel (profile.log)"; return; }
  if ((failed)); then status=FAIL why="$failed of $ran ncu runs failed (profile.log); $line"; else status=PASS why="$line"; fi
}

declare -A timeout_s=([preflight]=20 [gemm-sweep]=45 [gpu-tests]=180 [e2e]=60 [memcheck]=60 [bench]=150 [racecheck]=90 [attention-bench]=60 [profile]=180)
# Inside a stage: one test suite, one bench run, one e2e training run (a hang costs that, not
# the stage and every suite or run after it).
suite_timeout_s=45 run_timeout_s=45
# The emulation runs kernels on one host thread (the gpu tests alone take 10-15 minutes).
((emulated)) && timeout_s=([preflight]=60 [gemm-sweep]=300 [gpu-tests]=1200 [e2e]=1200 [memcheck]=60 [bench]=300 [racecheck]=60 [attention-bench]=300 [profile]=60) \
  && suite_timeout_s=600 run_timeout_s=300
((emulated)) && echo "DRY RUN on the CUDA emulation ($bundle): no GPU ran; a PASS says the script, the bundle and the code paths work, not that a GPU does"
row() { printf '%-11s %-5s %5s  %s\n' "$@"; }
# Every row of a dry run says so, so a table pasted elsewhere cannot pass for a GPU's.
((emulated)) && row() { printf '%-11s %-5s %5s  %s\n' "$1" "$2" "$3" "${4:+DRY RUN: $4}"; }
header() { printf '%-11s %-5s %5s  %s\n' stage result secs detail; }
header | tee "$logs/table.txt"
for stage in "${stages[@]}"; do
  : >"$logs/$stage.log"
  start=$(date +%s)
  status=FAIL why="did not finish within ${timeout_s[$stage]} s"
  # Each stage runs in a subshell under its own timeout (then KILL 15 s later, for a process
  # stuck in the driver); it reports through a file.
  export -f note have_gpu gpu_compute_capability cuda_backend_built needs_backend sanitizer_ready run_sanitizer run_test_part "stage_${stage//-/_}"
  export bundle logs work stage gpu_name gpu_count gpu_compute_mode cuda_root cuda_lib require_gpu emulated suite_timeout_s run_timeout_s
  timeout -k 15 "${timeout_s[$stage]}" bash -c "stage_${stage//-/_}; echo \"\$status\" >'$work/$stage.status'; echo \"\$why\" >>'$work/$stage.status'" \
    && { status=$(sed -n 1p "$work/$stage.status"); why=$(sed -n 2p "$work/$stage.status"); }
  result[$stage]=$status detail[$stage]=$why seconds[$stage]=$(($(date +%s) - start))
  # The row now, so a run cut off later still shows what finished.
  row "$stage" "$status" "${seconds[$stage]}" "$why" | tee -a "$logs/table.txt"
  if [ -n "$archive" ] && ! tar -czf "$archive" -C "$logs" .; then
    echo "gpu_check.sh: could not write the archive $archive" >&2
  fi
done

echo
header
failed=0
for stage in "${stages[@]}"; do
  row "$stage" "${result[$stage]}" "${seconds[$stage]}" "${detail[$stage]}"
  [ "${result[$stage]}" = FAIL ] && failed=1
done
echo "logs: $logs"
exit $failed
