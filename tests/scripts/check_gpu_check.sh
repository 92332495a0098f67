#!/usr/bin/env bash
# scripts/gpu_check.sh on a machine without a GPU, over a minimal bundle (this build's gnmr, no
# test binaries): every stage must report cleanly (SKIP, not FAIL), the table must list the
# stages asked for, the logs directory must hold only the stage logs and table.txt (what a run
# hands back), a bad argument must exit 2, a missing library must fail preflight,
# --require-gpu must turn "no GPU" into a failure, a packed bundle must be unpacked, and the
# sanitizer's findings must be read right (a stand-in GPU and compute-sanitizer), and the wgmma
# tests must run on compute capability 9.0 only (a stand-in test_gpu).
#   check_gpu_check.sh GNMR_BINARY WORK_DIR
set -uo pipefail
# Output is searched as grep PATTERN <<<"$out", never echo "$out" | grep -q: grep -q stops at the
# first match, and an echo still writing then dies of SIGPIPE, which pipefail made a failure.
gnmr="$1" work="$2"
script="$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_check.sh"
fail() { echo "check_gpu_check.sh: $*" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && { echo "a GPU is present: skipped"; exit 77; }

rm -rf "$work" && mkdir -p "$work/bundle/bin" "$work/bundle/tests"
cp "$gnmr" "$work/bundle/bin/gnmr"
echo '{"commit": "test"}' >"$work/bundle/BUNDLE.json"

out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" 2>&1) || fail "exit $? without a GPU: $out"
for stage in preflight gemm-sweep gpu-tests e2e memcheck bench racecheck; do
  grep -Eq "^$stage +SKIP" <<<"$out" || fail "stage $stage is not SKIP: $out"
  [ -f "$work/logs/$stage.log" ] || fail "no $stage.log"
done
grep -q "no GPU" <<<"$out" || fail "no 'no GPU' reason: $out"
[ "$(ls "$work/logs" | sort | tr '\n' ' ')" = "bench.log e2e.log gemm-sweep.log gpu-tests.log memcheck.log preflight.log racecheck.log table.txt " ] \
  || fail "the logs directory holds more than the stage logs and the table: $(ls "$work/logs")"
[ "$(grep -Ec '^(preflight|gemm-sweep|gpu-tests|e2e|memcheck|bench|racecheck) +SKIP' "$work/logs/table.txt")" = 7 ] \
  || fail "table.txt does not hold the seven rows: $(cat "$work/logs/table.txt")"
out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" all 2>&1) || fail "'all' exit $?: $out"
grep -Eq "^racecheck +SKIP +[0-9]+ +no GPU" <<<"$out" || fail "'all' did not run the stages: $out"

out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" preflight bench 2>&1)
[ "$(grep -Ec '^(preflight|bench) ' "$work/logs/table.txt")" = 2 ] || fail "stage selection: $out"
grep -Eq '^gpu-tests ' <<<"$out" && fail "an unselected stage ran: $out"
grep -Eq '^attention-bench ' <<<"$out" && fail "attention-bench ran unasked: $out"
grep -Eq '^profile ' <<<"$out" && fail "profile ran unasked: $out"
out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" attention-bench profile 2>&1)
grep -Eq '^attention-bench +SKIP' <<<"$out" || fail "attention-bench is not SKIP: $out"
grep -Eq '^profile +SKIP +[0-9]+ +no GPU' <<<"$out" || fail "profile is not SKIP (no GPU): $out"

# --archive packs the logs directory (after every stage) into one file.
out=$(bash "$script" --bundle "$work/bundle" --logs "$work/archived" --archive "$work/logs.tar.gz" preflight bench 2>&1) \
  || fail "--archive: exit $?: $out"
[ "$(tar -tzf "$work/logs.tar.gz" | sed 's|^\./||' | grep -v '^$' | sort | tr '\n' ' ')" = "bench.log preflight.log table.txt " ] \
  || fail "--archive does not hold the stage logs and the table: $(tar -tzf "$work/logs.tar.gz")"

out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" --require-gpu preflight 2>&1)
[ $? = 1 ] || fail "--require-gpu without a GPU does not exit 1: $out"
grep -Eq '^preflight +FAIL +[0-9]+ +no GPU found' <<<"$out" || fail "--require-gpu: $out"

bash "$script" --bundle "$work/bundle" no-such-stage >/dev/null 2>&1
[ $? = 2 ] || fail "an unknown stage does not exit 2"
for flag in --bundle --logs --archive; do
  out=$(bash "$script" preflight "$flag" 2>&1)
  [ $? = 2 ] && grep -q -- "$flag needs a value" <<<"$out" || fail "$flag without a value: $out"
done
bash "$script" --bundle "$work/no-bundle" >/dev/null 2>&1
[ $? = 2 ] || fail "a missing bundle does not exit 2"

# The packed bundle (gpu_bundle.sh's DIR.tar.gz, what travels) is unpacked to DIR when DIR is
# missing or older than the archive, and only then.
tar -czf "$work/packed.tar.gz" -C "$work" bundle
out=$(bash "$script" --bundle "$work/packed" --logs "$work/logs" preflight 2>&1) || fail "a packed bundle: exit $?: $out"
grep -q "unpacked $work/packed.tar.gz" <<<"$out" || fail "the packed bundle was not unpacked: $out"
[ -x "$work/packed/bin/gnmr" ] || fail "no packed/bin/gnmr after unpacking"
out=$(bash "$script" --bundle "$work/packed" --logs "$work/logs" preflight 2>&1) || fail "an unpacked bundle: exit $?: $out"
grep -q "unpacked" <<<"$out" && fail "a bundle newer than its archive was unpacked again: $out"
touch -d '+1 minute' "$work/packed.tar.gz"
out=$(bash "$script" --bundle "$work/packed/" --logs "$work/logs" preflight 2>&1) || fail "a newer archive: exit $?: $out"
grep -q "unpacked $work/packed.tar.gz" <<<"$out" || fail "a newer archive was not unpacked: $out"

# The sanitizer stages' reading of compute-sanitizer's output, with a stand-in GPU (an
# nvidia-smi that answers) and a stand-in compute-sanitizer printing what the real one prints:
# racecheck's error is a failure, its warnings alone are not, a clean run passes.
mkdir -p "$work/fake"
printf '#!/bin/sh\ncase "$*" in *-L*) echo "GPU 0: NVIDIA H200 (UUID: x)" ;; *compute_mode*) echo "Exclusive_Process" ;; *) echo "NVIDIA H200, 9.0, 580.00" ;; esac\n' >"$work/fake/nvidia-smi"
cat >"$work/fake/compute-sanitizer" <<'FAKE'
#!/bin/sh
tool="$2"
case "$tool:$FAKE_SANITIZER" in
  racecheck:hazard) echo "========= Error: Race reported between Write access at k+0x10 and Read access at k+0x20"
                    echo "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)"; exit 99 ;;
  racecheck:warning) echo "========= RACECHECK SUMMARY: 3 hazards displayed (0 errors, 3 warnings)" ;;
  *:unsupported) echo "========= Error: Device not supported" ; exit 1 ;;
  racecheck:*) echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" ;;
  *) echo "========= ERROR SUMMARY: 0 errors" ;;
