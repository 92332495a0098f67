"""Collects the run directories of a table into per-cell statistics and a markdown table."""

import json
import math
import os
import statistics

from . import runner, signal_quality


def load_run(run):
    """What the report needs from one run directory (metrics.jsonl, gnmr_summary.json)."""
    d = run["run_dir"]
    rows = runner.read_jsonl(os.path.join(d, "metrics.jsonl"))
    header = next((r for r in rows if r.get("kind") == "run"), {})
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steps = runner.final_steps(run)
    final = next((r for r in reversed(evals) if r.get("step") == steps), None)
    timed = [r for r in train if r.get("step", 0) > 2 and r.get("step_ms")] or train
    summary = runner.read_json(os.path.join(d, "gnmr_summary.json"))
    trace_path = os.path.join(d, "gnmr_trace.jsonl")
    signal_figures = None
    if final is not None and summary and os.path.exists(trace_path):
        config = runner.read_json(os.path.join(d, "config.json")) or {}
        first_step = runner.lookup(config, "gnmr.warmup_steps")
        signal_figures = signal_quality.run_figures(
            runner.read_jsonl(trace_path), summary.get("budget") or 0,
            first_step if isinstance(first_step, int) else 0)
    return {
        "seed": run["seed"],
        "run_dir": d,
        "finished": final is not None,
        "val_ppl": final.get("val_ppl") if final else None,
        "val_loss": final.get("val_loss") if final else None,
        "train": [(r["step"], r["loss"]) for r in train
                  if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])],
        "evals": [(r["step"], r["val_loss"]) for r in evals
                  if isinstance(r.get("val_loss"), (int, float))],
        "tokens_per_s": median([r.get("tokens_per_s") for r in timed]),
        "step_ms": median([r.get("step_ms") for r in timed]),
        "peak_rss": max((r.get("peak_rss_bytes") or 0 for r in train), default=None),
        "summary": summary,
        "has_trace": os.path.exists(trace_path),
        "blas_threads_per_gemm": header.get("blas_threads_per_gemm"),
        "signal": signal_figures,
    }


