#!/usr/bin/env bash
# Install fleetfix into a virtual environment from the committed lock (requirements/*.txt, exact versions
# with hashes), never into the machine's own site-packages.
#
#   scripts/install.sh                   .venv with the runtime lock, fleetfix installed editable
#   scripts/install.sh --dev             the dev lock instead (tests, ruff, mypy)
#   scripts/install.sh --venv DIR        another venv directory
#   scripts/install.sh --fresh           remove the venv first (what .ci/run does every run)
#
# Python: $PYTHON, else python3 (>= 3.11). Prints the venv's bin directory's fleetfix path when done.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
venv="$repo_root/.venv"
lock="$repo_root/requirements/runtime.txt"
fresh=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dev) lock="$repo_root/requirements/dev.txt" ;;
        --venv) venv="${2:?--venv needs a directory}"; shift ;;
        --fresh) fresh=1 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "scripts/install.sh: unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "scripts/install.sh: $python is not Python >= 3.11 (set PYTHON=...)" >&2
    exit 2
fi
if [ "$fresh" = 1 ]; then rm -rf "$venv"; fi
if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv"; then
        echo "scripts/install.sh: could not create $venv (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
# --require-hashes: every package, transitive ones included, must match the lock byte for byte.
# --no-deps: the lock is the whole closure; pip must not resolve anything on its own.
"${pip[@]}" install --require-hashes --no-deps -r "$lock"
# The project itself, built by the locked setuptools already in the venv (no isolated build env that
# would fetch whatever setuptools is newest today).
"${pip[@]}" install --no-deps --no-build-isolation --editable "$repo_root"
# Bytecode now, as pip does for a wheel: an editable install otherwise compiles fleetfix's modules from
# source on every start wherever PYTHONDONTWRITEBYTECODE is set (common in container images; set on this
# project's development machines): ~80 ms of CPU per run, much of it before the first packet
# (docs/performance.md).
"$venv/bin/python" -m compileall -q "$repo_root/fleetfix"
echo "$venv/bin/fleetfix"
