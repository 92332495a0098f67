#!/usr/bin/env bash
# Builds the fuzz preset (clang, libFuzzer, ASan + UBSan) and runs every target in
# tests/fuzz for a bounded time on a copy of its seed corpus (tests/fuzz/corpus/<target>),
# one after the other. New corpus entries stay in the copy; the repository is not touched.
#   scripts/fuzz.sh              60 s per target
#   scripts/fuzz.sh 300          300 s per target
#   scripts/fuzz.sh 30 config    only fuzz_config
# Exits non-zero on the first finding (crash, sanitizer report, leak, hang > 10 s, > 2 GB)
# and prints the path of the input that triggered it. Reproduce with
#   build/fuzz/tests/fuzz/fuzz_<target> <that input>
# and add its bytes as a regression test to the suite that owns the parser.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(config shard_header safetensors controller_state trainer_json hf_config
  checkpoint_json document_reader)

cmake --preset fuzz
cmake --build --preset fuzz -j "$(nproc)"

work="$(mktemp -d "${TMPDIR:-/tmp}/gnmr_fuzz_run.XXXXXX")"
echo "fuzz: ${seconds} s per target; corpora and findings under $work"
for target in "${targets[@]}"; do
  corpus="$work/$target/corpus"
  findings="$work/$target/findings"
  mkdir -p "$corpus" "$findings"
  cp tests/fuzz/corpus/"$target"/* "$corpus"/
  log="$work/$target/fuzz.log"
  dict=()
  [ -f tests/fuzz/"$target".dict ] && dict=(-dict=tests/fuzz/"$target".dict)
  echo "fuzz: $target"
  status=0
  # stdin from /dev/null: an include of /dev/stdin must fail, not wait for a terminal.
  # TMPDIR: the targets' scratch files (a crash leaves them behind) stay in the run folder.
  TMPDIR="$work/$target" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    build/fuzz/tests/fuzz/fuzz_"$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 -artifact_prefix="$findings/" \
    "${dict[@]}" "$corpus" </dev/null >"$log" 2>&1 || status=$?
  grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec" "$log" |
    sed "s/^/  /" || true
  if ((status != 0)); then
    tail -n 60 "$log" >&2
    echo "fuzz: $target found a problem (exit $status); input:" >&2
    ls -1 "$findings"/* >&2 2>/dev/null || echo "  (none written; see $log)" >&2
    exit 1
  fi
done
echo "fuzz: no findings"
