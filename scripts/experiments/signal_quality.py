"""How well GNMR's risk ranks the units whose recovery would matter: the trace of a run that
measured recovery gaps (log.recovery_gap=true, or gnmr.controller=oracle) against its own
risk scores.

Per traced step past the controller's warm-up (every unit's risk and gap defined):
- spearman: Spearman rank correlation over the units between GNMR's risk (the trace's "risk",
  the ranking key max(GNMR/α, Δ/β); null = +inf, an invalid norm) and the measured gap;
- ranking_precision: |top-k by risk ∩ top-k by gap| / k, k = the budget, ties by lower unit id
  (as the controller breaks them): how well GNMR's ranking alone agrees with the oracle's;
- choice_precision: of the units the trace's plan puts on recovery, the share that are in the
  top-k by gap (steps where the controller recovered something), with the chance level k/n;
- top_k_gap_share: the top-k units' share of the step's summed gap, with the chance level k/n:
  how concentrated the damage is over the units.
A run's figure is the mean over its steps; a cell's is mean ± sd over its seeds. Per run also:
- top_decile_step_share: the share of the run's summed gap (over units and steps) on its 10%
  of steps with the largest summed gap (0.1 if every step had the same): how concentrated the
  damage is in time.
"""

import math
import statistics


def _ranks(values):
    """Average ranks (1 = smallest) with ties sharing the mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a, b):
    """Spearman's ρ of two equal-length lists; None when either is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return cov / math.sqrt(va * vb)


def top_k(values, k):
    """The k units with the largest values, ties by lower id (the controller's order)."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return set(order[:k])


def _number(value):
    """A trace entry as a float: null (NaN/Inf when written) counts as +inf."""
    return math.inf if value is None else float(value)


def step_figures(row, budget):
    """The figures of one trace line, or None if it has no gaps."""
    gaps, risks, path = row.get("gap"), row.get("risk"), row.get("path")
    if not isinstance(gaps, list) or not isinstance(risks, list) or len(gaps) != len(risks):
        return None
    gap = [_number(g) for g in gaps]
    risk = [_number(r) for r in risks]
    n = len(gap)
    k = min(budget, n)
    if k < 1 or not all(math.isfinite(g) for g in gap):
        return None
    oracle = top_k(gap, k)
    figures = {"total_gap": sum(gap),
               "spearman": spearman(risk, gap),
               "ranking_precision": len(top_k(risk, k) & oracle) / k,
               "choice_precision": None,
               "top_k_gap_share": (sum(gap[u] for u in oracle) / sum(gap)) if sum(gap) > 0 else None}
    chosen = {u for u, p in enumerate(path or []) if p == 1}
    if chosen:
        figures["choice_precision"] = len(chosen & oracle) / len(chosen)
    return figures


def run_figures(trace_rows, budget, first_step):
    """Means over the run's steps >= first_step of step_figures; None if no step had gaps."""
    per_step = [f for row in trace_rows if row.get("step", 0) >= first_step
                for f in [step_figures(row, budget)] if f is not None]
    if not per_step:
        return None
    out = {"steps": len(per_step)}
    for key in ("spearman", "ranking_precision", "choice_precision", "top_k_gap_share"):
        values = [f[key] for f in per_step if f[key] is not None]
        out[key] = statistics.fmean(values) if values else None
    out["choice_steps"] = sum(1 for f in per_step if f["choice_precision"] is not None)
    totals = sorted((f["total_gap"] for f in per_step), reverse=True)
    decile = max(1, len(totals) // 10)
    out["top_decile_step_share"] = sum(totals[:decile]) / sum(totals) if sum(totals) > 0 else None
    return out


def cell_figures(runs):
    """mean and sd over the runs (seeds) of each figure; None if no run had gaps."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {"seeds": len(runs)}
    for key in ("spearman", "ranking_precision", "choice_precision", "top_k_gap_share",
                "top_decile_step_share", "choice_steps", "steps"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = (statistics.fmean(values) if values else None,
                    statistics.stdev(values) if len(values) >= 2 else None)
    return out
