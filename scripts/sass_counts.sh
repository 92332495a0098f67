#!/usr/bin/env bash
# What the compiler made of a kernel file, without a GPU: per kernel, ptxas's registers and spill
# bytes, and the static SASS instruction counts of the kinds that decide a tensor-core kernel's
# speed (HMMA tensor-core products, LDSM ldmatrix loads, LDS plain shared loads, LDG.128 16-byte
# global loads, LDGSTS cp.async copies, F2FP paired conversions, MUFU exp2/log/reciprocal, CALL
# slow paths), and all (never-executed padding left out); then the main loop (of the loops, the
# one holding the most HMMA): "loop", its instructions from its head to its branch back, each
# once, and "inner", the loops inside it, whose bodies run more than once per iteration.
# Static counts, not a measurement of speed: the loops run many times, an instruction once here.
#   scripts/sass_counts.sh kernels/flash_attention_mma.cu [ARCH]   (ARCH default sm_90a)
# Needs nvcc and a SASS disassembler on PATH: cuobjdump (the full CUDA toolkit) or nvdisasm
# (also `pip install nvidia-cuda-nvdisasm`, under its nvidia/cu13/bin).
#   scripts/sass_counts.sh --check-spills KERNEL.cu [ARCH]
# ptxas's registers and spills alone (nvcc only): exit 1 when any kernel spills. The tensor-core
# flash kernels sit at 251-255 registers, where ptxas's allocation turns on small changes (docs/GPU-PERFORMANCE.md,
# session 24), so a test runs this on them (tests/scripts/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
check_spills=0
[ "${1:-}" = --check-spills ] && { check_spills=1; shift; }
file="${1:?usage: scripts/sass_counts.sh [--check-spills] KERNEL.cu [ARCH]}"
arch="${2:-sm_90a}"
[ -f "$file" ] || { echo "sass_counts.sh: no file $file" >&2; exit 2; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "sass_counts.sh: nvcc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The flags of kernels/CMakeLists.txt that change code generation.
nvcc -std=c++17 -O3 --fmad=false -arch="$arch" -I. -Isrc -Xptxas -v -cubin "$file" \
  -o "$work/k.cubin" 2>"$work/ptxas.txt" || { cat "$work/ptxas.txt" >&2; exit 1; }
if ((check_spills)); then
  echo - >"$work/k.sass"  # no disassembly: the python below stops after ptxas's figures
elif command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$work/k.cubin" >"$work/k.sass"
elif command -v nvdisasm >/dev/null; then
  nvdisasm "$work/k.cubin" >"$work/k.sass"
else
  echo "sass_counts.sh: neither cuobjdump nor nvdisasm on PATH" >&2
  exit 2
fi
/usr/bin/python3 - "$work/ptxas.txt" "$work/k.sass" "$check_spills" "$arch" <<'EOF'
import collections, re, subprocess, sys

def demangle(name):
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    except OSError:
        return name

def short(name):
    # gnmr::cuda::(anonymous namespace)::flash_forward_mma_kernel<128>(...) -> the kernel<128>
    m = re.search(r"(\w+)<([\d, ]+)>\(", demangle(name))
    return f"{m.group(1)}<{m.group(2)}>" if m else demangle(name).split("(")[0]

resources, current = {}, None
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m:
        current = short(m.group(1))
        resources[current] = {}
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and current:
        resources[current]["spill"] = int(m.group(1)) + int(m.group(2))
    m = re.search(r"Used (\d+) registers", line)
    if m and current:
        resources[current]["registers"] = int(m.group(1))

if sys.argv[3] == "1":  # --check-spills
    spilling = [f"{name} ({r.get('registers', '?')} registers, {r['spill']} bytes)"
                for name, r in resources.items() if r.get("spill", 0) > 0]
    if not resources:
        sys.exit("sass_counts.sh: ptxas reported no kernel")
    if spilling:
        sys.exit(f"sass_counts.sh: spills on {sys.argv[4]}: " + "; ".join(spilling))
    print(f"{len(resources)} kernels on {sys.argv[4]}, none spills: " +
          ", ".join(f"{name} {r.get('registers', '?')}" for name, r in resources.items()))
    sys.exit(0)

counts, code, current = collections.OrderedDict(), {}, None
labels, pending = {}, []
for line in open(sys.argv[2]):
    m = re.search(r"Function : (\S+)", line) or re.search(r"^\s*\.text\.(\S+?):", line)
    if m:
        current = short(m.group(1))
        counts.setdefault(current, collections.Counter())
        code.setdefault(current, [])
        continue
    m = re.match(r"^\s*\.(L\w+):", line)  # nvdisasm's label: the next instruction's address
    if m:
        pending.append(m.group(1))
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
    if m and current:
        address = int(m.group(1), 16)
        for label in pending:
            labels[(current, label)] = address
        pending = []
        if m.group(2) and m.group(2).strip() == "@!PT":
            continue  # never executed: ptxas's padding
        op = m.group(3)
        counts[current]["all"] += 1
        counts[current][op.split(".")[0]] += 1
        if op.startswith("LDG.") and ".128" in op:
            counts[current]["LDG.128"] += 1
        if not op.startswith("NOP"):
            code[current].append((address, op, m.group(4)))

# The main loop: of the loops (a branch back to an earlier address), the one holding the most
# HMMA (else the most instructions). "loop": its instructions from its head to its branch back,
# each once (what one iteration issues when it takes every path and each inner loop runs once);
# "inner": the loops inside it, which run their bodies more than once per iteration.
def branch_target(name, operands):
    m = re.search(r"`\(\.(L\w+)\)", operands)  # nvdisasm
    if m:
        return labels.get((name, m.group(1)))
    m = re.search(r"\b0x([0-9a-f]+)\b", operands)  # cuobjdump
    return int(m.group(1), 16) if m else None

def main_loop(name):
    instructions = code.get(name, [])
    loops = []
    for i, (address, op, operands) in enumerate(instructions):
        if op.split(".")[0] != "BRA":
            continue
        target = branch_target(name, operands)
        if target is not None and target < address:  # (a branch to itself ends the code)
            body = [x for x in instructions[: i + 1] if x[0] >= target]
            loops.append((target, address, body))
    if not loops:
        return None
    head, tail, body = max(loops, key=lambda l: (sum(x[1].startswith("HMMA") for x in l[2]), len(l[2])))
    inner = sum(1 for l in loops if head <= l[0] and l[1] < tail)
    return len(body), inner

kinds = ["HMMA", "LDSM", "LDS", "LDG.128", "LDGSTS", "F2FP", "MUFU", "CALL", "all"]
print(f"{'kernel':44s} {'regs':>4s} {'spill':>5s} " + " ".join(f"{k:>7s}" for k in kinds)
      + f" {'loop':>6s} {'inner':>5s}")
for name, c in counts.items():
    if name.startswith("$") or c["all"] == 0:
        continue
    r = resources.get(name, {})
    loop = main_loop(name)
    print(f"{name:44s} {r.get('registers', '?'):>4} {r.get('spill', '?'):>5} "
          + " ".join(f"{c[k]:7d}" for k in kinds)
          + (f" {loop[0]:6d} {loop[1]:5d}" if loop else f" {'-':>6s} {'-':>5s}"))
EOF
