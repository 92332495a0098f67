#!/usr/bin/python3
"""scripts/experiments/report.py's collect on hand-made run directories: a run whose final
validation loss is not finite (null in metrics.jsonl) finished diverged, and is named as such
instead of entering the perplexity statistics."""

import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
from experiments import report  # noqa: E402

failures = []
cell = {"owner_table": "t", "cell": "c", "method": "gnmr", "model": "tiny"}
with tempfile.TemporaryDirectory() as root:
    runs = []
    for seed, final_loss in ((1, 2.0), (2, 3.0), (3, None), (4, 800.0)):
        run_dir = os.path.join(root, f"seed{seed}")
        os.makedirs(run_dir)
        lines = [{"kind": "run", "step": 0},
                 {"kind": "train", "step": 1, "loss": 4.0},
                 {"kind": "eval", "step": 1, "val_loss": 3.5, "val_ppl": 33.1},
                 {"kind": "train", "step": 2, "loss": None},
                 {"kind": "eval", "step": 2, "val_loss": final_loss,
                  # 2**800 stands for exp(800): a finite loss whose perplexity overflows
                  "val_ppl": None if final_loss is None or final_loss > 700 else
                  2.0 ** final_loss}]
        with open(os.path.join(run_dir, "metrics.jsonl"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        runs.append({"run_dir": run_dir, "seed": seed, "cell": cell, "steps": 2})
    results = {r["run_dir"]: {"status": "done"} for r in runs}
    (stats,) = report.collect([cell], runs, results)

if stats["n"] != 2 or stats["n_asked"] != 4 or stats["n_diverged"] != 2:
    failures.append(f"finished seeds {stats['n']}/{stats['n_asked']}, diverged "
                    f"{stats['n_diverged']}: want 2/4, 2")
if stats["ppl_mean"] != (4.0 + 8.0) / 2 or stats["ppl_max"] != 8.0:
    failures.append(f"perplexity mean {stats['ppl_mean']}, max {stats['ppl_max']}: want 6, 8")
if stats["problems"] != ["seed 3: diverged (its final validation loss is not finite)",
                         "seed 4: diverged (its final validation loss is 800.0: its perplexity "
                         "overflows)"]:
    failures.append(f"problems {stats['problems']}")
diverged = next(r for r in stats["runs"] if r["seed"] == 3)
if diverged["evals"] != [(1, 3.5)]:
    failures.append(f"the diverged run's evals {diverged['evals']}: its null one must go")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("report: all checks passed")
