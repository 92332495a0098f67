#!/usr/bin/env bash
# Builds a relocatable bundle of gnmr for a GPU machine that has an NVIDIA driver and the CUDA
# 13 toolkit but none of our Debian packages, no root and no network (an HPC node, the device
# machine). The bundle holds:
#   bin/gnmr               the gnmr binary, CUDA code for sm_80 and sm_90a, built without MPI
#   bin/bench_gpu_attention  flash vs v1 attention speed (gpu_check.sh attention-bench)
#   bin/bench_gpu_gemm       cuBLASLt's ranked algorithms timed per GEMM (gpu_check.sh gemm-sweep)
#   tests/test_gpu         the `gpu`-labelled tests (each CUDA kernel vs its CPU twin, the backend
#                          end to end vs the CPU backend), one binary
#   lib/                   every shared library they need that is neither glibc nor CUDA
#                          (OpenBLAS, gfortran, sentencepiece, spdlog, fmt, gomp, zlib, the C++
#                          runtime); the binaries find it through RPATH $ORIGIN/../lib
#   share/                 configs/, the bundled corpus and its tokenizer (data/brown/)
#   reference/cpu_runs.json  the loss of every step of short tiny-model CPU runs, per recipe,
#                          made here by this bundle's own gnmr: the figures a GPU run is held to
#   BUNDLE.json            what was built, from which commit, and the size
# cudart and cuBLASLt come from the target's CUDA install at run time, NCCL (loaded, not
# linked: src/parallel/nccl_library.h) from its toolkit or its PyTorch (scripts/gpu_check.sh
# finds them). Next to OUT_DIR it writes OUT_DIR.tar.gz, the same bundle packed (a third of
# the size: OpenBLAS alone is 36 MB unpacked), which is what travels: scripts/gpu_check.sh
# unpacks it where it finds the archive newer than the directory. The archive and the files
# of this checkout that travel with it (tracked, and untracked but not ignored) must stay
# under 63 MiB together, 1 MiB inside the 64 MiB the device machine takes; the script fails
# if they do not.
#   scripts/gpu_bundle.sh [OUT_DIR]     default build/gpu-bundle
#   GNMR_BUNDLE_ARCHS="90a"             the CUDA architectures (default "80;90a"); one
#                                       architecture makes a smaller bundle for one machine
#   GNMR_BUNDLE_EMULATED=1              the dry run's bundle (default OUT_DIR
#                                       build/gpu-bundle-emulated): the CUDA backend and NCCL on
#                                       the host emulation of CUDA (tests/emulated_cuda), so
#                                       scripts/gpu_check.sh runs every stage here, without a
#                                       GPU, before the one GPU run counts; BUNDLE.json says
#                                       "emulated": true, and it is not packed for travel
set -euo pipefail
cd "$(dirname "$0")/.."
emulated="${GNMR_BUNDLE_EMULATED:-0}"
if [ "$emulated" = 1 ]; then
  out="${1:-build/gpu-bundle-emulated}"
  build=build/gpu-bundle-emulated-build
  archs=emulated
  cuda_flags=(-DGNMR_CUDA=OFF -DGNMR_CUDA_EMULATED=ON)
else
  out="${1:-build/gpu-bundle}"
  build=build/gpu-bundle-build
  archs="${GNMR_BUNDLE_ARCHS:-80;90a}"
  cuda_flags=(-DGNMR_CUDA=ON -DGNMR_CUDA_ARCHITECTURES="$archs")
fi
limit_mib=63

