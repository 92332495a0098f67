#!/usr/bin/python3
"""Options and errors of the Python helper scripts, without gnmr or PyTorch: bad values are
refused with an argparse error (exit 2) before anything runs, a missing or binary input ends
with a message instead of a traceback, and scripts/bench_pytorch.py (driving a fake gnmr and
a fake PyTorch interpreter) gives both sides the same warm-up and passes gnmr's own error on.

  check_script_options.py
"""

import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "scripts")

# Stands in for gnmr: `config show` of an existing --config prints a config, of a missing one
# fails as gnmr does; `bench` prints a result line. Each call is logged to $FAKE_LOG.
FAKE_GNMR = r'''#!/usr/bin/python3
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["gnmr"] + sys.argv[1:]) + "\n")
config = sys.argv[sys.argv.index("--config") + 1]
if not os.path.exists(config):
    sys.exit(f"gnmr: error: config: cannot read {config}")
if sys.argv[1] == "config":
    print(json.dumps({"model": {"name": "fake", "dim": 8, "n_layers": 1, "vocab_size": 16},
                      "train": {"micro_batch": 1, "global_batch_tokens": 8},
                      "data": {"seq_len": 8}}))
else:
    print(json.dumps({"tokens_per_s": 1000.0, "step_ms": 8.0, "blas_kernel": "Haswell"}))
'''

# Stands in for a Python with PyTorch: the import probe succeeds, a worker prints its result.
FAKE_PYTHON = r'''#!/usr/bin/python3
import json, os, sys
if sys.argv[1] == "-c":
    print("0.0-fake")
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["python"] + sys.argv[1:]) + "\n")
print(json.dumps({"tokens_per_s": 500.0, "torch": "0.0-fake", "blas": "OpenBLAS"}))
'''

failures = []


def run(script, *args, env=None):
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args],
                            capture_output=True, text=True, timeout=60, env=env)
    return result.returncode, result.stdout + result.stderr


def expect(what, rc, out, want_rc, want_text):
    if rc != want_rc or want_text not in out or "Traceback" in out:
        failures.append(f"{what}: exit {rc}, expected {want_rc} and {want_text!r} without a "
                        f"traceback; output:\n{out}")


def write(path, text, mode=0o644):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def check_reproduce():
    for args, text in ((["--jobs", "-1"], "--jobs"), (["--jobs", "0"], "--jobs"),
                       (["--threads-per-job", "0"], "--threads-per-job"),
                       (["--threads-per-job", "-2"], "--threads-per-job"),
                       (["--seeds", ","], "--seeds"), (["--seeds", "1,1"], "names a seed twice"),
                       (["--seeds", "-1"], "--seeds")):
        rc, out = run("reproduce.py", "actq", "--scale", "smoke", "--dry-run",
                      "--gnmr", "/nonexistent/gnmr", *args)
        expect(f"reproduce.py {' '.join(args)}", rc, out, 2, text)


def check_calibrate(tmp):
    trace = write(os.path.join(tmp, "gnmr_trace.jsonl"), "".join(
        json.dumps({"kind": "gnmr_trace", "step": s, "norm": [1.0 + s % 3, 2.0]}) + "\n"
        for s in range(1, 30)))
    rc, out = run("calibrate_gnmr.py", trace, "--window", "2", "--warmup", "5")
    expect("calibrate_gnmr.py on a trace", rc, out, 0, "eligible unit-steps")
    for window in ("0", "-1"):
        rc, out = run("calibrate_gnmr.py", trace, "--window", window)
        expect(f"calibrate_gnmr.py --window {window}", rc, out, 2, "--window")
    for alpha in ("-1", "0", "nan"):
        rc, out = run("calibrate_gnmr.py", trace, "--alpha", alpha)
        expect(f"calibrate_gnmr.py --alpha {alpha}", rc, out, 2, "--alpha")
    rc, out = run("calibrate_gnmr.py", os.path.join(tmp, "missing.jsonl"))
    expect("calibrate_gnmr.py with a missing trace", rc, out, 2, "missing.jsonl")
    # The capped history records a spike as α × the mean (RiskMonitor::observe), so the step
    # after it, 2.6 against a mean of 1.25 rather than 3.25, exceeds α = 2 too: 2 of the 4
    # eligible steps against 1 of 4 with the raw history (window 1, from step 2).
    os.makedirs(os.path.join(tmp, "spike"), exist_ok=True)
    spike = write(os.path.join(tmp, "spike", "gnmr_trace.jsonl"), "".join(
        json.dumps({"kind": "gnmr_trace", "step": s, "norm": [n]}) + "\n"
        for s, n in enumerate([1.0, 1.0, 1.0, 10.0, 2.6, 1.0])))
    for history, rate in (("raw", "| 25.0% |"), ("capped", "| 50.0% |")):
        rc, out = run("calibrate_gnmr.py", spike, "--window", "1", "--warmup", "0", "--alpha", "2",
                      "--history", history)
        expect(f"calibrate_gnmr.py --history {history}", rc, out, 0, rate)
    # Options left out are the run's, from the config.json beside the trace.
    write(os.path.join(tmp, "spike", "config.json"), json.dumps(
        {"gnmr": {"history": "capped", "window": 1, "warmup_steps": 0, "alpha": 2, "beta": 2,
                  "threshold_schedule": "linear"}}))
    rc, out = run("calibrate_gnmr.py", spike)
    expect("calibrate_gnmr.py with the run's settings", rc, out, 0, "| 50.0% |")
    expect("calibrate_gnmr.py under a schedule", rc, out, 0, "threshold_schedule is 'linear'")
    # gnmr_no_delta counts no Δ-GNMR exceedance (β = ∞): only step 3's GNMR exceeds.
    write(os.path.join(tmp, "spike", "config.json"), json.dumps(
        {"gnmr": {"controller": "gnmr_no_delta", "window": 1, "warmup_steps": 0, "alpha": 2,
                  "beta": 0.5}}))
    rc, out = run("calibrate_gnmr.py", spike)
    expect("calibrate_gnmr.py of a gnmr_no_delta run", rc, out, 0, "| 2 | inf | 25.0% |")
    binary = os.path.join(tmp, "binary.jsonl")
    with open(binary, "wb") as f:
        f.write(bytes(range(256)) * 4)
    rc, out = run("calibrate_gnmr.py", binary)
    expect("calibrate_gnmr.py on a binary file", rc, out, 1, "not UTF-8 text")