esac
exit 0
FAKE
printf '#!/bin/sh\nexit 0\n' >"$work/bundle/tests/test_gpu"
chmod +x "$work/fake/nvidia-smi" "$work/fake/compute-sanitizer" "$work/bundle/tests/test_gpu"
for mode in clean warning hazard; do
  out=$(PATH="$work/fake:$PATH" FAKE_SANITIZER=$mode bash "$script" --bundle "$work/bundle" --logs "$work/logs" racecheck 2>&1)
  rc=$?
  case $mode in
    clean) [ $rc = 0 ] && grep -Eq '^racecheck +PASS .*clean \(RACECHECK SUMMARY: 0 hazards' <<<"$out" || fail "a clean racecheck: exit $rc: $out" ;;
    warning) [ $rc = 0 ] && grep -Eq '^racecheck +PASS .*0 errors, 3 warnings' <<<"$out" || fail "racecheck warnings alone: exit $rc: $out" ;;
    hazard) [ $rc = 1 ] && grep -Eq '^racecheck +FAIL .*1 of 2 sanitizer runs reported errors: RACECHECK SUMMARY: 2 hazards' <<<"$out" || fail "a racecheck error: exit $rc: $out" ;;
  esac
done
grep -q "Race reported between" "$work/logs/racecheck.log" || fail "racecheck.log lacks the sanitizer's report"
out=$(PATH="$work/fake:$PATH" FAKE_SANITIZER=clean bash "$script" --bundle "$work/bundle" --logs "$work/logs" memcheck 2>&1)
grep -Eq '^memcheck +PASS +[0-9]+ +memcheck .* clean' <<<"$out" || fail "a clean memcheck: $out"
out=$(PATH="$work/fake:$PATH" FAKE_SANITIZER=unsupported bash "$script" --bundle "$work/bundle" --logs "$work/logs" memcheck racecheck 2>&1) \
  || fail "an unsupported device fails a sanitizer stage: $out"
