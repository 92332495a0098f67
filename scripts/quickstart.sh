#!/usr/bin/env bash
# The README's main job: tokenize the bundled Brown corpus and pretrain the tiny LLaMA-2
# on it (CPU by default; --backend cuda when a CUDA build and a GPU are present).
#   scripts/quickstart.sh [extra `gnmr train` flags, e.g. --steps 100 --backend cuda]
set -euo pipefail
cd "$(dirname "$0")/.."
gnmr=build/release/src/cli/gnmr
[ -x "$gnmr" ] || bash scripts/setup.sh
if [ ! -f runs/brown-shards/prepare.json ]; then
  "$gnmr" prepare --val-fraction 0.05 --tokenizer data/brown/tokenizer.model --out runs/brown-shards data/brown/brown.jsonl.gz
fi
# --resume auto continues a run, starts over one that stopped before its first checkpoint, and
# starts an empty directory fresh; a --force or --resume of the caller's own takes its place.
resume=(--resume auto)
for arg in "$@"; do
  case "$arg" in
  --force | --resume | --resume=*) resume=() ;;
  esac
done
"$gnmr" train --config configs/quickstart.json --out runs/quickstart "${resume[@]}" "$@"
"$gnmr" eval --checkpoint "$(ls -d runs/quickstart/checkpoints/step_* | tail -n 1)" \
  --data 'runs/brown-shards/val_*.bin' --json