def check_bench_pytorch(tmp):
    log = os.path.join(tmp, "calls.jsonl")
    env = dict(os.environ, FAKE_LOG=log)
    gnmr = write(os.path.join(tmp, "gnmr"), FAKE_GNMR, 0o755)
    python = write(os.path.join(tmp, "python"), FAKE_PYTHON, 0o755)
    config = write(os.path.join(tmp, "model.json"), "{}")
    common = ["--gnmr", gnmr, "--python", python, "--steps", "2", "--threads", "1"]

    rc, out = run("bench_pytorch.py", "--config", config, "--warmup", "3", *common, env=env)
    expect("bench_pytorch.py with a fake gnmr and PyTorch", rc, out, 0, "best_gnmr_tokens_per_s")
    with open(log, encoding="utf-8") as f:
        calls = [json.loads(line) for line in f]
    warmups = {c[0]: c[c.index("--warmup") + 1] if "--warmup" in c else None for c in calls
               if c[0] == "python" or c[1] == "bench"}
    if warmups != {"gnmr": "3", "python": "3"}:
        failures.append(f"bench_pytorch.py --warmup 3: warm-up steps per side {warmups}, "
                        f"expected 3 on both; calls: {calls}")

    rc, out = run("bench_pytorch.py", "--config", os.path.join(tmp, "nope.json"), *common,
                  env=env)
    expect("bench_pytorch.py with a bad --config", rc, out, 1, "gnmr: error: config: cannot read")
    rc, out = run("bench_pytorch.py", "--config", config, "--gnmr", gnmr,
                  "--python", "/nonexistent/python", env=env)
    expect("bench_pytorch.py --python /nonexistent/python", rc, out, 1, "/nonexistent/python")
    for args in (["--threads", "0"], ["--steps", "0"], ["--warmup", "-1"]):
        rc, out = run("bench_pytorch.py", "--config", config, "--gnmr", gnmr, "--python", python,
                      *args, env=env)
        expect(f"bench_pytorch.py {' '.join(args)}", rc, out, 2, args[0])


def check_hf_export(tmp):
    """Its options are checked before it needs transformers, and without transformers it says
    so (the Debian Python running this has none)."""
    export = os.path.join(tmp, "export")
    os.makedirs(export)
    write(os.path.join(export, "config.json"), "{}")
    common = ["--gnmr", "/nonexistent/gnmr", "--data", "x_*.bin"]
    rc, out = run("check_hf_export.py", "--export", tmp, *common)
    expect("check_hf_export.py on a folder without config.json", rc, out, 2, "no config.json")
    for args in (["--windows", "0"], ["--seq-len", "1"]):
        rc, out = run("check_hf_export.py", "--export", export, *common, *args)
        expect(f"check_hf_export.py {' '.join(args)}", rc, out, 2, args[0])
    try:
        import transformers  # noqa: F401
    except ImportError:
        rc, out = run("check_hf_export.py", "--export", export, *common)
        expect("check_hf_export.py without transformers", rc, out, 2, "is not installed")


def main():
    with tempfile.TemporaryDirectory(prefix="check_script_options_") as tmp:
        check_reproduce()
        check_calibrate(tmp)
        check_bench_pytorch(tmp)
        check_hf_export(tmp)
    for failure in failures:
        print(f"FAIL: {failure}\n")
    if failures:
        return 1
    print("OK: reproduce.py, calibrate_gnmr.py, bench_pytorch.py and check_hf_export.py refuse "
          "bad options and report errors without a traceback")
    return 0


if __name__ == "__main__":
    sys.exit(main())
