"""Runs the cells of a table: corpus preparation, one `gnmr train` process per run, N at a
time, skip / resume / restart decided from what the run directory holds (docs/DESIGN.md §10)."""

import glob
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from . import spec as specmod

EXIT_MEANINGS = {
    1: "runtime failure", 2: "bad command line", 3: "invalid config or --set override",
    4: "data problem", 5: "checkpoint problem", 6: "training diverged",
    7: "feature not built in this binary",
}


_PRINT_LOCK = threading.Lock()


def say(text):
    """One whole line to stdout, also from the worker threads."""
    with _PRINT_LOCK:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def has_low_path(overrides):
    return specmod.recipe_of(overrides) not in specmod.RECIPES_WITHOUT_LOW_PATH


def read_jsonl(path):
    """Objects of a JSON Lines file; a torn last line (a killed writer) is skipped."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except OSError:
        pass
    return rows


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def lookup(config, dotted):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return KeyError
        node = node[part]
    return node


def same_value(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def flat_config(config):
    """A resolved config as {"section.key": value}, the form of a --set key."""
    flat = {}
    for section, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{section}.{key}": v for key, v in value.items()})
        else:
            flat[section] = value
    return flat


_EXPECTED_CONFIGS = {}


def expected_config(gnmr, repo, run):
    """The config `gnmr train` would resolve for the run now (`gnmr config show` with the
    run's --config and --set: the model preset and gnmr's defaults as they are today), or
    None when gnmr cannot say (no binary, an override it rejects)."""
    cmd = [gnmr, "config", "show", "--config", run["cell"]["config"]]
    for key, value in run["overrides"].items():
        cmd += ["--set", f"{key}={format_value(value)}"]
    cache_key = tuple(cmd)
    if cache_key not in _EXPECTED_CONFIGS:
        try:
            result = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=60)
            _EXPECTED_CONFIGS[cache_key] = (json.loads(result.stdout)
                                            if result.returncode == 0 else None)
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
            _EXPECTED_CONFIGS[cache_key] = None
    return _EXPECTED_CONFIGS[cache_key]


def config_mismatches(run, gnmr, repo):
    """Settings whose value in the run directory's config.json differs from what the current
    command resolves for the run: every key of the resolved config, so that an override
    dropped from the command or the table, or an edited model preset, also counts; only the
    overrides when gnmr cannot resolve it. Not compared: the harness keys and the corpus
    paths (they may differ between machines and between the start and the resume of a run),
    the description, and keys that one of the two configs lacks unless the command sets them
    (a gnmr of another version)."""
    config = read_json(os.path.join(run["run_dir"], "config.json"))
    if config is None:
        return []
    expected = expected_config(gnmr, repo, run)
    want = flat_config(expected) if expected is not None else dict(run["overrides"])
    ignored = set(specmod.HARNESS_KEYS) | set(run["cell"]["corpus_keys"]) | {"description"}
    diffs = []
    for key, value in want.items():
        if key in ignored:
            continue
        have = lookup(config, key)  # any depth: an override may name a nested key
        if have is KeyError:
            if key in run["overrides"]:
                diffs.append(f"{key}: run has (missing), table wants {json.dumps(value)}")
            continue
        if not same_value(have, value):
            diffs.append(f"{key}: run has {json.dumps(have)}, table wants {json.dumps(value)}")
    return diffs


def final_steps(run):
    if run["steps"] is not None:
        return run["steps"]
    config = read_json(os.path.join(run["run_dir"], "config.json")) or {}
    return lookup(config, "train.steps")


def inspect(run, gnmr, repo):
    """(state, detail): state is done | partial | broken | empty | stale."""
    d = run["run_dir"]
    holds = any(os.path.exists(os.path.join(d, p))
                for p in ("config.json", "metrics.jsonl", "checkpoints"))
    if not holds:
        return "empty", ""
    diffs = config_mismatches(run, gnmr, repo)
    if diffs:
        return "stale", "; ".join(diffs)
    steps = final_steps(run)
    rows = read_jsonl(os.path.join(d, "metrics.jsonl"))
    if any(r.get("kind") == "eval" and r.get("step") == steps for r in rows):
        return "done", ""
    last = max((r.get("step", 0) for r in rows if r.get("kind") == "train"), default=0)
    has_ckpt = bool(glob.glob(os.path.join(d, "checkpoints", "step_*")))
    return ("partial" if has_ckpt else "broken"), f"step {last}/{steps}"


def format_value(value):
    """A --set value as gnmr parses it: JSON, else a plain string."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
        return json.dumps(value)  # "true", "12": quote so it stays a string
    return json.dumps(value)


