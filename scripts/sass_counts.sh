#!/usr/bin/env bash
# What the compiler made of a kernel file, without a GPU: per kernel, ptxas's registers and spill
# bytes, and the static SASS instruction counts of the kinds that decide a tensor-core kernel's
# speed (HMMA tensor-core products, LDSM ldmatrix loads, LDS plain shared loads, LDG.128 16-byte
# global loads, LDGSTS cp.async copies, F2FP paired conversions, MUFU exp2/log/reciprocal, CALL
# slow paths), and all (never-executed padding left out).
# Static counts, not a measurement of speed: the loops run many times, an instruction once here.
#   scripts/sass_counts.sh kernels/flash_attention_mma.cu [ARCH]   (ARCH default sm_90a)
# Needs nvcc and a SASS disassembler on PATH: cuobjdump (the full CUDA toolkit) or nvdisasm
# (also `pip install nvidia-cuda-nvdisasm`, under its nvidia/cu13/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
file="${1:?usage: scripts/sass_counts.sh KERNEL.cu [ARCH]}"
arch="${2:-sm_90a}"
[ -f "$file" ] || { echo "sass_counts.sh: no file $file" >&2; exit 2; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "sass_counts.sh: nvcc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The flags of kernels/CMakeLists.txt that change code generation.
nvcc -std=c++17 -O3 --fmad=false -arch="$arch" -I. -Isrc -Xptxas -v -cubin "$file" \
  -o "$work/k.cubin" 2>"$work/ptxas.txt" || { cat "$work/ptxas.txt" >&2; exit 1; }
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$work/k.cubin" >"$work/k.sass"
elif command -v nvdisasm >/dev/null; then
  nvdisasm "$work/k.cubin" >"$work/k.sass"
else
  echo "sass_counts.sh: neither cuobjdump nor nvdisasm on PATH" >&2
  exit 2
fi
/usr/bin/python3 - "$work/ptxas.txt" "$work/k.sass" <<'EOF'
import collections, re, subprocess, sys

def demangle(name):
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    except OSError:
        return name

def short(name):
    # gnmr::cuda::(anonymous namespace)::flash_forward_mma_kernel<128>(...) -> the kernel<128>
    m = re.search(r"(\w+)<(\d+)>\(", demangle(name))
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

counts, current = collections.OrderedDict(), None
for line in open(sys.argv[2]):
    m = re.search(r"Function : (\S+)", line) or re.search(r"^\s*\.text\.(\S+?):", line)
    if m:
        current = short(m.group(1))
        counts.setdefault(current, collections.Counter())
        continue
    m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if m and current:
        if m.group(1) and m.group(1).strip() == "@!PT":
            continue  # never executed: ptxas's padding
        op = m.group(2)
        counts[current]["all"] += 1
        counts[current][op.split(".")[0]] += 1
        if op.startswith("LDG.") and ".128" in op:
            counts[current]["LDG.128"] += 1

kinds = ["HMMA", "LDSM", "LDS", "LDG.128", "LDGSTS", "F2FP", "MUFU", "CALL", "all"]
print(f"{'kernel':44s} {'regs':>4s} {'spill':>5s} " + " ".join(f"{k:>7s}" for k in kinds))
for name, c in counts.items():
    if name.startswith("$") or c["all"] == 0:
        continue
    r = resources.get(name, {})
    print(f"{name:44s} {r.get('registers', '?'):>4} {r.get('spill', '?'):>5} "
          + " ".join(f"{c[k]:7d}" for k in kinds))
EOF
