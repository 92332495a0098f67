#!/usr/bin/env bash
# Verifies gnmr on a machine with an NVIDIA GPU, from a bundle made by scripts/gpu_bundle.sh:
# needs the NVIDIA driver and a CUDA 13 toolkit (for cudart, cuBLASLt, compute-sanitizer), none
# of our Debian packages, no network, no root. Prints a pass/fail table last; exits 1 if any
# stage failed (a stage that cannot run here says why and is not a failure).
#
#   scripts/gpu_check.sh [--bundle DIR] [--logs DIR] [STAGE...]
#     --bundle DIR   the bundle (default build/gpu-bundle)
#     --logs DIR     where each stage writes STAGE.log (default gpu-check-logs)
#   stages, in order (default all), each under its own timeout, together at most 8 minutes:
#     preflight   the GPU (name, compute capability, driver), the CUDA libraries the bundle
#                 needs found on this machine, every bundle binary's libraries resolved, and
#                 `gnmr version` running                                              (30 s)
#     gemm-sweep  cuBLASLt has an algorithm for every GEMM of tiny-gpu and llama2-1b-gpu
#                 (each projection and the lm_head, each role, fp32 / bf16 / FP8)      (60 s)
#     gpu-tests   the bundle's `gpu` tests: each CUDA kernel vs its CPU twin, the backend
#                 vs the CPU backend; a test that skips on a machine with a GPU fails  (150 s)
#     e2e         tiny-model runs per recipe on the GPU vs the CPU losses recorded in the
#                 bundle (reference/cpu_runs.json)                                     (90 s)
#     memcheck    compute-sanitizer memcheck and initcheck over the gpu tests          (90 s)
#     bench       gnmr bench on the GPU: bf16, fp8mix low/high, actq, GNMR             (60 s)
#   and, only when named (not in the default run):
#     attention-bench  flash (SIMT, tensor cores) vs v1 attention, TFLOP/s and memory at
#                 T = 1024, 2048, 4096, hd 128 (bin/bench_gpu_attention)               (60 s)
# e2e and bench need a gnmr built with the CUDA backend.
set -uo pipefail
cd "$(dirname "$0")/.."