[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
[ "$emulated" = 1 ] || command -v nvcc >/dev/null || { echo "gpu_bundle.sh: nvcc not found (install the CUDA toolkit)" >&2; exit 2; }

# RPATH $ORIGIN/../lib in the build tree itself, so the binaries run from wherever the bundle is
# copied; the CUDA runtime is not given an RPATH (it must come from the target's toolkit). An
# old-style DT_RPATH (--disable-new-dtags), not DT_RUNPATH: it also serves the libraries'
# own dependencies (libopenblas needs libgfortran, which needs libquadmath).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}" -DGNMR_MPI=OFF -DGNMR_TESTS=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags >"$build.configure.log" \
  || { cat "$build.configure.log" >&2; exit 1; }
if [ "$emulated" = 1 ]; then
  grep -q "^GNMR_CUDA_EMULATED:BOOL=ON" "$build/CMakeCache.txt" \
    || { echo "gpu_bundle.sh: cmake did not enable the CUDA emulation (no CUDA headers? $build.configure.log)" >&2; exit 1; }
else
  grep -q "^CMAKE_CUDA_COMPILER:.*nvcc" "$build/CMakeCache.txt" \
    || { echo "gpu_bundle.sh: cmake did not enable CUDA (no nvcc in CMAKE_CUDA_COMPILER)" >&2; exit 1; }
fi
# The `gpu` test binaries; not test_gpu_emulated (label cpu: the kernel tests on the host, which
# CI runs and a GPU need not).
mapfile -t gpu_tests < <(grep -o 'gnmr_add_test(test_gpu[a-z0-9_]*' tests/gpu/CMakeLists.txt | cut -d'(' -f2 | grep -vx test_gpu_emulated)
extra_targets=()
[ "$emulated" = 1 ] && extra_targets=(gnmr_emulated_nccl)
cmake --build "$build" -j "$(nproc)" --target gnmr bench_gpu_attention bench_gpu_gemm "${gpu_tests[@]}" "${extra_targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/lib" "$out/share/data" "$out/reference"
cp "$build/src/cli/gnmr" "$build/tests/gpu/bench_gpu_attention" "$build/tests/gpu/bench_gpu_gemm" "$out/bin/"
for t in "${gpu_tests[@]}"; do cp "$build/tests/gpu/$t" "$out/tests/"; done
cp -r configs "$out/share/"
cp -r data/brown "$out/share/data/"
# The emulated NCCL, loaded as NCCL is (gpu_check.sh points GNMR_NCCL_LIBRARY at it: the
# emulated gnmr refuses a real NCCL).
[ "$emulated" = 1 ] && cp "$build/tests/emulated_cuda/libgnmr_emulated_nccl.so" "$out/lib/"

# Libraries: what ldd resolves for every binary, less glibc (the target has its own, and it
# must match its kernel) and less the CUDA libraries (they must match the target's driver).
is_system_or_cuda() {
  case "$(basename "$1")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | linux-vdso*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas* | libnccl* | libnvrtc* | libnvJitLink*) return 0 ;;
  esac
  return 1
}
for binary in "$out"/bin/* "$out"/tests/*; do
  while read -r lib; do
    [ -n "$lib" ] && ! is_system_or_cuda "$lib" && cp -L -n "$lib" "$out/lib/"
  done < <(ldd "$binary" | awk '/=> \// {print $3}')
done

# Relocation check: from a copy elsewhere, every library that is neither glibc nor CUDA must
# resolve inside the bundle, and none may be missing.
moved="$PWD/$build/relocation-check"
rm -rf "$moved" && cp -r "$out" "$moved"
for binary in "$moved"/bin/* "$moved"/tests/*; do
  while read -r lib; do
    is_system_or_cuda "$lib" && continue
    echo "gpu_bundle.sh: $(basename "$binary") needs $lib, found nowhere" >&2
    exit 1
  done < <(ldd "$binary" | awk '/=> not found/ {print $1}')
  while read -r lib; do
    if ! is_system_or_cuda "$lib" && [[ "$lib" != "$moved"/* ]]; then
      echo "gpu_bundle.sh: $(basename "$binary") loads $lib from outside the bundle" >&2
      exit 1
    fi
  done < <(ldd "$binary" | awk '/=> \// {print $3}')
done
rm -rf "$moved"

# The CPU figures a GPU run is compared with: 20 steps of the tiny model per recipe, from the
# bundled corpus, on this bundle's own binary (so a bundle and its reference always agree).
work="$build/reference-runs"
rm -rf "$work"
mkdir -p "$work"
"$out/bin/gnmr" prepare --no-progress --val-fraction 0.05 --tokenizer data/brown/tokenizer.model \
  --out "$work/shards" data/brown/brown.jsonl.gz >"$work/prepare.log" 2>&1
python3 - "$out" "$work" <<'EOF'
import json, os, subprocess, sys
out, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
recipes = {
    "fp32": {"recipe": "fp32"},
    "bf16": {"recipe": "bf16"},
    "actq": {"recipe": "actq"},
    "fp8mix": {"recipe": "fp8mix"},
    "fp8mix-fp4": {"recipe": "fp8mix", "low_format": "e2m1"},
    "int8": {"recipe": "int8"},
}
runs = {}
for name, precision in recipes.items():
    config = {
        "include": os.path.abspath("configs/models/tiny.json"),
        "data": {"train": f"{work}/shards/train_*.bin", "val": f"{work}/shards/val_*.bin",
                 "tokenizer": os.path.abspath("data/brown/tokenizer.model"), "seq_len": 64},
        "train": {"steps": 20, "warmup_steps": 2, "global_batch_tokens": 512, "micro_batch": 4,
                  "lr": 3e-3, "threads": 2, "gemm_precision": "bf16" if name == "bf16" else "fp32"},
        "precision": precision,
        "gnmr": {"controller": "static_low"},
        "eval": {"every": 0}, "checkpoint": {"every": 0}, "log": {"every": 1},
    }
    path = f"{work}/{name}.json"
    with open(path, "w") as f:
        json.dump(config, f)
    subprocess.run([f"{out}/bin/gnmr", "train", "--config", path, "--out", f"{work}/{name}",
                    "--force"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    losses = [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl")
              if json.loads(l).get("kind") == "train"]
    runs[name] = {"config": config, "losses": losses}
json.dump({"what": "tiny model, 20 steps per recipe, static_low, bundled corpus, CPU backend",
           "runs": runs}, open(f"{out}/reference/cpu_runs.json", "w"), indent=1)
EOF

size_bytes=$(du -sb "$out" | cut -f1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=false
[ -n "$(git status --porcelain 2>/dev/null)" ] && dirty=true
nvcc_version=none
[ "$emulated" = 1 ] || nvcc_version="$(nvcc --version | tail -1)"
emulated_json=false
[ "$emulated" = 1 ] && emulated_json=true
cat >"$out/BUNDLE.json" <<EOF
{"commit": "$commit", "dirty": $dirty, "built": "$(date -u +%FT%TZ)", "emulated": $emulated_json,
 "cuda_architectures": "$archs", "mpi": false, "nvcc": "$nvcc_version",
 "gpu_tests": [$(printf '"%s",' "${gpu_tests[@]}" | sed 's/,$//')], "bytes": $size_bytes}
EOF
if [ "$emulated" = 1 ]; then
  echo "gpu_bundle.sh: $out, $((size_bytes / 1048576)) MiB, on the CUDA emulation (the dry run's: scripts/gpu_check.sh --bundle $out; not for a GPU)"
  exit 0
fi
# The packed bundle, named after the directory it unpacks to (gpu_check.sh --bundle OUT_DIR).
archive="$out.tar.gz"
tar -czf "$archive.tmp" -C "$(dirname "$out")" "$(basename "$out")" && mv "$archive.tmp" "$archive"
archive_bytes=$(stat -c %s "$archive")
# What travels with it to a device machine: the checkout's tracked and untracked-not-ignored
# files (the archive itself is ignored, and carried).
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "gpu_bundle.sh: $out, $((size_bytes / 1048576)) MiB ($(ls "$out/lib" | wc -l) libraries); packed $archive, $((archive_bytes / 1048576)) MiB, with the checkout $(((archive_bytes + tree_bytes) / 1048576)) MiB (carry $archive)"
if [ $((archive_bytes + tree_bytes)) -gt $((limit_mib * 1048576)) ]; then
  echo "gpu_bundle.sh: the packed bundle and the checkout are over $limit_mib MiB together (try GNMR_BUNDLE_ARCHS=90a)" >&2
  exit 1
fi