[ "$(grep -E '^(memcheck|racecheck) +SKIP .*device not supported' <<<"$out" | sort -u | wc -l)" = 2 ] \
  || fail "an unsupported device is not SKIP in both sanitizer stages: $out"
# preflight reads the stand-in GPU's compute capability (in the stage's subshell: it read "" and
# failed every GPU before gpu_compute_capability was exported to it).
out=$(PATH="$work/fake:$PATH" bash "$script" --bundle "$work/bundle" --logs "$work/logs" preflight 2>&1)
grep -Eq '^preflight +PASS +[0-9]+ +NVIDIA H200, 9.0' <<<"$out" || fail "preflight on a stand-in 9.0 GPU: $out"
grep -q "compute mode: Exclusive_Process" "$work/logs/preflight.log" \
  || fail "preflight.log lacks the GPU's compute mode: $(cat "$work/logs/preflight.log")"
# gpu-tests with a stand-in test_gpu: on compute capability 9.0 the wgmma tests run (a stage runs
# in a subshell, so a helper it calls must be exported to it: without, the capability read ""
# and they were left out everywhere), their findings are repeated in the run's output; on 8.0
# they are left out, and the output says so.
cat >"$work/bundle/tests/test_gpu" <<'FAKE'
#!/bin/sh
case "$1" in
  --gtest_list_tests) printf 'GpuWgmma.\n  ReadsTheLayouts\nGpuFlash.\n  Kernels\n  WgmmaKernels\n' ;;
  *) echo "$*" >>"$FAKE_FILTERS"
     case "$1" in
       --gtest_filter=GpuWgmma*)
         echo "wgmma, A and B in shared memory (K-major): the GPU's D matches the definition"
         echo "wgmma forward, B=1 T=17: out same, lse same as mma.sync's"
         echo "wgmma dq pass, B=1 T=17: dq differs as mma.sync's"
         echo "auto flash attention, hd 64: the wgmma kernels wrote other bits than mma.sync's and were left out"
         echo "wgmma trial process, hd 64: passed; the wgmma kernels were timed beside mma.sync"
         echo "[       OK ] GpuWgmma.ReadsTheLayouts (1 ms)" ;;
       --gtest_filter=GpuFlash.\*Wgmma*) echo "[       OK ] GpuFlash.WgmmaKernels (1 ms)" ;;
       *) echo "[       OK ] GpuFlash.Kernels (1 ms)" ;;
     esac ;;
