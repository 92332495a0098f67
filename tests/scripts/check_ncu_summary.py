#!/usr/bin/env python3
"""scripts/ncu_summary.py on real ncu per-kernel summaries (data/ncu_per_kernel_summary.txt: two
quantizer kernels and two sum-of-squares launches of the fp8mix step, from the H200 runs 10 and
8 (docs/GPU-PERFORMANCE.md), around bench output it must skip; one duration in ms): the rows, their order, the units, the one-line form, and a file
without kernels an error."""
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "..", "..", "scripts", "ncu_summary.py")
sample = os.path.join(here, "data", "ncu_per_kernel_summary.txt")


def run(*args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def check(condition, what):
    if not condition:
        print("FAIL: " + what, file=sys.stderr)
        sys.exit(1)


table = run(sample)
check(table.returncode == 0, f"the table exits 0 (stderr: {table.stderr})")
rows = table.stdout.splitlines()[1:]
check(len(rows) == 4, f"four kernel shapes, got {len(rows)}:\n{table.stdout}")
# Largest total first: the 1.06 ms sum of squares (in ms: 1060 us), then 593.44 x 1, then the
# pair kernel 90.90 x 2 = 181.8, then the transposed tiles 26.38 x 3 = 79.14.
expected = [("1060.0", "1060.00", "1", "33%", "55%", "sum_squares_chunks_kernel (6502, 1, 1)x(128, 1, 1)"),
            ("593.4", "593.44", "1", "30%", "52%", "sum_squares_chunks_kernel (3231, 1, 1)x(128, 1, 1)"),
            ("181.8", "90.90", "2", "60%", "66%",
             "quantize_fp_tile_1x128_and_transposed_kernel<2, 1> (44, 64, 1)x(512, 1, 1)"),
            ("79.1", "26.38", "3", "58%", "61%",
             "quantize_fp_tile_128x1_transposed_kernel<2, 1> (32, 64, 1)x(256, 1, 1)")]
for row, want in zip(rows, expected):
    fields = row.split(None, 5)
    check(tuple(fields) == want, f"row {row!r}, expected {want}")

line = run("--line", sample)
check(line.returncode == 0 and line.stdout.startswith("4 kernel shapes; largest: "
                                                      "sum_squares_chunks_kernel 1060.0 us x1 DRAM 33% issue 55%;"),
      f"the one-line form: {line.stdout!r}")

with tempfile.NamedTemporaryFile("w", suffix=".txt") as empty:
    empty.write("==PROF== Connected to process 1\nno kernels here\n")
    empty.flush()
    none = run(empty.name)
    check(none.returncode == 1 and "no kernel in" in none.stderr,
          f"a file without kernels is an error: {none.returncode} {none.stderr!r}")
# The tensor-core kernels' run also measures L2, the tensor pipe, the warps held and the XU and
# FMA pipes' instruction rates: five more columns, "-" for the rows of runs that did not (the format of the lines above, values made up).
flash = """  void unnamed>::flash_forward_mma_kernel<64, 2>(const unsigned short *, FlashTiling, float) (2048, 1, 1)x(128, 1, 1), Device 0, CC 9.0, Invocations 2
    Section: Command line profiler metrics
    dram__throughput.avg.pct_of_peak_sustained_elapsed                          %   10.00   12.00   11.00
    gpu__time_duration.sum                                                     ms    1.50    1.70    1.60
    lts__throughput.avg.pct_of_peak_sustained_elapsed                           %   40.00   42.00   41.00
    sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active                 %   18.00   20.00   19.00
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active                  %   60.00   62.00   61.00
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active      %   30.00   32.00   31.00
    sm__warps_active.avg.pct_of_peak_sustained_active                           %   24.00   26.00   25.00
    smsp__issue_active.avg.pct_of_peak_sustained_active                         %   50.00   52.00   51.00
"""
with tempfile.NamedTemporaryFile("w", suffix=".txt") as extra:
    extra.write(flash)
    extra.flush()
    both = run(sample, extra.name)
    check(both.returncode == 0, f"the table with the extra columns exits 0 ({both.stderr})")
    lines = both.stdout.splitlines()
    check(lines[0].split()[7:13] == ["L2", "tensor", "warps", "XU", "FMA", "kernel"],
          f"the header names the extra columns: {lines[0]!r}")
    want = ["3200.0", "1600.00", "2", "11%", "51%", "41%", "31%", "25%", "61%", "19%"]
    check(lines[1].split()[:10] == want, f"the flash row first, every column: {lines[1]!r}")
    check(lines[2].split()[5:10] == ["-"] * 5, f"'-' where a run lacks them: {lines[2]!r}")
    top = run("--line", extra.name)
    check("DRAM 11% issue 51% L2 41% tensor 31% warps 25% XU 61% FMA 19%" in top.stdout,
          f"the one-line form with the extra columns: {top.stdout!r}")
# The wgmma kernels' run adds the tensor pipe's cycles busy with any MMA: a sixth column.
wgmma = flash.replace("flash_forward_mma_kernel", "flash_forward_wgmma_kernel").replace(
    "    smsp__issue_active", "    sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    "             %   70.00   72.00   71.00\n    smsp__issue_active")
with tempfile.NamedTemporaryFile("w", suffix=".txt") as extra, \
        tempfile.NamedTemporaryFile("w", suffix=".txt") as with_mma:
    extra.write(flash)
    extra.flush()
    with_mma.write(wgmma)
    with_mma.flush()
    all_three = run(sample, extra.name, with_mma.name)
    lines = all_three.stdout.splitlines()
    check(lines[0].split()[7:14] == ["L2", "tensor", "warps", "XU", "FMA", "MMA", "kernel"],
          f"the header names the MMA column too: {lines[0]!r}")
    rows = {line.split()[11]: line.split() for line in lines[1:]}  # by the name's first word
    check(rows["flash_forward_wgmma_kernel<64,"][10] == "71%"
          and rows["flash_forward_mma_kernel<64,"][10] == "-",
          f"the MMA column on the wgmma row only: {all_three.stdout!r}")
print("ncu_summary.py: 4 rows, order, units, --line, the extra columns (MMA too) and the empty case as "
      "expected")
