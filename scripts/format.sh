#!/usr/bin/env bash
# clang-format (the repository's .clang-format) over every C++/CUDA source in src/, tests/ and
# kernels/.
#   scripts/format.sh          reformat the files in place
#   scripts/format.sh --check  change nothing; fail, listing each violation, if a file is not
#                              formatted (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format not found (scripts/setup.sh --format installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp' 'tests/*.h' \
  'kernels/*.cu' 'kernels/*.cuh' 'kernels/*.h')
case "${1:-}" in
  "") clang-format -i "${files[@]}" ;;
  --check) clang-format --dry-run -Werror "${files[@]}" && echo "format.sh: ${#files[@]} files formatted" ;;
  *) echo "format.sh: unknown option $1" >&2; exit 2 ;;
esac
