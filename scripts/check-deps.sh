#!/usr/bin/env bash
# What would the newest (or the oldest allowed) versions of our dependencies break? Builds a throwaway venv
# resolved from pyproject.toml's ranges, not from the lock, and runs the unit suite in it. For whoever
# refreshes the lock (docs/dependencies.md); CI keeps testing the lock, so someone else's release day never
# turns CI red.
#
#   scripts/check-deps.sh                 newest versions the ranges allow
#   scripts/check-deps.sh --lowest        the lowest version of each direct dependency the ranges allow
#   scripts/check-deps.sh ... -- ARGS     ARGS go to pytest instead of `tests/unit -q`
#
# Prints the versions that differ from requirements/dev.txt, then pytest's verdict; exits with pytest's code.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo_root"
resolution=highest
pytest_args=(tests/unit -q)
while [ $# -gt 0 ]; do
    case "$1" in
        --lowest) resolution=lowest-direct ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "scripts/check-deps.sh: unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=scripts/_uv.sh
. scripts/_uv.sh
work="$(mktemp -d)"
trap 'rm -rf "$work" ${_uv_tools:+"$_uv_tools"}' EXIT
"$uv_bin" pip compile --quiet --universal --python-version 3.11 --resolution "$resolution" --no-header \
    pyproject.toml requirements/build.in --extra dev -o "$work/resolved.txt"
echo "== $resolution versions that differ from requirements/dev.txt:"
pins() { grep -E '^[a-zA-Z0-9]' "$1" | sed 's/ .*//' | sort; }
changed="$(diff <(pins requirements/dev.txt) <(pins "$work/resolved.txt") | grep -E '^[<>]' || true)"
echo "${changed:-(none)}"
"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$work/resolved.txt"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --editable .
"$work/venv/bin/python" -m pytest -p no:cacheprovider "${pytest_args[@]}"
