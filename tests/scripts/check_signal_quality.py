#!/usr/bin/python3
"""scripts/experiments/signal_quality.py on hand-made trace lines whose answers are known: Spearman's
ρ, ranking and choice precision@k, the gap share, ties by lower unit id, null risk as +inf,
and the warm-up filter."""

import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
from experiments import signal_quality as signal  # noqa: E402

failures = []


def check(name, got, want, tol=1e-9):
    ok = (got is None and want is None) or (
        got is not None and want is not None and abs(got - want) <= tol)
    if not ok:
        failures.append(f"{name}: got {got}, want {want}")


def row(step, risk, gap, path):
    return {"kind": "gnmr_trace", "step": step, "risk": risk, "gap": gap, "path": path}


# Risk ranks the units exactly as the gap does: ρ = 1, both precisions 1.
agree = row(10, [0.1, 0.5, 0.2, 0.9], [1, 5, 2, 9], [0, 0, 0, 1])
f = signal.step_figures(agree, 1)
check("agree spearman", f["spearman"], 1.0)
check("agree ranking", f["ranking_precision"], 1.0)
check("agree choice", f["choice_precision"], 1.0)
check("agree gap share", f["top_k_gap_share"], 9 / 17)

# Reversed: ρ = -1; top-2 by risk {0, 2} against top-2 by gap {1, 3}: precision 0; the plan
# chose units 1 and 2: one of them is in the oracle's top 2.
reverse = row(11, [9, 5, 2, 1], [1, 2, 5, 9], [0, 1, 1, 0])
f = signal.step_figures(reverse, 2)
check("reverse spearman", f["spearman"], -1.0)
check("reverse ranking", f["ranking_precision"], 0.0)
check("reverse choice", f["choice_precision"], 0.5)

# Ties by lower id: gaps [3, 3, 1, 1] with k = 1 -> unit 0; risk null (= +inf) ranks first.
ties = row(12, [None, 0, 0, 0], [3, 3, 1, 1], [1, 0, 0, 0])
f = signal.step_figures(ties, 1)
check("ties ranking", f["ranking_precision"], 1.0)
check("ties choice", f["choice_precision"], 1.0)
check("ties spearman", f["spearman"], signal.spearman([math.inf, 0, 0, 0], [3, 3, 1, 1]))

# Nothing chosen: no choice precision for the step; constant risk: no ρ.
calm = row(13, [0, 0, 0, 0], [1, 2, 3, 4], [0, 0, 0, 0])
f = signal.step_figures(calm, 1)
check("calm choice", f["choice_precision"], None)
check("calm spearman", f["spearman"], None)
check("calm ranking", f["ranking_precision"], 0.0)  # risk ties -> unit 0, gap's top is 3

# A line without gaps is not a step of the analysis.
if signal.step_figures({"step": 14, "risk": [0, 1], "path": [0, 0]}, 1) is not None:
    failures.append("a line without gaps was analysed")

# run_figures: means over the steps >= first_step; calm (13) has no choice and no ρ.
r = signal.run_figures([row(5, [1, 0, 0, 0], [0, 0, 0, 9], [1, 0, 0, 0]), agree, reverse, calm],
                       1, first_step=10)
check("run steps", r["steps"], 3)
check("run choice steps", r["choice_steps"], 2)
check("run spearman", r["spearman"], (1.0 + -1.0) / 2)
reverse_k1 = signal.step_figures(reverse, 1)
check("run ranking", r["ranking_precision"], (1.0 + reverse_k1["ranking_precision"] + 0.0) / 3)
# Step totals 17, 17 and 10 (agree, reverse, calm): the top 10% of 3 steps is 1 step, 17/44.
check("run top decile", r["top_decile_step_share"], 17 / 44)
cell = signal.cell_figures([r, r, None])
check("cell seeds", cell["seeds"], 2)
check("cell spearman mean", cell["spearman"][0], 0.0)
check("cell spearman sd", cell["spearman"][1], 0.0)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("signal quality: all checks passed")
