#!/usr/bin/python3
"""End-to-end check of scripts/reproduce.py at the `smoke` scale (a few steps of the tiny
model): it runs a table, writes table.md with one row per cell, the runs' threads per GEMM
and the plots, and a second invocation skips the finished runs. A run made with another
setting is stale, not reused, and --report-only notes the runs that did not finish. Then
every table file must load at every scale (--dry-run). Exits 77 (ctest SKIP_RETURN_CODE)
when this Python lacks numpy.

  check_reproduce_smoke.py --gnmr PATH --out DIR [--table actq]
"""

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "reproduce.py")


def fail(msg, output=""):
    print(output)
    print(f"FAIL: {msg}")
    sys.exit(1)


def reproduce(args, *extra, out=None):
    cmd = [sys.executable, SCRIPT, *extra, "--gnmr", args.gnmr, "--out", out or args.out,
           "--corpus-dir", os.path.join(args.out, "brown-shards")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def check_calibration_replay(table_dir, gnmr):
    """scripts/calibrate_gnmr.py replays a run's norm trace with the run's own settings and
    must find the exceedance rate the controller reported (gnmr_summary.json), within one
    unit-step for the trace's 6-digit norms. Its defaults, for a trace without a run, are the
    controller's."""
    traces = glob.glob(os.path.join(table_dir, "*", "seed-*", "gnmr_trace.jsonl"))
    if not traces:
        fail(f"no gnmr_trace.jsonl under {table_dir}")
    run_dir = os.path.dirname(traces[0])
    spec = importlib.util.spec_from_file_location(
        "calibrate_gnmr", os.path.join(REPO, "scripts", "calibrate_gnmr.py"))
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    shown = subprocess.run([gnmr, "config", "show", "--config",
                            os.path.join(REPO, "configs", "models", "tiny.json")],
                           capture_output=True, text=True, timeout=60)
    defaults = json.loads(shown.stdout)["gnmr"]
    differ = {k: (v, defaults[k]) for k, v in calibrate.DEFAULTS.items() if defaults[k] != v}
    if differ:
        fail(f"calibrate_gnmr.py DEFAULTS differ from the controller's (script, gnmr): {differ}")
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        options = json.load(f)["gnmr"]
    with open(os.path.join(run_dir, "gnmr_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    rate, _, _, eligible = calibrate.exceedance(
        calibrate.read_norms(traces[0]), options.get("history_start", 0),
        options["warmup_steps"], options["alpha"], options["beta"], options["window"])
    if eligible != summary["eligible_unit_steps"] or \
            abs(rate - summary["exceedance_rate"]) > 1.0 / eligible + 1e-12:
        fail(f"calibrate_gnmr.py replay of {traces[0]}: exceedance {rate:.4f} over {eligible} "
             f"unit-steps, the controller reported {summary['exceedance_rate']:.4f} over "
             f"{summary['eligible_unit_steps']}")
    # An invalid norm (null in the trace) after warm-up is, as for the controller, an eligible
    # unit-step that exceeds; before warm-up or history_start nothing. (The replay once skipped
    # it: 181 eligible where the controller reported 182.)
    flat = [(step, [1.0]) for step in range(10)]
    with_null = [(step, [None] if step == 8 else norms) for step, norms in flat]
    _, _, _, flat_eligible = calibrate.exceedance(flat, 0, 4, 1.5, 1.5, 2)
    rate, _, _, eligible = calibrate.exceedance(with_null, 0, 4, 1.5, 1.5, 2)
    if eligible != flat_eligible or rate != 1.0 / eligible:
        fail(f"calibrate_gnmr.py: a null norm after warm-up gave {eligible} eligible unit-steps "
             f"(without it {flat_eligible}) and exceedance {rate}; the controller counts it as one "
             "eligible, exceeding unit-step")


def check_stale_and_unfinished(args, table_dir):
    """A finished run made with an extra --set is stale for a command without it, even though
    that command sets nothing about the key: it is neither skipped as finished nor counted in
    the table. --report-only lists a run stopped part-way in the notes under the table."""
    out = os.path.join(args.out, "stale")
    shutil.rmtree(out, ignore_errors=True)
    cell = ["--scale", "smoke", "--only", "bf16", "--jobs", "1", "--threads-per-job", "1"]
    rc, text = reproduce(args, args.table, *cell, "--set", "train.lr=0.5", out=out)
    if rc != 0:
        fail(f"reproduce.py {args.table} --only bf16 --set train.lr=0.5 exited {rc}", text)
    rc, text = reproduce(args, args.table, *cell, out=out)
    if rc != 1 or "finished earlier: skipped" in text or "train.lr: run has 0.5" not in text:
        fail(f"a run made with --set train.lr=0.5 was not reported stale by a command without "
             f"that setting (exit {rc})", text)
    rows = [l for l in text.splitlines() if l.startswith("| tiny |")]
    if len(rows) != 1 or "0/1 ⚠" not in rows[0]:
        fail(f"the stale run counts in the table: {rows}", text)

    run_dir = glob.glob(os.path.join(table_dir, "*static-int4", "seed-*"))[0]
    copy = os.path.join(out, args.table, "smoke", os.path.basename(os.path.dirname(run_dir)),
                        os.path.basename(run_dir))
    shutil.copytree(run_dir, copy)
    metrics = os.path.join(copy, "metrics.jsonl")
    with open(metrics, encoding="utf-8") as f:
        lines = f.readlines()
    last_eval = max(i for i, l in enumerate(lines) if json.loads(l).get("kind") == "eval")
    with open(metrics, "w", encoding="utf-8") as f:
        f.writelines(lines[:last_eval])
    rc, text = reproduce(args, args.table, "--scale", "smoke", "--only", "static-int4",
                         "--report-only", out=out)
    if rc != 1 or not re.search(r"static-int4` seed \d+: not finished: step \d+/\d+", text):
        fail(f"--report-only with a run stopped before its last evaluation: exit {rc}, no note "
             f"under the table", text)


def check_run_threads(text):
    """The Environment line states the threads per GEMM the runs used (one per job here),
    not those gnmr picks for a process of its own."""
    env = next((l for l in text.splitlines() if l.startswith("Environment:")), "")
    counts = re.findall(r"(\d+) (?:BLAS )?thread\(s\) per GEMM", env)
    if not counts or set(counts) != {"1"}:
        fail(f"the runs used 1 thread per GEMM, the Environment line says {counts}", env)


def check_estimate():
    """The dry-run estimate counts a gap-measuring run's steps 3 times (oracle or
    log.recovery_gap from step_s; only log.recovery_gap when --calibrate measured the cell,
    since gnmr bench runs the oracle's measurement itself)."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from experiments import runner  # noqa: E402
    scale = {"step_s": {"fp8mix": 0.2}}

    def run(cell, **overrides):
        return {"cell": {"cell": cell}, "steps": 300,
                "overrides": {"precision.recipe": "fp8mix", **overrides}}
    static = runner.estimate_minutes([run("s", **{"gnmr.controller": "static_low"})], scale, 1)
    oracle = runner.estimate_minutes([run("o", **{"gnmr.controller": "oracle"})], scale, 1)
    gap = runner.estimate_minutes([run("g", **{"log.recovery_gap": True})], scale, 1)
    if abs(oracle / static - 3.0) > 1e-9 or abs(gap / static - 3.0) > 1e-9:
        fail(f"estimate: static {static}, oracle {oracle}, gap-measuring {gap} min; the "
             f"oracle and gap-measuring runs should cost 3x")
    measured = {"o": 0.6, "g": 0.2}
    oracle = runner.estimate_minutes([run("o", **{"gnmr.controller": "oracle"})], scale, 1,
                                     measured)
    gap = runner.estimate_minutes([run("g", **{"log.recovery_gap": True})], scale, 1, measured)
    if abs(oracle / static - 3.0) > 1e-9 or abs(gap / static - 3.0) > 1e-9:
        fail(f"estimate with --calibrate: oracle {oracle}, gap-measuring {gap} min against "
             f"static {static}; both should be 3x (the oracle's bench already measured it)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gnmr", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--table", default="actq")
    args = p.parse_args()
    if importlib.util.find_spec("numpy") is None:
        print(f"SKIP: {sys.executable} lacks numpy (Debian: apt-get install python3-numpy "
              f"python3-matplotlib)")
        return SKIP
    have_matplotlib = importlib.util.find_spec("matplotlib") is not None

    table_dir = os.path.join(args.out, args.table, "smoke")
    shutil.rmtree(table_dir, ignore_errors=True)  # train afresh with this build's gnmr
    rc, out = reproduce(args, args.table, "--scale", "smoke", "--jobs", "2",
                        "--threads-per-job", "1")
    if rc != 0:
        fail(f"reproduce.py {args.table} --scale smoke exited {rc}", out)
    table_md = os.path.join(table_dir, "table.md")
    if not os.path.exists(table_md):
        fail(f"{table_md} was not written", out)
    with open(table_md, encoding="utf-8") as f:
        text = f.read()
    if "scripts/reproduce.py " + args.table not in text:
        fail("table.md does not start with the command that reproduces it", text)
    rows = [l for l in text.splitlines() if l.startswith("| tiny |")]
    if len(rows) < 2:
        fail(f"expected a row per smoke cell, found {len(rows)}", text)
    for row in rows:
        ppl = row.split("|")[4].strip()
        try:
            float(ppl.split()[0])
        except ValueError:
            fail(f"row without a val perplexity: {row}", text)
        paired = row.split("|")[7].strip()
        if paired != "(reference)":
            try:
                float(paired.split()[0])
            except ValueError:
                fail(f"row without a paired Δ val loss against the reference: {row}", text)
    check_run_threads(text)
    if have_matplotlib:
        pngs = glob.glob(os.path.join(table_dir, "*.png"))
        if not any(os.path.basename(p).startswith("loss_") for p in pngs):
            fail("no loss-curve plot", out)
        if not any(os.path.basename(p).startswith("recovery_") for p in pngs):
            fail("no recovery heat-map for the GNMR cell", out)

    rc, out = reproduce(args, args.table, "--scale", "smoke")
    if rc != 0 or "finished earlier: skipped" not in out or " ran " in out:
        fail(f"a second invocation did not skip the finished runs (exit {rc})", out)

    check_calibration_replay(table_dir, args.gnmr)
    check_stale_and_unfinished(args, table_dir)
    check_estimate()

    tables = [f[:-5] for f in os.listdir(os.path.join(REPO, "configs", "experiments"))
              if f.endswith(".json") and f != "scales.json"]
    for table in sorted(tables):
        for scale in ("smoke", "cpu-small", "paper"):
            rc, out = reproduce(args, table, "--scale", scale, "--dry-run")
            if rc == 2 or "Traceback" in out:
                fail(f"reproduce.py {table} --scale {scale} --dry-run: the table does not load", out)
    print(f"OK: {len(rows)} cells in {table_md}; tables {', '.join(sorted(tables))} load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
