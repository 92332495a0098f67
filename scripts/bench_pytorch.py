#!/usr/bin/env python3
"""Side-by-side CPU training throughput: gnmr vs PyTorch on the identical LLaMA-2 model and batch.

Each `--python` interpreter is one PyTorch to compare against (default: the one running this
script), e.g. Debian's /usr/bin/python3 with python3-torch (scripts/setup.sh --python) and a
virtual environment with the current PyTorch from PyPI (its own MKL / oneDNN kernels):

    /usr/bin/python3 -m venv ~/venv-torch && ~/venv-torch/bin/pip install torch numpy
    /usr/bin/python3 scripts/bench_pytorch.py --config configs/bench/llama2-60m-seq256.json \
        --gnmr build/release/src/cli/gnmr --python /usr/bin/python3 --python ~/venv-torch/bin/python

For each core count it trains the same model (shape, micro-batch, sequence length, gradient
accumulation, AdamW, global-norm clipping) with every PyTorch, at every split of the cores
between PyTorch's intra-op threads and its BLAS threads, and with `gnmr bench`. Every PyTorch
runs with OPENBLAS_CORETYPE set to the OpenBLAS kernel gnmr runs, so a PyTorch on the system
OpenBLAS gets the same kernel (without it, Debian's OpenBLAS falls back to SSE3 on CPUs newer
than itself). gnmr is compared with the fastest PyTorch at each core count.

Prints a markdown table and, last, one JSON line with the figures. Exit status 2 for a bad
option, 1 when gnmr or a PyTorch fails (its error output is printed).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiments.arguments import whole_number  # noqa: E402


def run_or_exit(cmd, env=None):
    """stdout of a command that must succeed; else its error output and exit status 1."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:
        sys.exit(f"bench_pytorch.py: cannot run {cmd[0]}: {e.strerror}")
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(f"bench_pytorch.py: {' '.join(cmd)} failed (exit {result.returncode})")
    return result.stdout


def resolved_config(gnmr, config, overrides):
    cmd = [gnmr, "config", "show", "--config", config]
    for o in overrides:
        cmd += ["--set", o]
    return json.loads(run_or_exit(cmd))


