#!/usr/bin/env python3
"""The per-kernel table of Nsight Compute runs: what `gpu_check.sh profile` prints.

Reads the text of `ncu --print-summary per-kernel --metrics gpu__time_duration.sum,
dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active`
(one or more files, anything else in them skipped) and prints one row per kernel and launch shape:
launches, average and total time, the share of the DRAM bandwidth it moved and the share of
cycles its schedulers issued an instruction, largest total first. The last two say which of
the two a kernel waits on: a kernel near the bandwidth is done; one that issues in most of its
cycles while moving a fraction of the bandwidth is issue-bound, and fewer instructions make it
faster (docs/GPU-PERFORMANCE.md, runs 1-10). Where the run also asked for them (the tensor-core
kernels'), five more columns: the share of L2's throughput
(lts__throughput.avg.pct_of_peak_sustained_elapsed), of cycles the tensor pipe was busy with
HMMA (sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active), of the warp
slots held (sm__warps_active.avg.pct_of_peak_sustained_active, achieved occupancy), and of the
peak instruction rate of two pipes: XU, the special-function unit that takes the softmax's
exponentials, a quarter of a warp a cycle per scheduler
(sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active), and FMA, the fp32 multiply-adds
(sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active); and, where the run asked for it
(the wgmma kernels'), the share of cycles the tensor pipe was busy with any MMA instruction
(sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active), since the HMMA column may not
count wgmma's; "-" where a kernel's run did not measure one.

    scripts/ncu_summary.py FILE...           the table
    scripts/ncu_summary.py --line FILE...    one line: the kernels, the largest three
Standard library only (Debian's /usr/bin/python3 runs it). Exits 1 when no kernel is found.
"""
import argparse
import re
import sys

# "  void unnamed>::kernel<2, 1>(const float *, long) (16, 64, 1)x(512, 1, 1), Device 0, CC 9.0,
# Invocations 5": the name (arguments dropped), grid, block, launches.
HEADER = re.compile(r"^\s+(?:void\s+)?(?P<name>[^()]+?)\s*\(.*\)\s+\((?P<grid>\d+, \d+, \d+)\)x"
                    r"\((?P<block>\d+, \d+, \d+)\), Device \d+, CC [\d.]+, Invocations (?P<n>\d+)\s*$")
# "    gpu__time_duration.sum    us    26.27    26.53    26.38": name, unit, min, max, average.
METRIC = re.compile(r"^\s+(?P<metric>[a-z_]+__\S+)\s+(?P<unit>\S+)\s+[\d,.]+\s+[\d,.]+\s+"
                    r"(?P<average>[\d,.]+)\s*$")
TO_MICROSECONDS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                   "msecond": 1e3, "s": 1e6, "second": 1e6}
DURATION = "gpu__time_duration.sum"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
L2 = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
TENSOR = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
WARPS = "sm__warps_active.avg.pct_of_peak_sustained_active"
XU = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
FMA = "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
ANY_MMA = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
# The extra columns: header and metric, printed where any row has the metric.
EXTRA = [("L2", L2), ("tensor", TENSOR), ("warps", WARPS), ("XU", XU), ("FMA", FMA),
         ("MMA", ANY_MMA)]


def short_name(name):
    """The kernel's name without namespaces: 'unnamed>::gnmr::cuda::k<2, 1>' -> 'k<2, 1>'."""
    base = name.split("<", 1)
    return base[0].rsplit("::", 1)[-1] + ("<" + base[1] if len(base) > 1 else "")


def parse(text):
    """Rows of (kernel, grid, block, launches, {metric: average}) in the order ncu printed."""
    rows = []
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            rows.append({"kernel": short_name(header["name"]), "grid": header["grid"],
                         "block": header["block"], "launches": int(header["n"]), "metrics": {}})
            continue
        metric = METRIC.match(line)
        if metric and rows:
            value = float(metric["average"].replace(",", ""))
            if metric["metric"] == DURATION:
                unit = metric["unit"]
                if unit not in TO_MICROSECONDS:
                    raise ValueError(f"ncu_summary.py: a duration in '{unit}', not a time unit")
                value *= TO_MICROSECONDS[unit]
            rows[-1]["metrics"][metric["metric"]] = value
    return [r for r in rows if DURATION in r["metrics"]]


def total_us(row):
    return row["metrics"][DURATION] * row["launches"]


def percent(row, metric):
    value = row["metrics"].get(metric)
    return "-" if value is None else f"{value:.0f}%"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", action="store_true", help="one line: the largest three")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    rows = []
    for path in args.files:
        with open(path, errors="replace") as f:
            rows += parse(f.read())
    if not rows:
        print("ncu_summary.py: no kernel in " + ", ".join(args.files), file=sys.stderr)
        return 1
    rows.sort(key=total_us, reverse=True)
    extra = [(name, metric) for name, metric in EXTRA if any(metric in r["metrics"] for r in rows)]
    if args.line:
        top = "; ".join(f"{r['kernel']} {r['metrics'][DURATION]:.1f} us x{r['launches']} "
                        f"DRAM {percent(r, DRAM)} issue {percent(r, ISSUE)}" +
                        "".join(f" {name} {percent(r, metric)}" for name, metric in extra
                                if metric in r["metrics"]) for r in rows[:3])
        print(f"{len(rows)} kernel shapes; largest: {top}")
        return 0
    print(f"{'total us':>10} {'avg us':>9} {'launches':>8} {'DRAM':>5} {'issue':>5}" +
          "".join(f" {name:>6}" for name, _ in extra) + "  kernel (grid)x(block)")
    for r in rows:
        print(f"{total_us(r):10.1f} {r['metrics'][DURATION]:9.2f} {r['launches']:8d} "
              f"{percent(r, DRAM):>5} {percent(r, ISSUE):>5}" +
              "".join(f" {percent(r, metric):>6}" for _, metric in extra) +
              f"  {r['kernel']} ({r['grid']})x({r['block']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