def median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def mean(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def collect(cells, runs, results):
    """Per cell: its runs' data, seeds finished / asked, mean/sd/min/max of the final val
    perplexity, the means of the other columns, and a note for each run whose status in
    `results` (run directory -> {status, detail}) is not done or ran."""
    by_cell = {}
    for run in runs:
        by_cell.setdefault((run["cell"]["owner_table"], run["cell"]["cell"]), []).append(run)
    stats = []
    for cell in cells:
        cell_runs = by_cell.get((cell["owner_table"], cell["cell"]), [])
        # A stale run (its config.json no longer matches the table) is not a run of this table.
        loaded = [load_run(r) for r in cell_runs
                  if results.get(r["run_dir"], {}).get("status") != "stale"]
        # A run whose final validation loss is not finite (null in metrics.jsonl) finished
        # diverged: no perplexity to average, and a note says so.
        done = [l for l in loaded if l["finished"] and l["val_ppl"] is not None]
        ppl = [l["val_ppl"] for l in done]
        summaries = [l["summary"] for l in done if l["summary"]]
        problems = []
        for r in cell_runs:
            res = results.get(r["run_dir"], {"status": "not run yet"})
            if res["status"] not in ("done", "ran"):
                problems.append(f"seed {r['seed']}: {res['status']}"
                                + (f": {res['detail']}" if res.get("detail") else ""))
        diverged = [l for l in loaded if l["finished"] and l["val_ppl"] is None]
        for l in diverged:
            problems.append(f"seed {l['seed']}: diverged (its final validation " + (
                "loss is not finite)" if l["val_loss"] is None else
                f"loss is {l['val_loss']:.1f}: its perplexity overflows)"))
        stats.append({
            "cell": cell, "runs": loaded, "n": len(done), "n_asked": len(cell_runs),
            "n_diverged": len(diverged),
            "ppl_mean": mean(ppl), "ppl_sd": statistics.stdev(ppl) if len(ppl) >= 2 else None,
            "ppl_min": min(ppl) if ppl else None, "ppl_max": max(ppl) if ppl else None,
            "val_loss_mean": mean([l["val_loss"] for l in done]),
            "val_loss_by_seed": {l["seed"]: l["val_loss"] for l in done},
            "active_fraction": mean([s.get("active_fraction") for s in summaries]),
            "exceedance_rate": mean([s.get("exceedance_rate") for s in summaries]),
            "switches_per_1000": mean([s.get("switches_per_1000_steps") for s in summaries]),
            "budget": summaries[0].get("budget") if summaries else None,
            "units": summaries[0].get("units") if summaries else None,
            "tokens_per_s": mean([l["tokens_per_s"] for l in done]),
            "step_ms": mean([l["step_ms"] for l in done]),
            "peak_rss": max((l["peak_rss"] or 0 for l in done), default=None) or None,
            "signal": signal_quality.cell_figures([l["signal"] for l in done]),
            "problems": problems,
        })
    return stats


def _fmt(value, spec, empty="—"):
    return empty if value is None else format(value, spec)


def _ref(stats, method, model):
    return next((s for s in stats if s["cell"]["method"] == method and s["cell"]["model"] == model
                 and s["n"] > 0), None)


def paired_loss_delta(s, ref):
    """Per-seed val-loss differences s − ref over the seeds both finished, as (mean, sd, n).
    Every cell of a seed starts from the same initial weights and sees the same batches
    (scales.json `seed_keys`), so the paired difference cancels most of the seed-to-seed
    spread that a difference of means carries."""
    seeds = sorted(set(s["val_loss_by_seed"]) & set(ref["val_loss_by_seed"]))
    diffs = [s["val_loss_by_seed"][k] - ref["val_loss_by_seed"][k] for k in seeds]
    if not diffs:
        return None
    return mean(diffs), statistics.stdev(diffs) if len(diffs) >= 2 else None, len(diffs)


def _fmt_paired(s, ref):
    if ref is None or s["n"] == 0:
        return "—"
    if ref is s:
        return "(reference)"
    paired = paired_loss_delta(s, ref)
    if paired is None:
        return "—"
    m, sd, n = paired
    text = f"{m:+.4f}" + (f" ± {sd:.4f}" if sd is not None else "")
    return text + (f" (n={n})" if n != s["n"] else "")


def _fmt_mean_sd(pair, spec):
    m, sd = pair if pair else (None, None)
    if m is None:
        return "—"
    return format(m, spec) + (f" ± {format(sd, spec)}" if sd is not None else "")


def signal_markdown(stats):
    """The signal-quality table (signal_quality.py) of the cells whose runs measured recovery gaps."""
    cells = [s for s in stats if s.get("signal")]
    if not cells:
        return []
    lines = ["Signal quality (cells that measured recovery gaps; scripts/experiments/signal_quality.py):",
             "", "| model | method | seeds | steps | Spearman ρ(risk, gap) | ranking precision@k "
             "| choice precision@k (steps) | top-k share of the gap | chance k/n "
             "| top-10% steps' share of the gap |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in cells:
        q = s["signal"]
        k, n = s["budget"], s["units"]
        chance = f"{k / n:.3f}" if k and n else "—"
        steps = q["steps"][0]
        choice_steps = q["choice_steps"][0]
        lines.append("| " + " | ".join([
            s["cell"]["model"], s["cell"]["label"], str(q["seeds"]),
            f"{steps:.0f}" if steps is not None else "—",
            _fmt_mean_sd(q["spearman"], ".3f"), _fmt_mean_sd(q["ranking_precision"], ".3f"),
            _fmt_mean_sd(q["choice_precision"], ".3f")
            + (f" ({choice_steps:.0f})" if choice_steps is not None else ""),
            _fmt_mean_sd(q["top_k_gap_share"], ".3f"), chance,
            _fmt_mean_sd(q["top_decile_step_share"], ".3f")]) + " |")
    lines += ["", "Per step past gnmr.warmup_steps, over the units: **Spearman ρ** between "
              "GNMR's risk (max(GNMR/α, Δ-GNMR/β), computed by every controller) and the "
              "measured recovery gap; **ranking precision@k** = share of the k = budget units "
              "with the largest risk that are among the k largest gaps; **choice precision@k** "
              "= share of the units the controller put on recovery that are among the k largest "
              "gaps, over the steps where it recovered any (their mean count in parentheses); "
              "**top-k share** = the k largest gaps' share of the step's summed gap (k/n if the "
              "damage were spread evenly over the units); **top-10% steps' share** = the share of the "
              "run's summed gap on its 10% of steps with the largest summed gap (0.1 if spread "
              "evenly over the steps). Means over steps, then mean ± sd over seeds.", ""]
    return lines


def markdown(table, scale_name, stats, command, environment, plot_files, plot_note, corpus_dir):
    ref_label = table["methods"][table["reference"]]["label"] if table["reference"] else None
    low_label = table["methods"][table["low_reference"]]["label"] if table["low_reference"] else None
    lines = [f"# Table `{table['name']}` at scale `{scale_name}`", "", table["title"] + ".", "",
             "Reproduce (from the repository root):", "", "```", command, "```", ""]
    head = ["model", "method", "seeds", "val ppl", "min–max",
            f"Δ ppl vs {ref_label}" if ref_label else "Δ ppl",
            f"paired Δ val loss vs {ref_label}" if ref_label else "paired Δ val loss",
            f"paired Δ val loss vs {low_label}" if low_label else "paired Δ val loss vs low",
            "active units", "exceedance rate", "switches /1k steps", "tokens/s",
            f"step time vs {low_label}" if low_label else "step time", "peak RSS"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in stats:
        c = s["cell"]
        ref = _ref(stats, table["reference"], c["model"]) if table["reference"] else None
        low = _ref(stats, table["low_reference"], c["model"]) if table["low_reference"] else None
        ppl = "—"
        if s["ppl_mean"] is not None:
            ppl = f"{s['ppl_mean']:.2f}" + (f" ± {s['ppl_sd']:.2f}" if s["ppl_sd"] is not None else "")
        spread = (f"{s['ppl_min']:.2f}–{s['ppl_max']:.2f}" if s["n"] >= 2 else "—")
        delta = "—"
        if ref and s["ppl_mean"] is not None and ref is not s:
            d = s["ppl_mean"] - ref["ppl_mean"]
            delta = f"{d:+.2f} ({100 * d / ref['ppl_mean']:+.1f}%)"
        elif ref is s:
            delta = "(reference)"
        active = "—"
        if s["active_fraction"] is not None and runner.has_low_path(c["overrides"]):
            active = f"{100 * s['active_fraction']:.1f}%"
            if c["dynamic"] and s["budget"] is not None and s["units"]:
                active += f" (budget {s['budget']}/{s['units']})"
        overhead = "—"
        if low and s["step_ms"] and low["step_ms"]:
            overhead = ("(reference)" if low is s
                        else f"{100 * (s['step_ms'] / low['step_ms'] - 1):+.1f}%")
        seeds = f"{s['n']}/{s['n_asked']}" + (" ⚠" if s["problems"] else "")
        row = [c["model"], c["label"], seeds, ppl, spread, delta, _fmt_paired(s, ref),
               _fmt_paired(s, low), active,
               _fmt(s["exceedance_rate"] and 100 * s["exceedance_rate"], ".3f") + (
                   "%" if s["exceedance_rate"] is not None else ""),
               _fmt(s["switches_per_1000"], ".1f"), _fmt(s["tokens_per_s"], ".0f"), overhead,
               _fmt(s["peak_rss"] and s["peak_rss"] / 2**20, ".0f") + (
                   " MiB" if s["peak_rss"] else "")]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Columns: **val ppl** = validation perplexity at the last step, mean ± sample "
              "standard deviation (n−1) over the finished seeds; **min–max** = its range over "
              "seeds; **Δ ppl** = difference of the means; **paired Δ val loss** = the per-seed "
              "difference of the final validation loss (nats) to the reference cell's run of the "
              "same seed, mean ± sd over seeds (every cell of a seed starts from the same weights "
              "and sees the same batches, so this cancels most of the seed spread; negative = "
              "better); "
              "**active units** = mean share of projection units on the recovery path per step "
              "(gnmr_summary.json `active_fraction`; — for recipes without a low path), with the "
              "budget `gnmr.max_active` in units; **exceedance rate** = "
              "share of eligible unit-steps whose GNMR or Δ-GNMR exceeded its threshold; "
              "**tokens/s** = median over steps 3… of each run, mean over seeds; **step time** = "
              "median step time relative to the static low-precision cell (CPU runs share the "
              "cores: read it as ±10%); **peak RSS** = peak resident memory of the process.", ""]
    lines += signal_markdown(stats)
    problems = [(s["cell"], p) for s in stats for p in s["problems"]]
    if problems:
        lines += ["Runs that did not finish:", ""]
        lines += [f"- `{c['model']}-{c['method']}` {p}" for c, p in problems] + [""]
    lines += ["Cells (`gnmr train --config MODEL --set …`; table and scale settings below apply "
              "to all):", ""]
    seen = set()
    for s in stats:
        c = s["cell"]
        if c["method"] in seen:
            continue
        seen.add(c["method"])
        mset = table["methods"][c["method"]]["set"]
        shared = f" (runs shared with table `{c['owner_table']}`)" if c["owner_table"] != table["name"] else ""
        lines.append(f"- **{c['label']}** (`{c['method']}`){shared}: "
                     + ", ".join(f"`{k}={json.dumps(v)}`" for k, v in mset.items()))
    scale = table["scales"][scale_name]
    lines += ["", "Table settings: " + ", ".join(f"`{k}={json.dumps(v)}`" for k, v in table["set"].items()),
              "", f"Scale `{scale_name}`: " + scale.get("note", ""), "",
              "Scale settings: " + ", ".join(f"`{k}={json.dumps(v)}`"
                                            for k, v in scale.get("set", {}).items()),
              "", f"`{{corpus}}` = `{corpus_dir}`", ""]
    for model, mspec in scale["models"].items():
        lines.append(f"- model `{model}`: `{mspec['config']}` "
                     + ", ".join(f"`{k}={json.dumps(v)}`" for k, v in mspec.get("set", {}).items()))
    lines.append("")
    if plot_files:
        lines += ["Plots:", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})"
                                   for p in plot_files] + [""]
    if plot_note:
        lines += [plot_note, ""]
    lines += ["Environment: " + environment, ""]
    return "\n".join(lines)
