#!/usr/bin/env bash
# Installs gnmr's build dependencies from Debian/Ubuntu packages and builds the release
# preset (CPU backend; the CUDA backend too when nvcc is on PATH or in /usr/local/cuda).
#   scripts/setup.sh              install packages + build
#   scripts/setup.sh --deps-only  install packages only
#   scripts/setup.sh --tables     also install what the table scripts use (python3-numpy,
#                                 python3-matplotlib: scripts/reproduce.py and its test)
#   scripts/setup.sh --python     --tables, and python3-torch for scripts/bench_pytorch.py
#   scripts/setup.sh --fuzz       also install clang with libFuzzer and libomp (the fuzz
#                                 preset, scripts/fuzz.sh)
#   scripts/setup.sh --format     also install clang-format (scripts/format.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config git libspdlog-dev nlohmann-json3-dev libcli11-dev
  libsentencepiece-dev libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev zlib1g-dev python3)
deps_only=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    --tables) packages+=(python3-numpy python3-matplotlib) ;;
    --python) packages+=(python3-torch python3-numpy python3-matplotlib) ;;
    --fuzz) packages+=(clang libclang-rt-dev libomp-dev) ;;
    --format) packages+=(clang-format) ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
((deps_only)) && exit 0

# nvcc is found by CMake when it is on PATH; the usual install location is added here.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset release
cmake --build --preset release -j "$(nproc)"
echo "built: build/release/src/cli/gnmr"
