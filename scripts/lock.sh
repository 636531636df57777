#!/usr/bin/env bash
# Refresh the dependency locks from pyproject.toml's ranges (run after changing a dependency, or to take
# newer releases; then run the tests and commit requirements/*.txt):
#
#   scripts/lock.sh                     newest versions the ranges allow
#   scripts/lock.sh --upgrade-package rich   passed on to `uv pip compile` (keep the rest as locked)
#
# Writes requirements/dev.txt (runtime + test + dev extras + build backend) and requirements/runtime.txt
# (runtime + build backend, at exactly the versions dev.txt chose, so the two never disagree). Both are
# universal (any OS/CPU, Python >= 3.11; markers pick per platform) and carry sha256 hashes of every file.
# Needs uv: taken from PATH, else installed into a throwaway venv.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo_root"
# shellcheck source=scripts/_uv.sh
. scripts/_uv.sh
compile=("$uv_bin" pip compile --universal --python-version 3.11 --generate-hashes --quiet
         --custom-compile-command "scripts/lock.sh")
# Without --upgrade-package, ignore the current lock entirely (newest of everything).
if [ $# -eq 0 ]; then compile+=(--upgrade); fi
"${compile[@]}" "$@" pyproject.toml requirements/build.in --extra dev -o requirements/dev.txt
"${compile[@]}" "$@" pyproject.toml requirements/build.in --constraint requirements/dev.txt \
    -o requirements/runtime.txt
"$uv_bin" --version
grep -E '^[a-zA-Z0-9]' requirements/dev.txt | sed 's/ .*//' | tr '\n' ' '
echo