def train_command(gnmr, run, resume_flag):
    cmd = [gnmr, "train", "--config", run["cell"]["config"], "--out", run["run_dir"]]
    for key, value in run["overrides"].items():
        cmd += ["--set", f"{key}={format_value(value)}"]
    if resume_flag:
        cmd += resume_flag
    return cmd


def quote(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


def prepare_corpus(scale, corpus_dir, gnmr, repo, threads, dry_run):
    """Makes the scale's token shards when they are missing. Returns None or an error."""
    if glob.glob(os.path.join(repo, corpus_dir, "train_*.bin")):
        return None
    prep = scale.get("corpus", {}).get("prepare")
    if not prep:
        return f"no token shards in {corpus_dir} and the scale says nothing about making them"
    inputs = []
    for pattern in prep["inputs"]:
        inputs += sorted(glob.glob(os.path.join(repo, pattern)))
    tokenizer = os.path.join(repo, prep["tokenizer"])
    missing = [p for p in prep["inputs"] if not glob.glob(os.path.join(repo, p))]
    if not os.path.exists(tokenizer):
        missing.append(prep["tokenizer"])
    cmd = [gnmr, "prepare", "--tokenizer", prep["tokenizer"], "--out", corpus_dir,
           "--val-fraction", str(prep.get("val_fraction", 0.05)), "--threads", str(threads)]
    cmd += [os.path.relpath(p, repo) for p in inputs]
    if missing:
        return (f"no token shards in {corpus_dir}, and cannot make them: missing "
                f"{', '.join(missing)} (see the scale's note in configs/experiments/scales.json, "
                f"or pass --corpus-dir DIR with shards made by `gnmr prepare`)")
    print(f"corpus: {corpus_dir} has no shards; {'would run' if dry_run else 'running'}: "
          f"{quote(cmd)}", flush=True)
    if dry_run:
        return None
    result = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if result.returncode != 0:
        return f"gnmr prepare failed (exit {result.returncode}): {last_error(result.stderr)}"
    return None


def last_error(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "what()" in line:
            return line
    return lines[-1] if lines else "(no output)"


def thread_env(threads):
    """The environment of a gnmr process of a table: `threads` threads for OpenMP and BLAS."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))


class Executor:
    """Runs `gnmr train` processes, `jobs` at a time. Ctrl-C sends SIGTERM to the running
    ones: gnmr checkpoints and exits, and the next invocation resumes them."""

    def __init__(self, gnmr, repo, jobs, threads):
        self.gnmr, self.repo, self.jobs, self.threads = gnmr, repo, jobs, threads
        self.lock = threading.Lock()
        self.running = {}
        self.interrupted = False

    def run_all(self, runs, plans):
        results = {}
        todo = [(r, p) for r, p in zip(runs, plans) if p["action"] in ("run", "resume", "restart")]
        for r, p in zip(runs, plans):
            if p["action"] not in ("run", "resume", "restart"):
                results[r["run_dir"]] = {"status": p["action"], "detail": p["detail"]}
        for r, p in zip(runs, plans):
            if p["action"] == "stale":
                say(f"stale   {r['name']}: {p['detail']}")
        skipped = sum(p["action"] == "done" for p in plans)
        if skipped:
            say(f"{skipped} run(s) finished earlier: skipped")
        if not todo:
            return results
        started = time.time()
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        futures = {pool.submit(self._run_one, r, p, i + 1, len(todo)): r
                   for i, (r, p) in enumerate(todo)}
        try:
            for future, run in futures.items():
                while True:
                    try:
                        results[run["run_dir"]] = future.result(timeout=0.5)
                        break
                    except FutureTimeout:
                        continue
        except KeyboardInterrupt:
            self.interrupted = True
            say("\ninterrupted: asking the running cells to checkpoint and stop (SIGTERM)...")
            with self.lock:
                for proc in self.running.values():
                    proc.send_signal(signal.SIGTERM)
            for future, run in futures.items():
                if future.cancel():
                    results[run["run_dir"]] = {"status": "not started", "detail": "interrupted"}
            for future, run in futures.items():
                if not future.cancelled():
                    results[run["run_dir"]] = future.result()
        finally:
            pool.shutdown(wait=True)
        say(f"ran {len(todo)} run(s) in {(time.time() - started) / 60:.1f} min")
        return results

    def _run_one(self, run, plan, index, total):
        if self.interrupted:
            return {"status": "not started", "detail": "interrupted"}
        flag = {"run": None, "resume": ["--resume", "auto"], "restart": ["--force"]}[plan["action"]]
        cmd = train_command(self.gnmr, run, flag)
        name = run["name"]
        os.makedirs(run["run_dir"], exist_ok=True)
        env = thread_env(self.threads)
        say(f"[{index}/{total}] {plan['action']:7s} {name}"
              + (f" ({plan['detail']})" if plan["detail"] else ""))
        started = time.time()
        console = os.path.join(run["run_dir"], "console.txt")
        with open(console, "a", encoding="utf-8") as log:
            log.write(f"$ {quote(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.repo, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
            with self.lock:
                self.running[run["run_dir"]] = proc
            rc = proc.wait()
            with self.lock:
                del self.running[run["run_dir"]]
        minutes = (time.time() - started) / 60
        state, detail = inspect(run, self.gnmr, self.repo)
        if rc == 0 and state == "done":
            status, detail = "ran", f"{minutes:.1f} min"
        elif rc == 0:
            status, detail = "stopped", f"{detail}, resumes next time"
        else:
            with open(console, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-4000:]
            status = "failed"
            detail = (f"exit {rc} ({EXIT_MEANINGS.get(rc, 'killed' if rc < 0 else 'error')}): "
                      f"{last_error(tail)}")
        say(f"[{index}/{total}] {status:7s} {name}: {detail}")
        return {"status": status, "detail": detail, "minutes": minutes}


def plan_runs(runs, rerun_stale, gnmr, repo):
    """What to do with each run: skip (done), run, resume, restart, stale (left alone)."""
    plans = []
    for run in runs:
        state, detail = inspect(run, gnmr, repo)
        if state == "done":
            plans.append({"action": "done", "detail": "finished earlier"})
        elif state == "empty":
            plans.append({"action": "run", "detail": ""})
        elif state == "partial":
            plans.append({"action": "resume", "detail": detail})
        elif state == "broken":
            plans.append({"action": "restart", "detail": f"{detail}, no checkpoint"})
        elif rerun_stale:
            plans.append({"action": "restart", "detail": f"stale: {detail}"})
        else:
            plans.append({"action": "stale", "detail": f"{detail} (--rerun-stale replaces it, "
                                                       f"or use another --out)"})
    return plans


def estimate_minutes(runs, scale, jobs, per_cell=None):
    """Rough wall time from seconds per step: measured per cell (--calibrate), else the
    scale's step_s per recipe. A run that measures recovery gaps costs GAP_MEASURING_STEP_COST
    ordinary steps per step: step_s does not include that, and --calibrate's `gnmr bench`
    includes it for the oracle (its controller measures) but not for log.recovery_gap (bench
    is not given log.* settings)."""
    step_s = scale.get("step_s")
    if not step_s and not per_cell:
        return None
    total = 0.0
    for run in runs:
        overrides = run["overrides"]
        seconds = (per_cell or {}).get(run["cell"]["cell"])
        if isinstance(seconds, float):
            uncounted = (overrides.get("log.recovery_gap") is True
                         and specmod.controller_of(overrides) != "oracle")
        else:
            if not step_s:
                continue
            seconds = step_s.get(specmod.recipe_of(overrides), max(step_s.values()))
            uncounted = specmod.measures_recovery_gap(overrides)
        if uncounted:
            seconds *= specmod.GAP_MEASURING_STEP_COST
        total += (run["steps"] or 0) * seconds
    eval_factor = 1.1  # evaluations and checkpoints: ~10% on top at cpu-small
    return total * eval_factor / max(1, jobs) / 60.0


def calibrate(gnmr, repo, cells, threads, steps=3):
    """Seconds per training step of each cell, measured with `gnmr bench` (synthetic tokens,
    one warm-up step, `steps` measured steps, `threads` threads). {cell name: s or error}."""
    measured = {}
    for cell in cells:
        cmd = [gnmr, "bench", "--config", cell["config"], "--steps", str(steps), "--warmup", "1",
               "--threads", str(threads)]
        for key, value in cell["overrides"].items():
            if not key.startswith(("data.train", "data.val", "eval.", "checkpoint.", "log.")):
                cmd += ["--set", f"{key}={format_value(value)}"]
        result = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
        line = next((l for l in reversed(result.stdout.splitlines()) if l.startswith("{")), None)
        try:
            measured[cell["cell"]] = json.loads(line)["step_ms"] / 1000.0
        except (TypeError, ValueError, KeyError):
            measured[cell["cell"]] = (f"exit {result.returncode}: "
                                      f"{last_error(result.stderr + result.stdout)}")
        value = measured[cell["cell"]]
        print(f"  {cell['cell']:32s} " + (f"{value:.3f} s/step" if isinstance(value, float)
                                          else value), flush=True)
    return measured


def stderr(msg):
    print(msg, file=sys.stderr, flush=True)
