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
churns; far below it the controller rarely acts. Each option left out takes the run's own
value from the config.json beside the trace (else the controller's default), so a replay with
no options reproduces the exceedance rate the run reported (gnmr_summary.json). The replay
uses the monitor's definitions (src/controller/monitor.h, one decision unit per projection):
GNMR_t = n_t / mean of the unit's earlier recorded norms, Δ-GNMR_t = GNMR_t / mean of its
previous δ GNMR values; under --history capped a GNMR above α is recorded as α (its norm as α
× the mean); steps before --history-start are not recorded; a unit-step is eligible from
--warmup on once both are defined; a gnmr_no_delta run counts no Δ-GNMR exceedance (β = ∞
unless --beta is given). Thresholds are constant: a run with a linear or cosine
gnmr.threshold_schedule is replayed at its starting α, β, with a warning. Replaying a
static-low trace ignores that routing changes the norms a little. Standard library only. Exit
status 2 for a bad option or an unreadable trace, 1 for a trace that is not one.
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


def exceedance(steps, history_start, warmup, alpha, beta, window, history="raw"):
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
                if history == "capped" and gnmr > alpha:  # as RiskMonitor::observe
                    norm, gnmr = alpha * (norm_sum / count), alpha
                recent = (recent + [gnmr])[-window:]
            norm_sum += norm
            count += 1
    if eligible == 0:
        return None
    return exceeding / eligible, gnmr_over / eligible, delta_over / eligible, eligible


def number_list(text, kind, positive=False):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if any(v < 0 or (positive and v == 0) for v in values):
        raise argparse.ArgumentTypeError(
            f"expected {'positive' if positive else 'non-negative'} numbers, got {text!r}")
    return values


# The controller's defaults (src/controller/controller_options.h; `gnmr config show` prints
# them, and tests/scripts/check_reproduce_smoke.py compares), for a trace without a run.
DEFAULTS = {"controller": "gnmr", "history_start": 0, "warmup_steps": 20, "alpha": 1.5,
            "beta": 1.5, "window": 8, "history": "raw", "threshold_schedule": "constant"}


def run_settings(trace):
    """The gnmr.* settings of the run that wrote TRACE (its config.json beside it), over the
    controller's defaults; the defaults alone where there is none."""
    settings = dict(DEFAULTS)
    config = os.path.join(os.path.dirname(os.path.abspath(trace)), "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            gnmr = json.load(f).get("gnmr", {})
    except (OSError, ValueError, AttributeError):
        return settings, None
    settings.update({k: gnmr[k] for k in DEFAULTS if gnmr.get(k) is not None})
    return settings, config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="gnmr_trace.jsonl of a run (log.gnmr_trace=true)")
    run = "the run's (its config.json beside the trace), else the controller's"
    parser.add_argument("--history-start", type=lambda t: number_list(t, int), default=None,
                        help=f"gnmr.history_start values (default: {run}: 0)")
    parser.add_argument("--warmup", type=lambda t: number_list(t, int), default=None,
                        help=f"gnmr.warmup_steps values (default: {run}: 20)")
    parser.add_argument("--alpha", type=lambda t: number_list(t, float, positive=True),
                        default=None, help=f"α values (default: {run}: 1.5)")
    parser.add_argument("--beta", type=lambda t: number_list(t, float, positive=True),
                        default=None,
                        help="β values (default: equal to α where --alpha is given, else the run's)")
    parser.add_argument("--window", type=whole_number(1), default=None,
                        help=f"δ, at least 1 (default: {run}: 8)")
    parser.add_argument("--history", choices=["raw", "capped"], default=None,
                        help=f"gnmr.history (default: {run}: raw)")
    args = parser.parse_args()

    run_gnmr, config = run_settings(args.trace)
    history_starts = args.history_start or [run_gnmr["history_start"]]
    warmups = args.warmup or [run_gnmr["warmup_steps"]]
    alphas = args.alpha or [run_gnmr["alpha"]]
    window = args.window or run_gnmr["window"]
    history = args.history or run_gnmr["history"]
    if run_gnmr["threshold_schedule"] != "constant":
        print(f"warning: the run's gnmr.threshold_schedule is {run_gnmr['threshold_schedule']!r}; "
              "this replay holds α and β constant, so its rates are not the run's",
              file=sys.stderr)
    try:
        steps = read_norms(args.trace)
    except OSError as e:
        parser.error(f"cannot read {args.trace}: {e.strerror}")
    source = f"the run's settings from {config}" if config else "the controller's defaults"
    print(f"{args.trace}: {len(steps)} steps x {len(steps[0][1])} units, window {window}, "
          f"history {history}; options not given: {source}")
    print("| history_start | warmup_steps | alpha | beta | exceedance | GNMR > alpha | "
          "Δ > beta | eligible unit-steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for history_start in history_starts:
        for warmup in warmups:
            for alpha in alphas:
                betas = args.beta or ([alpha] if args.alpha else [run_gnmr["beta"]])
                if run_gnmr["controller"] == "gnmr_no_delta" and not args.beta:
                    betas = [math.inf]  # as Controller::observe: no Δ-GNMR exceedance
                for beta in betas:
                    r = exceedance(steps, history_start, warmup, alpha, beta, window, history)
                    if r is None:
                        print(f"| {history_start} | {warmup} | {alpha:g} | {beta:g} | "
                              "no eligible unit-steps | | | 0 |")
                        continue
                    print(f"| {history_start} | {warmup} | {alpha:g} | {beta:g} | "
                          f"{100 * r[0]:.1f}% | {100 * r[1]:.1f}% | {100 * r[2]:.1f}% | {r[3]} |")


if __name__ == "__main__":
    main()