esac
FAKE
chmod +x "$work/bundle/tests/test_gpu"
mkdir -p "$work/fake80"
sed 's/9\.0/8.0/' "$work/fake/nvidia-smi" >"$work/fake80/nvidia-smi" && chmod +x "$work/fake80/nvidia-smi"
: >"$work/filters"
out=$(PATH="$work/fake:$PATH" FAKE_FILTERS="$work/filters" bash "$script" --bundle "$work/bundle" --logs "$work/logs" gpu-tests 2>&1)
grep -Eq '^gpu-tests +PASS +[0-9]+ +3 tests' <<<"$out" || fail "gpu-tests on a stand-in 9.0 GPU: $out"
# On 9.0 the wgmma tests run in a process of their own, after the suite's others.
grep -q -- '^--gtest_filter=GpuWgmma\.\*-' "$work/filters" || fail "the wgmma suite did not run on compute capability 9.0: $(cat "$work/filters")"
grep -q -- '^--gtest_filter=GpuFlash\.\*-.*\*Wgmma\*' "$work/filters" || fail "GpuFlash's wgmma tests ran with its others on 9.0: $(cat "$work/filters")"
grep -q -- '^--gtest_filter=GpuFlash\.\*Wgmma\*:GpuFlash\.\*flash_wgmma\*-' "$work/filters" || fail "GpuFlash's wgmma tests did not run on their own on 9.0: $(cat "$work/filters")"
grep -q '^\[gpu-tests\] suite GpuFlash (wgmma): 1 passed' <<<"$out" || fail "no note of GpuFlash's wgmma tests: $out"
grep -q "^\[gpu-tests\] wgmma, A and B in shared memory (K-major): the GPU's D matches the definition" <<<"$out" \
  || fail "gpu-tests does not repeat the wgmma findings: $out"
grep -q "^\[gpu-tests\] auto flash attention, hd 64: the wgmma kernels wrote other bits" <<<"$out" \
  || fail "gpu-tests does not repeat whether auto offered the wgmma kernels: $out"
grep -q "^\[gpu-tests\] wgmma trial process, hd 64: passed" <<<"$out" \
  || fail "gpu-tests does not repeat whether the wgmma trial process passed: $out"
grep -q "^\[gpu-tests\] wgmma kernels: 1 of 2 runs give mma.sync's bits in every output" <<<"$out" \
  || fail "gpu-tests does not count the wgmma kernels' bit comparisons: $out"
grep -q "^\[gpu-tests\] first that differs: wgmma dq pass, B=1 T=17: dq differs as mma.sync's" <<<"$out" \
  || fail "gpu-tests does not show the first differing comparison: $out"
: >"$work/filters"
out=$(PATH="$work/fake80:$PATH" FAKE_FILTERS="$work/filters" bash "$script" --bundle "$work/bundle" --logs "$work/logs" gpu-tests 2>&1)
grep -q -- '-.*\*Wgmma\*' "$work/filters" || fail "the wgmma tests ran on compute capability 8.0: $(cat "$work/filters")"
grep -q "compute capability 8.0: the wgmma tests .* are left out" <<<"$out" || fail "no note of the wgmma tests left out on 8.0: $out"
rm "$work/bundle/tests/test_gpu"
out=$(PATH="$work/fake:$PATH" bash "$script" --bundle "$work/bundle" --logs "$work/logs" racecheck 2>&1)
grep -Eq '^racecheck +FAIL +[0-9]+ +the bundle has no tests/test_gpu' <<<"$out" || fail "racecheck without test_gpu: $out"

# A binary whose library is missing fails preflight (exit 1), naming it in the log.
printf '#!/bin/sh\nexit 1\n' >"$work/bundle/bin/gnmr"
out=$(bash "$script" --bundle "$work/bundle" --logs "$work/logs" preflight 2>&1)
[ $? = 1 ] || fail "a gnmr that does not run passes preflight: $out"
grep -Eq '^preflight +FAIL' <<<"$out" || fail "preflight is not FAIL: $out"
echo "gpu_check.sh: every stage reports cleanly without a GPU"
