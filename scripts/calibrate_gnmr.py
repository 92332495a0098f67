#!/usr/bin/python3
"""Threshold-exceedance rates of GNMR settings, replayed on a recorded per-unit norm trace.

Record the trace once with the controller out of the way, e.g. the static low path:

    gnmr train --config ... --set gnmr.controller=static_low --set log.gnmr_trace=true

then see, for each history start, decision warm-up and threshold, which fraction of the
eligible unit-steps would exceed α (GNMR) or β (Δ-GNMR):

    /usr/bin/python3 scripts/calibrate_gnmr.py RUN_DIR/gnmr_trace.jsonl \
        --history-start 0,40,60 --warmup 20,50 --alpha 1.5,2,3

Pick the setting whose exceedance rate is near the recovery budget (gnmr.max_active as a
fraction of the units): far above it the budget is always full and the choice of units
churns; far below it the controller rarely acts. The replay uses the monitor's definitions
(src/controller/monitor.h, history "raw", one decision unit per projection): GNMR_t = n_t / mean of
the unit's earlier recorded norms, Δ-GNMR_t = GNMR_t / mean of its previous δ GNMR values;
steps before --history-start are not recorded; a unit-step is eligible from --warmup on once
both are defined. Replaying a static-low trace ignores that routing changes the norms a
little. Standard library only. Exit status 2 for a bad option or an unreadable trace, 1 for
a trace that is not one.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments.arguments import whole_number  # noqa: E402


def read_norms(path):
    """The per-step norm vectors of a gnmr_trace.jsonl, in step order."""
    steps = []
    try:
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{line_number}: not JSON ({e})")
                if row.get("kind") != "gnmr_trace" or "norm" not in row:
                    continue
                if row.get("granularity", "projection") != "projection":
                    sys.exit(f"{path}: granularity {row['granularity']!r}; this replay handles "
                             "per-projection traces only")
                steps.append((row["step"], row["norm"]))
    except UnicodeDecodeError:
        sys.exit(f"{path}: not UTF-8 text (a gnmr_trace.jsonl is)")
    if not steps:
        sys.exit(f"{path}: no gnmr_trace lines (train with --set log.gnmr_trace=true)")
    steps.sort()
    return steps


def exceedance(steps, history_start, warmup, alpha, beta, window):
    """(exceedance rate, GNMR-only rate, Δ-only rate, eligible unit-steps)."""
    n_units = len(steps[0][1])
    eligible = exceeding = gnmr_over = delta_over = 0
    for unit in range(n_units):
        norm_sum, count, recent = 0.0, 0, []
        for step, norms in steps:
            norm = norms[unit]
            if step < history_start:
                continue
            if norm is None or not math.isfinite(norm) or norm < 0:
                # As the controller: an invalid norm (null in the trace) after warm-up is an
                # eligible unit-step that exceeds, and stays out of the history.
                if step >= warmup:
                    eligible += 1
                    exceeding += 1
                continue
            if count > 0 and norm_sum > 0:
                gnmr = norm / (norm_sum / count)
                if len(recent) == window and step >= warmup:
                    window_mean = sum(recent) / window
                    delta = gnmr / window_mean if window_mean > 0 else math.inf
                    eligible += 1
                    over_alpha, over_beta = gnmr > alpha, delta > beta
                    gnmr_over += over_alpha
                    delta_over += over_beta
                    exceeding += over_alpha or over_beta
                recent = (recent + [gnmr])[-window:]
            norm_sum += norm
            count += 1
    if eligible == 0:
        return None
    return exceeding / eligible, gnmr_over / eligible, delta_over / eligible, eligible


def number_list(text, kind):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="gnmr_trace.jsonl of a run (log.gnmr_trace=true)")
    parser.add_argument("--history-start", type=lambda t: number_list(t, int), default=[0],
                        help="gnmr.history_start values (default 0)")
    parser.add_argument("--warmup", type=lambda t: number_list(t, int), default=[20],
                        help="gnmr.warmup_steps values (default 20)")
    parser.add_argument("--alpha", type=lambda t: number_list(t, float), default=[1.5],
                        help="α values; β = α unless --beta is given (default 1.5)")
    parser.add_argument("--beta", type=lambda t: number_list(t, float), default=None,
                        help="β values (default: equal to α)")
    parser.add_argument("--window", type=whole_number(1), default=8, help="δ, at least 1 (default 8)")
    args = parser.parse_args()

    try:
        steps = read_norms(args.trace)
    except OSError as e:
        parser.error(f"cannot read {args.trace}: {e.strerror}")
    print(f"{args.trace}: {len(steps)} steps x {len(steps[0][1])} units, window {args.window}")
    print("| history_start | warmup_steps | alpha | beta | exceedance | GNMR > alpha | "
          "Δ > beta | eligible unit-steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for history_start in args.history_start:
        for warmup in args.warmup:
            for i, alpha in enumerate(args.alpha):
                betas = args.beta if args.beta is not None else [alpha]
                for beta in betas:
                    r = exceedance(steps, history_start, warmup, alpha, beta, args.window)
                    if r is None:
                        print(f"| {history_start} | {warmup} | {alpha:g} | {beta:g} | "
                              "no eligible unit-steps | | | 0 |")
                        continue
                    print(f"| {history_start} | {warmup} | {alpha:g} | {beta:g} | "
                          f"{100 * r[0]:.1f}% | {100 * r[1]:.1f}% | {100 * r[2]:.1f}% | {r[3]} |")


if __name__ == "__main__":
    main()
