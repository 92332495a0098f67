"""PNG plots of a table (matplotlib, Agg backend): loss curves per method, and a heat-map of
the units each dynamic-controller cell recovered over time (from gnmr_trace.jsonl)."""

import os

from . import runner

KINDS = ["q", "k", "v", "o", "gate", "up", "down"]


def available():
    """(numpy, pyplot) or a sentence saying why plots are skipped."""
    try:
        import numpy
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as e:
        return None, (f"Plots skipped: this Python lacks {e.name} (use Debian's /usr/bin/python3 "
                      f"with python3-numpy and python3-matplotlib).")
    return (numpy, pyplot), None


def _smooth(np, y, window):
    if window <= 1 or len(y) < window:
        return y
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, y[0]), y])
    return np.convolve(padded, kernel, mode="valid")


def _curves(np, runs):
    """Aligned train-loss curves of a cell's finished runs: (steps, [n_seeds, n_steps], seeds)."""
    finished = [r for r in runs if r["finished"] and r["train"]]
    curves = [dict(r["train"]) for r in finished]
    if not curves:
        return None, None, None
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    if not steps:
        return None, None, None
    return (np.array(steps), np.array([[c[s] for s in steps] for c in curves]),
            [r["seed"] for r in finished])


def _paired_panel(np, axd, series, ref):
    """Each method's smoothed train loss minus `ref`'s run of the same seed (same initial
    weights and batches), mean over seeds with the min–max band."""
    for i, (s, steps, smooth, seeds) in enumerate(series):
        paired_seeds = [k for k in seeds if k in ref[3]]
        if not paired_seeds:
            continue
        color = f"C{i % 10}"
        common, ia, ib = np.intersect1d(steps, ref[1], return_indices=True)
        d = np.array([smooth[seeds.index(k)][ia] - ref[2][ref[3].index(k)][ib]
                      for k in paired_seeds])
        axd.plot(common, d.mean(axis=0), color=color, lw=1.4)
        if len(d) > 1:
            axd.fill_between(common, d.min(axis=0), d.max(axis=0), color=color, alpha=0.12)
    axd.axhline(0, color="k", lw=0.8)
    axd.set_ylabel(f"train loss − {ref[0]['cell']['label']}, same seed (nats)")
    axd.set_title(f"paired difference to {ref[0]['cell']['label']}", fontsize=10)
    axd.set_xlabel("step")
    axd.grid(alpha=0.3)
    if len(ref[1]) > 10:
        axd.set_xlim(ref[1][len(ref[1]) // 10], ref[1][-1])


def loss_curves(libs, table, stats, model, path):
    """Panels: smoothed train loss per method (mean over seeds, shaded min–max) with the
    validation points; then each method's paired difference (same seed) to the reference
    cell and, when the table has one, to the static low-precision cell."""
    np, plt = libs
    series = []  # (stat, steps, smoothed [seeds, steps], seeds)
    for s in stats:
        if s["cell"]["model"] != model or s["n"] == 0:
            continue
        steps, losses, seeds = _curves(np, s["runs"])
        if steps is not None:
            series.append((s, steps, losses, seeds))
    if not series:
        return None
    window = max(1, max(len(x[1]) for x in series) // 25)
    series = [(s, steps, np.array([_smooth(np, l, window) for l in losses]), seeds)
              for s, steps, losses, seeds in series]
    refs = [next((x for x in series if x[0]["cell"]["method"] == table[key]), None)
            for key in ("reference", "low_reference") if table.get(key)]
    refs = [r for r in refs if r is not None]
    fig, axes = plt.subplots(1, 1 + len(refs), figsize=(6.5 * (1 + len(refs)), 4.8),
                             squeeze=False)
    ax = axes[0][0]
    tops, bottoms = [], []
    for i, (s, steps, smooth, seeds) in enumerate(series):
        color = f"C{i % 10}"
        label = f"{s['cell']['label']} (n={len(smooth)})"
        m = smooth.mean(axis=0)
        ax.plot(steps, m, color=color, label=label, lw=1.4)
        if len(smooth) > 1:
            ax.fill_between(steps, smooth.min(axis=0), smooth.max(axis=0), color=color, alpha=0.2)
        tail = smooth[:, len(steps) // 5:]  # the first fifth (the steep drop) would flatten the rest
        tops.append(tail.max())
        bottoms.append(tail.min())
        evals = {}
        for r in s["runs"]:
            if r["finished"]:
                for step, val in r["evals"]:
                    evals.setdefault(step, []).append(val)
        if evals:
            es = sorted(evals)
            ax.plot(es, [np.mean(evals[e]) for e in es], "o", color=color, ms=4)
    ax.set_ylim(min(bottoms) - 0.05, max(tops) + 0.05)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train loss (moving average, {window} steps); dots: val loss")
    ax.set_title(f"{table['name']} / {model}: mean over seeds, band = min–max", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for axd, ref in zip(axes[0][1:], refs):
        _paired_panel(np, axd, series, ref)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _recovery_matrix(np, trace_rows, n_layers):
    """[7·L units, steps] 0/1 recovery flags; group granularity expands to its members."""
    steps, columns = [], []
    n_units = n_layers * len(KINDS)
    for row in trace_rows:
        path = row.get("path")
        if not isinstance(path, list):
            continue
        if row.get("granularity") == "group":
            col = [path[(u // 7) * 2 + (0 if u % 7 < 4 else 1)] for u in range(n_units)]
        else:
            col = path[:n_units]
        if len(col) != n_units:
            continue
        steps.append(row["step"])
        columns.append(col)
    if not columns:
        return None, None
    return np.array(steps), np.array(columns, dtype=float).T


def _gap_matrix(np, trace_rows, n_layers):
    """[7·L units, steps] measured recovery gaps (projection granularity traces only)."""
    steps, columns = [], []
    n_units = n_layers * len(KINDS)
    for row in trace_rows:
        gap = row.get("gap")
        if row.get("granularity") == "group" or not isinstance(gap, list) or len(gap) != n_units:
            continue
        steps.append(row["step"])
        columns.append([np.nan if g is None else g for g in gap])
    if not columns:
        return None, None
    return np.array(steps), np.array(columns, dtype=float).T


def _traced_matrix(np, stat, matrix_of):
    """(run, steps, [units, steps] matrix) from the trace of the first finished seed of a cell
    that has a gnmr_trace.jsonl, or Nones."""
    run = next((r for r in stat["runs"] if r["finished"] and r["has_trace"]), None)
    if run is None:
        return None, None, None
    config = runner.read_json(os.path.join(run["run_dir"], "config.json")) or {}
    n_layers = runner.lookup(config, "model.n_layers")
    if not isinstance(n_layers, int):
        return None, None, None
    rows = runner.read_jsonl(os.path.join(run["run_dir"], "gnmr_trace.jsonl"))
    steps, matrix = matrix_of(np, rows, n_layers)
    return (run, steps, matrix) if steps is not None else (None, None, None)


def _unit_heatmap(libs, steps, matrix, title, colour_label, bar_label, path, vmax,
                  max_columns=300):
    """Rows: layer × projection kind; columns: steps, binned to at most max_columns; a side
    bar with each row's mean over all steps."""
    np, plt = libs
    bin_size = max(1, -(-len(steps) // max_columns))
    n_bins = -(-len(steps) // bin_size)
    padded = np.full((matrix.shape[0], n_bins * bin_size), np.nan)
    padded[:, :matrix.shape[1]] = matrix
    binned = np.nanmean(padded.reshape(matrix.shape[0], n_bins, bin_size), axis=2)
    fig, (ax, axs) = plt.subplots(1, 2, figsize=(13, 0.22 * matrix.shape[0] + 2.2),
                                  gridspec_kw={"width_ratios": [6, 1]}, sharey=True)
    image = ax.imshow(binned, aspect="auto", interpolation="nearest", cmap="viridis",
                      vmin=0, vmax=vmax, extent=(steps[0] - 0.5, steps[-1] + 0.5,
                                                 matrix.shape[0] - 0.5, -0.5))
    labels = [f"L{u // 7}.{KINDS[u % 7]}" for u in range(matrix.shape[0])]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("step" + (f" (bins of {bin_size} steps)" if bin_size > 1 else ""))
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=colour_label, pad=0.01)
    share = np.nanmean(matrix, axis=1)
    axs.barh(range(len(share)), share, color="C1")
    axs.set_xlabel(bar_label)
    axs.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def recovery_heatmap(libs, table, stat, path):
    """Heat-map of the recovery path per unit (rows: layer × projection kind) over steps,
    for the first finished seed of one cell that has a gnmr_trace.jsonl."""
    run, steps, matrix = _traced_matrix(libs[0], stat, _recovery_matrix)
    if run is None:
        return None
    title = (f"{table['name']} / {stat['cell']['model']} / {stat['cell']['label']} "
             f"(seed {run['seed']}): units on the recovery path")
    return _unit_heatmap(libs, steps, matrix, title, "share of steps on the recovery path",
                         "share of all steps", path, 1)


def gap_heatmap(libs, table, stat, path):
    """Heat-map of the measured recovery gap per unit over steps (first traced seed of a cell
    that measured gaps): where and when the low path does its damage."""
    run, steps, matrix = _traced_matrix(libs[0], stat, _gap_matrix)
    if run is None:
        return None
    title = (f"{table['name']} / {stat['cell']['model']} / {stat['cell']['label']} "
             f"(seed {run['seed']}): recovery gap ‖g_low − g_rec‖ / ‖g_rec‖")
    vmax = float(libs[0].nanpercentile(matrix, 99)) or 1.0
    return _unit_heatmap(libs, steps, matrix, title,
                         "recovery gap (colour capped at the 99th percentile)", "mean gap", path,
                         vmax)


def make_plots(table, stats, out_dir):
    """Writes the PNGs next to table.md; returns (files, note)."""
    libs, note = available()
    if libs is None:
        return [], note
    files = []
    for model in dict.fromkeys(s["cell"]["model"] for s in stats):
        f = loss_curves(libs, table, stats, model, os.path.join(out_dir, f"loss_{model}.png"))
        if f:
            files.append(f)
    for s in stats:
        if s["cell"]["dynamic"] and s["n"] > 0:
            name = f"recovery_{s['cell']['model']}-{s['cell']['method']}.png"
            f = recovery_heatmap(libs, table, s, os.path.join(out_dir, name))
            if f:
                files.append(f)
        if s.get("signal"):
            name = f"gap_{s['cell']['model']}-{s['cell']['method']}.png"
            f = gap_heatmap(libs, table, s, os.path.join(out_dir, name))
            if f:
                files.append(f)
    return files, None
