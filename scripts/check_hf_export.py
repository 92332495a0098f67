#!/usr/bin/env python3
"""Checks a `gnmr export` folder in Hugging Face transformers: the same loss as `gnmr eval`.

    python3 scripts/check_hf_export.py --gnmr build/release/src/cli/gnmr --export exp/run \
        --data 'runs/brown-shards/val_*.bin' [--seq-len 128] [--windows 16] [--text FILE]

Loads the folder with `transformers` (LlamaForCausalLM in fp32, eager attention) and scores
the validation windows `gnmr eval --data` scores (window w of a shard: its tokens
[w·L, w·L + L + 1), shards in name order), then runs `gnmr eval` on the same folder and
windows. With --text, also encodes the file with the folder's tokenizer in transformers and
with sentencepiece (plus the BOS gnmr puts before every document) and compares the ids.
Prints the figures and exits 1 when the losses differ by more than --tolerance or the ids
differ, 2 for a bad option or a missing package.

transformers, torch and sentencepiece are not Debian packages: run it with the Python of a
virtual environment that has them (`pip install torch transformers sentencepiece protobuf`).
"""
import argparse
import array
import glob
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments.arguments import whole_number  # noqa: E402

SHARD_HEADER = struct.Struct("<8sIIQI")  # magic, version, dtype, token count, vocab size
SHARD_HEADER_BYTES = 64


def read_shard(path, most):
    """The first `most` tokens of a shard (all of them if it holds fewer)."""
    with open(path, "rb") as f:
        header = f.read(SHARD_HEADER_BYTES)
        if len(header) < SHARD_HEADER.size:
            sys.exit(f"check_hf_export.py: {path} is not a gnmr token shard (too short)")
        magic, _, dtype, count, _ = SHARD_HEADER.unpack_from(header)
        if magic != b"GNMRTOK\0" or dtype not in (1, 2):
            sys.exit(f"check_hf_export.py: {path} is not a gnmr token shard")
        tokens = array.array("H" if dtype == 1 else "I")
        wanted = min(count, most)
        tokens.frombytes(f.read(wanted * tokens.itemsize))
    if len(tokens) != wanted:
        sys.exit(f"check_hf_export.py: {path} is truncated (its header says {count} tokens)")
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens.tolist()


def eval_windows(shard_glob, seq_len, n_windows):
    """The first n_windows windows `gnmr eval --data` scores, as (inputs, targets) lists."""
    paths = sorted(glob.glob(shard_glob))
    if not paths:
        sys.exit(f"check_hf_export.py: --data {shard_glob!r} matches no file")
    windows = []
    for path in paths:
        tokens = read_shard(path, (n_windows - len(windows)) * seq_len + 1)
        for w in range((len(tokens) - 1) // seq_len):
            if len(windows) == n_windows:
                return windows
            start = w * seq_len
            windows.append((tokens[start:start + seq_len], tokens[start + 1:start + seq_len + 1]))
        if len(windows) == n_windows:
            return windows
    if len(windows) < n_windows:
        sys.exit(f"check_hf_export.py: --data holds {len(windows)} windows of {seq_len + 1} "
                 f"tokens, fewer than --windows {n_windows}")
    return windows


def gnmr_eval(gnmr, export, shard_glob, seq_len, tokens):
    cmd = [gnmr, "eval", "--checkpoint", export, "--data", shard_glob, "--seq-len", str(seq_len),
           "--tokens", str(tokens), "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(f"check_hf_export.py: {' '.join(cmd)} failed (exit {result.returncode})")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gnmr", required=True, help="the gnmr binary")
    parser.add_argument("--export", required=True, help="a folder written by gnmr export")
    parser.add_argument("--data", required=True, help="token shards (a glob), e.g. the val set")
    parser.add_argument("--seq-len", type=whole_number(2), default=128)
    parser.add_argument("--windows", type=whole_number(1), default=16)
    parser.add_argument("--text", help="a text file whose ids are compared")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest |loss difference| accepted (default 1e-4)")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.export, "config.json")):
        parser.error(f"--export {args.export}: no config.json (not an exported folder)")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"check_hf_export.py: {e.name} is not installed for {sys.executable}; run it with "
              "a virtual environment's Python that has torch, transformers, sentencepiece and "
              "protobuf", file=sys.stderr)
        sys.exit(2)

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    windows = eval_windows(args.data, args.seq_len, args.windows)
    model = transformers.LlamaForCausalLM.from_pretrained(
        args.export, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    loss_sum = 0.0
    with torch.no_grad():
        for inputs, targets in windows:
            logits = model(input_ids=torch.tensor([inputs])).logits[0].float()
            loss_sum += torch.nn.functional.cross_entropy(
                logits, torch.tensor(targets), reduction="sum").item()
    hf_loss = loss_sum / (len(windows) * args.seq_len)
    gnmr = gnmr_eval(args.gnmr, args.export, args.data, args.seq_len,
                     len(windows) * args.seq_len)
    difference = abs(hf_loss - gnmr["loss"])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: loss "
          f"{hf_loss:.9f} over {len(windows) * args.seq_len} tokens")
    print(f"gnmr eval: loss {gnmr['loss']:.9f} over {gnmr['tokens']} tokens")
    print(f"|difference| {difference:.3e} (tolerance {args.tolerance:g})")
    failed = gnmr["tokens"] != len(windows) * args.seq_len or not difference <= args.tolerance

    if args.text:
        import sentencepiece
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.export)
        processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(args.export, "tokenizer.model"))
        expected = [processor.bos_id()] + processor.encode(text)
        ids = tokenizer(text).input_ids
        same = ids == expected
        first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b),
                     min(len(ids), len(expected)))
        print(f"tokenizer ({type(tokenizer).__name__}): {len(ids)} ids, sentencepiece + BOS "
              f"{len(expected)}: " + ("the same" if same else f"differ from id {first}"))
        failed = failed or not same
    sys.exit(1 if failed or math.isnan(difference) else 0)


if __name__ == "__main__":
    main()