def build_torch_model(torch, m):
    nn = torch.nn
    F = torch.nn.functional
    dim, heads, kv_heads = m["dim"], m["n_heads"], m["n_kv_heads"]
    head_dim = dim // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m["norm_eps"]))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.post_attention_layernorm = RMSNorm()
            self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)
            self.gate_proj = nn.Linear(dim, m["ffn_dim"], bias=False)
            self.up_proj = nn.Linear(dim, m["ffn_dim"], bias=False)
            self.down_proj = nn.Linear(m["ffn_dim"], dim, bias=False)

        def forward(self, x, cos, sin, mask):
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, T, heads, head_dim).transpose(1, 2)
            k = self.k_proj(h).view(B, T, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(h).view(B, T, kv_heads, head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim) + mask
            y = att.softmax(-1) @ v
            x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, dim))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(m["vocab_size"], dim)
            self.layers = nn.ModuleList([Block() for _ in range(m["n_layers"])])
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(dim, m["vocab_size"], bias=False)

        def forward(self, tokens, targets):
            T = tokens.shape[1]
            inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim))
            freqs = torch.outer(torch.arange(T).float(), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            mask = torch.full((T, T), float("-inf")).triu(1)
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return Llama()


def torch_tokens_per_s(torch, cfg, steps, warmup):
    torch.manual_seed(0)
    m, t = cfg["model"], cfg["train"]
    model = build_torch_model(torch, m)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=True)
    B, T = t["micro_batch"], cfg["data"]["seq_len"]
    accum = t["global_batch_tokens"] // (B * T)
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for _ in range(accum):
            tokens = torch.randint(0, m["vocab_size"], (B, T + 1), generator=gen)
            loss = model(tokens[:, :-1], tokens[:, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return t["global_batch_tokens"] / (sum(times) / len(times))


def torch_worker(args):
    """Measures PyTorch in this process; the parent set the thread variables before import."""
    import torch
    torch.set_num_threads(args.torch_worker[0])
    cfg = json.loads(open(args.worker_config).read())
    build = torch.__config__.show()
    # Debian's torch calls the system libblas.so.3 (OpenBLAS when libopenblas0 is installed);
    # PyPI's wheels carry MKL.
    blas = "MKL" if "BLAS_INFO=mkl" in build else "OpenBLAS" if "openblas" in build.lower() else \
        "system libblas" if "BLAS_INFO=generic" in build else "other"
    print(json.dumps({"tokens_per_s": torch_tokens_per_s(torch, cfg, args.steps, args.warmup),
                      "torch": torch.__version__, "blas": blas}))


def run_torch(python, cfg_path, intra_threads, blas_threads, steps, warmup, openblas_kernel):
    # PyTorch's intra-op pool and the BLAS library's own pool are separate: Debian's torch
    # calls a generic BLAS whose threads torch.set_num_threads does not limit, so both are
    # set here, before torch is imported, in a fresh process.
    env = dict(os.environ, OMP_NUM_THREADS=str(intra_threads), OPENBLAS_NUM_THREADS=str(blas_threads),
               MKL_NUM_THREADS=str(blas_threads), BLIS_NUM_THREADS=str(blas_threads))
    if openblas_kernel:
        env["OPENBLAS_CORETYPE"] = openblas_kernel
    cmd = [python, os.path.abspath(__file__), "--torch-worker", str(intra_threads), str(blas_threads),
           "--worker-config", cfg_path, "--steps", str(steps), "--warmup", str(warmup), "--config", "-"]
    out = run_or_exit(cmd, env)
    return json.loads(out.strip().splitlines()[-1])


def gnmr_bench(gnmr, config, overrides, threads, steps, warmup):
    # The same warm-up as the PyTorch side: both measure the same steps of a run.
    cmd = [gnmr, "bench", "--config", config, "--steps", str(steps), "--warmup", str(warmup),
           "--threads", str(threads)]
    for o in overrides:
        cmd += ["--set", o]
    out = run_or_exit(cmd)
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--gnmr", default="build/release/src/cli/gnmr")
    ap.add_argument("--steps", type=whole_number(1), default=5, help="measured steps (default 5)")
    ap.add_argument("--warmup", type=whole_number(0), default=2,
                    help="unmeasured warm-up steps, on both sides (default 2)")
    ap.add_argument("--threads", type=whole_number(1), nargs="*", default=None,
                    help="core counts to measure (default: 1 .. number of cores)")
    ap.add_argument("--python", action="append", default=[], dest="pythons",
                    help="a Python interpreter with PyTorch to compare against (repeatable; "
                         "default: this one)")
    ap.add_argument("--torch-worker", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    pythons = args.pythons or [sys.executable]
    for python in pythons:
        try:
            probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True)
        except OSError as e:
            sys.exit(f"bench_pytorch.py: --python {python}: cannot run it ({e.strerror})")
        if probe.returncode != 0:
            sys.exit(f"bench_pytorch.py: {python} cannot import torch; install Debian's with "
                     "scripts/setup.sh --python, or `pip install torch` into a virtual environment")
    cfg = resolved_config(args.gnmr, args.config, args.overrides)
    cfg_path = os.path.join(tempfile.mkdtemp(prefix="bench_pytorch_"), "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    cores = args.threads or list(range(1, (os.cpu_count() or 1) + 1))
    rows = []
    for n in cores:
        g = gnmr_bench(args.gnmr, args.config, args.overrides, n, args.steps, args.warmup)
        # Every PyTorch at its best with n cores: every split of n between intra-op and BLAS threads.
        trials = []
        for python in pythons:
            for intra in range(1, n + 1):
                for blas in range(1, n + 1):
                    if max(intra, blas) != n:
                        continue
                    r = run_torch(python, cfg_path, intra, blas, args.steps, args.warmup, g.get("blas_kernel"))
                    trials.append({"python": python, "torch": r["torch"], "torch_blas": r["blas"],
                                   "intra_op_threads": intra, "blas_threads": blas,
                                   "tokens_per_s": r["tokens_per_s"]})
        best = max(trials, key=lambda r: r["tokens_per_s"])
        rows.append({"threads": n, "pytorch_tokens_per_s": best["tokens_per_s"], "pytorch_best_setting": best,
                     "pytorch_trials": trials, "gnmr_tokens_per_s": g["tokens_per_s"], "gnmr_mfu": g.get("mfu"),
                     "gemm_peak_gflops": g.get("gemm_peak_gflops"), "gnmr_step_ms": g.get("step_ms"),
                     "gnmr_blas_kernel": g.get("blas_kernel"),
                     "blas_kernel_nominal_gflops": g.get("blas_kernel_nominal_gflops"),
                     "gnmr_controller_and_norms_fraction": g.get("controller_and_norms_fraction")})
    best_pt = max(rows, key=lambda r: r["pytorch_tokens_per_s"])
    best_g = max(rows, key=lambda r: r["gnmr_tokens_per_s"])
    m = cfg["model"]
    print(f"model {m['name']} (dim {m['dim']}, {m['n_layers']} layers, vocab {m['vocab_size']}), "
          f"micro-batch {cfg['train']['micro_batch']} x seq {cfg['data']['seq_len']}, "
          f"{cfg['train']['global_batch_tokens']} tokens/step; OpenBLAS kernel {rows[0]['gnmr_blas_kernel']}")
    print("| cores | PyTorch | PyTorch tok/s (threads: intra-op / BLAS) | gnmr tok/s | gnmr / PyTorch |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        for python in pythons:
            mine = [t for t in r["pytorch_trials"] if t["python"] == python]
            s = max(mine, key=lambda t: t["tokens_per_s"])
            print(f"| {r['threads']} | {s['torch']} ({s['torch_blas']}) | {s['tokens_per_s']:.0f} "
                  f"({s['intra_op_threads']} / {s['blas_threads']}) | {r['gnmr_tokens_per_s']:.0f} | "
                  f"{r['gnmr_tokens_per_s'] / s['tokens_per_s']:.2f}x |")
    print()
    print("| cores | gnmr MFU | measured GEMM peak GFLOP/s | kernel nominal GFLOP/s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['threads']} | {100 * (r['gnmr_mfu'] or 0):.1f}% | {r['gemm_peak_gflops'] or 0:.1f} | "
              f"{r['blas_kernel_nominal_gflops'] or 0:.1f} |")
    summary = {"best_pytorch_cores": best_pt["threads"], "best_pytorch_tokens_per_s": best_pt["pytorch_tokens_per_s"],
               "best_gnmr_cores": best_g["threads"], "best_gnmr_tokens_per_s": best_g["gnmr_tokens_per_s"],
               "speedup_best_vs_best": best_g["gnmr_tokens_per_s"] / best_pt["pytorch_tokens_per_s"], "rows": rows}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
