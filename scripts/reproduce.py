#!/usr/bin/python3
"""Reproduce one of the GNMR paper's tables with gnmr (configs/experiments/TABLE.json).

  /usr/bin/python3 scripts/reproduce.py TABLE [--scale cpu-small|paper|smoke] [--seeds 1,2,3]
      [--jobs N] [--threads-per-job T] [--out runs/experiments] [--gnmr PATH]
      [--only CELL,...] [--set KEY=VALUE]... [--corpus-dir DIR] [--rerun-stale]
      [--dry-run] [--report-only]

Makes the scale's token shards when missing, then runs every cell (model x method) x seed
as its own `gnmr train` process, N at a time, in OUT/TABLE/SCALE/CELL/seed-S: a finished
run is skipped, an unfinished one resumed (--resume auto), a failed one reported without
stopping the others; a run whose config.json differs from what this command resolves (another
--set, an edited table file or model preset; not the threads or the corpus directory) is
stale: reported and left out of the table, or restarted with --rerun-stale. Then writes
OUT/TABLE/SCALE/table.md (also printed), results.json, commands.sh and PNG plots next to
them. Ctrl-C asks the running cells to checkpoint; run the same command again to continue.
Standard library only; numpy + matplotlib (Agg) for the plots, which are skipped with a note
when missing.

Exit status: 0 when every run of the table has finished, 1 when some have not (failed,
interrupted, stale, or not run: --report-only/--dry-run), 2 for a bad table or option.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from experiments import plots, report, runner  # noqa: E402
from experiments import spec as specmod  # noqa: E402
from experiments.arguments import whole_number  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(REPO, "configs", "experiments")
DEFAULT_GNMR = "build/release/src/cli/gnmr"
DEFAULT_OUT = "runs/experiments"
# --report-only: the status in the table's notes of a run in each state runner.plan_runs finds.
# --jobs, --threads-per-job.
at_least_one = whole_number(1, " (leave the option out for the default)")
REPORT_ONLY_STATUS = {"done": "done", "run": "not run yet", "resume": "not finished",
                      "restart": "not finished", "stale": "stale"}


def seed_list(text):
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers of at least 0, "
                                         f"got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice")
    return seeds


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="reproduce.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="tables: " + ", ".join(specmod.table_names(EXPERIMENTS))
        + " (configs/experiments/). Relative paths are taken from the current directory, "
        "defaults from the repository root.")
    p.add_argument("table", help="table name (a file configs/experiments/TABLE.json)")
    p.add_argument("--scale", default="cpu-small", help="scale of the table file (default cpu-small)")
    p.add_argument("--seeds", type=seed_list,
                   help="comma-separated seeds, each once (default: the scale's)")
    p.add_argument("--jobs", type=at_least_one, help="gnmr processes at a time, at least 1 "
                   "(default: the scale's, else cores / threads)")
    p.add_argument("--threads-per-job", type=at_least_one, help="train.threads of each "
                   "process, at least 1 (default: 1, or cores / jobs when --jobs is given)")
    p.add_argument("--out", default=None, help=f"experiments directory (default {DEFAULT_OUT})")
    p.add_argument("--gnmr", default=None, help=f"the gnmr binary (default {DEFAULT_GNMR})")
    p.add_argument("--only", help="comma-separated cells (MODEL-METHOD), methods or models; "
                   "any method of the table file, not only the scale's default list")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `gnmr train --set` for every cell (use a separate --out)")
    p.add_argument("--corpus-dir", help="token shards to use instead of the scale's corpus dir")
    p.add_argument("--rerun-stale", action="store_true", help="restart runs whose config.json "
                   "differs from what this command resolves (default: leave them and report "
                   "them)")
    p.add_argument("--dry-run", action="store_true", help="print what would run, and a time "
                   "estimate; run and write nothing")
    p.add_argument("--calibrate", action="store_true", help="with --dry-run: time a few "
                   "steps of each cell with `gnmr bench` (one at a time, --threads-per-job "
                   "threads) and estimate from those instead of the scale's step_s")
    p.add_argument("--report-only", action="store_true", help="run nothing; write the table "
                   "and plots from the run directories as they are")
    return p.parse_args(argv)


def display_path(path):
    """Repository-relative when inside the repository (short and portable), else absolute."""
    path = os.path.abspath(path)
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel


def parse_set(items):
    extra = {}
    for item in items:
        if "=" not in item:
            raise specmod.SpecError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    return extra


def reproduce_command(args, seeds, jobs, threads):
    cmd = ["/usr/bin/python3", "scripts/reproduce.py", args.table, "--scale", args.scale,
           "--seeds", ",".join(map(str, seeds)), "--jobs", str(jobs),
           "--threads-per-job", str(threads)]
    if args.only:
        cmd += ["--only", args.only]
    for item in args.set:
        cmd += ["--set", item]
    if args.corpus_dir:
        cmd += ["--corpus-dir", display_path(args.corpus_dir)]
    if args.out:
        cmd += ["--out", display_path(args.out)]
    if args.gnmr:
        cmd += ["--gnmr", display_path(args.gnmr)]
    return " ".join(shlex.quote(c) for c in cmd)


def environment(gnmr, jobs, threads, stats):
    """The machine and settings of the table. Threads per GEMM are those of the finished runs
    (metrics.jsonl `run` line), which --report-only may not know otherwise; `gnmr version`
    runs with the runs' thread settings so that its own figure agrees."""
    version = "?"
    try:
        out = subprocess.run([gnmr, "version"], capture_output=True, text=True, timeout=30,
                             env=runner.thread_env(threads))
        version = " / ".join(l.strip() for l in out.stdout.splitlines() if l.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    per_gemm = sorted({r["blas_threads_per_gemm"] for s in stats for r in s["runs"]
                       if r["finished"] and r["blas_threads_per_gemm"] is not None})
    used = (f", runs with {', '.join(map(str, per_gemm))} BLAS thread(s) per GEMM (metrics.jsonl)"
            if per_gemm else "")
    return (f"{version}; {cpu}, {os.cpu_count()} cores; {jobs} job(s) x {threads} thread(s)"
            f"{used}; Python {platform.python_version()}; {datetime.date.today().isoformat()}")


def main(argv):
    args = parse_args(argv)
    try:
        table = specmod.load_table(args.table, EXPERIMENTS)
        scale = table["scales"].get(args.scale)
        if scale is None:
            raise specmod.SpecError(f"table {args.table!r} has no scale {args.scale!r} "
                                    f"(it has: {', '.join(table['scales'])})")
        seeds = args.seeds or scale.get("seeds", [1])
        extra = parse_set(args.set)
    except specmod.SpecError as e:
        runner.stderr(f"reproduce.py: {e}")
        return 2
    cores = os.cpu_count() or 1
    jobs_default = args.jobs or scale.get("jobs")
    threads = args.threads_per_job or (max(1, cores // jobs_default) if jobs_default else 1)
    jobs = args.jobs or scale.get("jobs") or max(1, cores // threads)
    gnmr = os.path.abspath(args.gnmr) if args.gnmr else os.path.join(REPO, DEFAULT_GNMR)
    out = os.path.abspath(args.out) if args.out else os.path.join(REPO, DEFAULT_OUT)
    corpus_dir = (display_path(args.corpus_dir) if args.corpus_dir
                  else scale.get("corpus", {}).get("dir", ""))
    try:
        cells = specmod.build_cells(table, args.scale, corpus_dir, extra,
                                    args.only.split(",") if args.only else None)
    except specmod.SpecError as e:
        runner.stderr(f"reproduce.py: {e}")
        return 2
    runs = specmod.build_runs(cells, seeds, table["seed_keys"], out, args.scale, threads)
    table_dir = os.path.join(out, table["name"], args.scale)
    command = reproduce_command(args, seeds, jobs, threads)
    print(f"table {table['name']} at scale {args.scale}: {len(cells)} cell(s) x "
          f"{len(seeds)} seed(s) = {len(runs)} run(s) -> {display_path(table_dir)}", flush=True)

    if not os.access(gnmr, os.X_OK) and args.report_only:
        runner.stderr(f"reproduce.py: no gnmr binary at {gnmr}: a run is stale only where its "
                      f"config.json differs from this command's overrides (not from the model "
                      f"preset or gnmr's defaults)")
    elif not os.access(gnmr, os.X_OK):
        runner.stderr(f"reproduce.py: no gnmr binary at {gnmr} (build it with "
                      f"scripts/test.sh, or pass --gnmr PATH)")
        if not args.dry_run:
            return 2

    # --report-only replaces nothing: a stale run stays out of the table even with --rerun-stale.
    plans = runner.plan_runs(runs, args.rerun_stale and not args.report_only, gnmr, REPO)
    if args.dry_run:
        for run, plan in zip(runs, plans):
            flag = {"resume": ["--resume", "auto"], "restart": ["--force"]}.get(plan["action"])
            print(f"  {plan['action']:7s} {display_path(run['run_dir'])}"
                  + (f"  ({plan['detail']})" if plan["detail"] else ""))
            if plan["action"] in ("run", "resume", "restart"):
                print("          " + runner.quote(runner.train_command(
                    display_path(gnmr), dict(run, run_dir=display_path(run["run_dir"])), flag)))
        todo = [r for r, p in zip(runs, plans) if p["action"] in ("run", "resume", "restart")]
        per_cell = None
        if args.calibrate:
            print(f"calibrating: 1 + 3 steps of each cell with `gnmr bench`, {threads} thread(s)")
            per_cell = runner.calibrate(gnmr, REPO, cells, threads)
        minutes = runner.estimate_minutes(todo, scale, jobs, per_cell)
        if minutes is not None:
            source = "--calibrate" if per_cell else "the scale's step_s"
            print(f"estimate: about {minutes:.0f} min of wall time for {len(todo)} run(s) at "
                  f"{jobs} job(s) (seconds per step from {source}, +10% for evaluations; "
                  f"resumed runs counted whole)")
        error = runner.prepare_corpus(scale, corpus_dir, display_path(gnmr), REPO,
                                      jobs * threads, dry_run=True)
        if error:
            print(f"corpus: {error}")
        print("reproduce: " + command)
        return 0 if not todo else 1

    results = {}
    if not args.report_only:
        error = runner.prepare_corpus(scale, corpus_dir, gnmr, REPO, jobs * threads, dry_run=False)
        if error:
            runner.stderr(f"reproduce.py: {error}")
            return 2
        # SIGTERM (kill, timeout, a batch system) stops like Ctrl-C: the cells checkpoint.
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        executor = runner.Executor(gnmr, REPO, jobs, threads)
        results = executor.run_all(runs, plans)
    else:
        # Nothing runs: each run the table lacks is reported as the plans found it.
        results = {r["run_dir"]: {"status": REPORT_ONLY_STATUS[p["action"]], "detail": p["detail"]}
                   for r, p in zip(runs, plans)}

    os.makedirs(table_dir, exist_ok=True)
    stats = report.collect(cells, runs, results)
    plot_files, plot_note = plots.make_plots(table, stats, table_dir)
    if plot_note:
        runner.stderr(plot_note)
    text = report.markdown(table, args.scale, stats, command,
                           environment(gnmr, jobs, threads, stats), plot_files, plot_note,
                           corpus_dir)
    with open(os.path.join(table_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(table_dir, "commands.sh"), "w", encoding="utf-8") as f:
        f.write("#!/usr/bin/env bash\n# The gnmr runs of this table (fresh starts; "
                "scripts/reproduce.py adds --resume auto / --force as needed). Run from the "
                "repository root.\nset -e\n")
        for run in runs:
            f.write(runner.quote(runner.train_command(
                display_path(gnmr), dict(run, run_dir=display_path(run["run_dir"])), None)) + "\n")
    with open(os.path.join(table_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"table": table["name"], "scale": args.scale, "command": command,
                   "cells": [{k: v for k, v in s.items() if k not in ("runs", "cell")}
                             | {"model": s["cell"]["model"], "method": s["cell"]["method"],
                                "label": s["cell"]["label"],
                                "val_ppl": [r["val_ppl"] for r in s["runs"]],
                                "seeds": [r["seed"] for r in s["runs"]]}
                             for s in stats]}, f, indent=1)
    print()
    print(text)
    print(f"wrote {display_path(os.path.join(table_dir, 'table.md'))}"
          + (f" and {len(plot_files)} plot(s)" if plot_files else ""))
    # A diverged run finished: its divergence is the cell's result, named under the table.
    diverged = sum(s["n_diverged"] for s in stats)
    unfinished = sum(s["n_asked"] - s["n"] for s in stats) - diverged
    if diverged:
        print(f"{diverged} run(s) diverged: see the notes under the table")
    if unfinished:
        print(f"{unfinished} run(s) not finished: see the notes under the table")
    return 1 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