bundle=build/gpu-bundle
logs=gpu-check-logs
stages=()
while (($#)); do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    preflight | gemm-sweep | gpu-tests | e2e | memcheck | bench | attention-bench) stages+=("$1"); shift ;;
    *) echo "gpu_check.sh: unknown argument \"$1\" (see --help)" >&2; exit 2 ;;
  esac
done
((${#stages[@]})) || stages=(preflight gemm-sweep gpu-tests e2e memcheck bench)
bundle="$(cd "$bundle" 2>/dev/null && pwd)" || { echo "gpu_check.sh: no bundle at $bundle (scripts/gpu_bundle.sh makes one)" >&2; exit 2; }
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"

declare -A result detail seconds
note() { echo "[$stage] $*" | tee -a "$logs/$stage.log"; }

# ---- what this machine has ----
cuda_root=""
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda; do
  [ -n "$dir" ] && [ -d "$dir" ] && { cuda_root="$dir"; break; }
done
cuda_lib=""
for dir in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib"; do
  [ -e "$dir/libcudart.so.13" ] && { cuda_lib="$dir"; break; }
done
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
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name="$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  gpu_count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
fi
have_gpu() { [ -n "$gpu_name" ]; }
cuda_backend_built() { "$bundle/bin/gnmr" version 2>/dev/null | grep -q "^backends:.*cuda"; }
export GNMR_TEST_SOURCE_DIR="$bundle/share" GNMR_TEST_BINARY="$bundle/bin/gnmr"

# ---- stages: each sets status (PASS / FAIL / SKIP) and a one-line why ----
stage_preflight() {
  local missing=0
  note "bundle: $(tr -d '\n' <"$bundle/BUNDLE.json" 2>/dev/null)"
  note "CUDA toolkit: ${cuda_root:-not found} (libcudart.so.13 in ${cuda_lib:-nowhere})"
  note "NCCL: ${GNMR_NCCL_LIBRARY:-not in the toolkit nor in PyTorch, so the dynamic loader decides (the GpuNccl tests skip, and gpu-tests fails, where it finds none)}"
  for binary in "$bundle"/bin/* "$bundle"/tests/*; do
    if ldd "$binary" | grep "not found" >>"$logs/preflight.log"; then
      note "$(basename "$binary"): libraries not found (above)"
      missing=1
    fi
  done
  if ! "$bundle/bin/gnmr" version >>"$logs/preflight.log" 2>&1; then
    status=FAIL why="bin/gnmr version does not run (see preflight.log)"; return
  fi
  ((missing)) && { status=FAIL why="libraries not found (see preflight.log)"; return; }
  if ! have_gpu; then status=SKIP why="no GPU (nvidia-smi finds none); the bundle itself runs"; return; fi
  note "GPU: $gpu_name"
  local cap
  cap="$(echo "$gpu_name" | awk -F', ' '{print $2}')"
  case "$cap" in
    8.0 | 9.0) status=PASS why="$gpu_name" ;;
    *) status=FAIL why="compute capability $cap: the bundle has code for 8.0 and 9.0 only ($gpu_name)" ;;
  esac
}

stage_gpu_tests() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  [ -x "$bundle/tests/test_gpu" ] || { status=FAIL why="the bundle has no tests/test_gpu"; return; }
  local failed=0 skipped filter='-GpuGemmSweep.*'
  # Tests named *TwoGpus* need two devices (NCCL takes one rank per GPU): on one they are left
  # out, and the log says so, rather than skipped (a skip here is a failure).
  if ((gpu_count < 2)); then
    filter+=':*TwoGpus*'
    note "$gpu_count GPU(s): the *TwoGpus* tests (2-rank NCCL training) are left out"
  fi
  "$bundle/tests/test_gpu" --gtest_filter="$filter" >>"$logs/gpu-tests.log" 2>&1 || failed=1
  skipped=$(grep -c "^\[  SKIPPED \]" "$logs/gpu-tests.log" || true)
  if ((failed)); then status=FAIL why="$(grep -c "^\[  FAILED  \]" "$logs/gpu-tests.log") failed (gpu-tests.log)"
  elif ((skipped)); then status=FAIL why="$skipped tests skipped although a GPU is present"
  else status=PASS why="$(grep -c "^\[       OK \]" "$logs/gpu-tests.log") tests"; fi
}

stage_memcheck() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  command -v compute-sanitizer >/dev/null || { status=FAIL why="compute-sanitizer not in the CUDA toolkit here"; return; }
  # Under the sanitizer (10-100x slower): every kernel test, the flash kernels on the short
  # sequences (plain SIMT at T = 1000 is too slow; the short ones cover every code path), and
  # one end-to-end training run, fp8mix, the recipe with the most kernels. Not the sweep (no
  # kernels of ours) nor the command-line tests (GpuCli, GpuDataParallel: they run gnmr in child
  # processes).
  local errors=0 filter
  for tool in memcheck initcheck; do
    for filter in \
      '-GpuGemmSweep.*:*GpuTraining.*:GpuCli.*:GpuDataParallel.*:GpuFlashAttention.*LongSequence*:GpuFlashAttention.GivesTheSameBitsOnEveryRun' \
      '*GpuTraining.MatchesTheCpuBackend*/fp8mix'; do
      compute-sanitizer --tool "$tool" --error-exitcode 99 "$bundle/tests/test_gpu" \
        --gtest_filter="$filter" >>"$logs/memcheck.log" 2>&1 \
        || { errors=$((errors + 1)); note "$tool on $filter reported errors"; }
    done
  done
  if ((errors)); then status=FAIL why="$errors sanitizer runs reported errors (memcheck.log)"
  else status=PASS why="memcheck + initcheck clean over the gpu tests"; fi
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
    status=PASS why="$(tail -n 20 "$logs/gemm-sweep.log" | grep "GEMMs checked")"
  else
    status=FAIL why="$(grep -c "  NONE" "$logs/gemm-sweep.log") GEMMs without an algorithm (gemm-sweep.log)"
  fi
}

stage_e2e() {
  needs_backend || return
  command -v python3 >/dev/null || { status=FAIL why="python3 not found (the comparison needs it)"; return; }
  local work="$logs/e2e-work"
  rm -rf "$work" && mkdir -p "$work"
  # The same shards the reference was made from: the bundled corpus and tokenizer.
  "$bundle/bin/gnmr" prepare --no-progress --val-fraction 0.05 \
    --tokenizer "$bundle/share/data/brown/tokenizer.model" --out "$work/shards" \
    "$bundle/share/data/brown/brown.jsonl.gz" >>"$logs/e2e.log" 2>&1 \
    || { status=FAIL why="gnmr prepare failed (e2e.log)"; return; }
  local verdict
  verdict="$(python3 - "$bundle" "$work" <<'EOF_PY' 2>>"$logs/e2e.log"
import json, subprocess, sys
bundle, work = sys.argv[1], sys.argv[2]
reference = json.load(open(f"{bundle}/reference/cpu_runs.json"))
# Relative |gpu - cpu| / cpu allowed per step (tests/gpu/test_gpu_training.cpp explains them):
# step 1 runs on the same weights, later steps compound the GEMMs' different summation order.
tolerance = {"fp32": (1e-5, 1e-4), "bf16": (1e-5, 1e-4), "actq": (1e-4, 1e-3),
             "fp8mix": (2e-3, 5e-3), "fp8mix-fp4": (2e-3, 1e-2), "int8": (1e-4, 1e-3)}
failed, worst = [], {}
for name, run in reference["runs"].items():
    config = run["config"]
    config["include"] = f"{bundle}/share/configs/models/tiny.json"
    config["data"].update({"train": f"{work}/shards/train_*.bin", "val": f"{work}/shards/val_*.bin",
                           "tokenizer": f"{bundle}/share/data/brown/tokenizer.model"})
    config["backend"] = "cuda"
    path = f"{work}/{name}.json"
    json.dump(config, open(path, "w"))
    with open(f"{work}/{name}.log", "w") as log:
        done = subprocess.run([f"{bundle}/bin/gnmr", "train", "--config", path, "--out",
                               f"{work}/{name}", "--force"], stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        failed.append(f"{name} exited {done.returncode}")
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
  local config="$bundle/share/configs/bench/llama2-1b-gpu-seq1024.json" failed=0 lines=""
  [ -f "$config" ] || { status=FAIL why="no $config in the bundle"; return; }
  for recipe in bf16 fp8mix actq; do
    if "$bundle/bin/gnmr" bench --config "$config" --backend cuda --steps 5 --warmup 3 --set precision.recipe=$recipe \
      >>"$logs/bench.log" 2>&1; then
      lines+="$recipe $(grep -o '[0-9.]* tok/s' "$logs/bench.log" | tail -1); "
    else
      failed=$((failed + 1)); lines+="$recipe failed; "
    fi
  done
  if ((failed)); then status=FAIL why="$lines(bench.log)"; else status=PASS why="$lines"; fi
}

# Attention speed, flash next to v1 (forward and backward TFLOP/s, memory), one JSON line per
# kernel and T in attention-bench.log. Not in the default stages (they fill the 8 minutes):
# run it as `gpu_check.sh attention-bench`.
stage_attention_bench() {
  have_gpu || { status=SKIP why="no GPU"; return; }
  [ -x "$bundle/bin/bench_gpu_attention" ] || { status=FAIL why="the bundle has no bin/bench_gpu_attention"; return; }
  if "$bundle/bin/bench_gpu_attention" >"$logs/attention-bench.json" 2>>"$logs/attention-bench.log"; then
    cat "$logs/attention-bench.json" >>"$logs/attention-bench.log"
    status=PASS why="$(python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("; ".join(f"{r[\"kernel\"]} T={r[\"T\"]} fwd {r[\"forward_tflops\"]} bwd {r[\"backward_tflops\"]} TFLOP/s {r[\"memory_mib\"]} MiB" for r in rows))' "$logs/attention-bench.json")"
  else
    status=FAIL why="bench_gpu_attention failed (attention-bench.log)"
  fi
}

declare -A timeout_s=([preflight]=30 [gemm-sweep]=60 [gpu-tests]=150 [e2e]=90 [memcheck]=90 [bench]=60 [attention-bench]=60)
for stage in "${stages[@]}"; do
  : >"$logs/$stage.log"
  start=$(date +%s)
  status=FAIL why="did not finish within ${timeout_s[$stage]} s"
  # Each stage runs in a subshell under its own timeout; it reports through a file.
  export -f note have_gpu cuda_backend_built needs_backend "stage_${stage//-/_}"
  export bundle logs stage gpu_name gpu_count cuda_root cuda_lib
  timeout "${timeout_s[$stage]}" bash -c "stage_${stage//-/_}; echo \"\$status\" >'$logs/$stage.status'; echo \"\$why\" >>'$logs/$stage.status'" \
    && { status=$(sed -n 1p "$logs/$stage.status"); why=$(sed -n 2p "$logs/$stage.status"); }
  result[$stage]=$status detail[$stage]=$why seconds[$stage]=$(($(date +%s) - start))
done

echo
printf '%-11s %-5s %5s  %s\n' stage result secs detail
failed=0
for stage in "${stages[@]}"; do
  printf '%-11s %-5s %5s  %s\n' "$stage" "${result[$stage]}" "${seconds[$stage]}" "${detail[$stage]}"
  [ "${result[$stage]}" = FAIL ] && failed=1
done
echo "logs: $logs"
exit $failed
