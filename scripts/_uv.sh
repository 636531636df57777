# Sourced by scripts/lock.sh and scripts/check-deps.sh: sets uv_bin to uv from PATH, else to a uv installed
# into a throwaway venv that is removed when the calling script exits.
uv_bin="$(command -v uv || true)"
if [ -z "$uv_bin" ]; then
    _uv_tools="$(mktemp -d)"
    trap 'rm -rf "$_uv_tools"' EXIT
    "${PYTHON:-python3}" -m venv "$_uv_tools/venv"
    "$_uv_tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check uv
    uv_bin="$_uv_tools/venv/bin/uv"
fi
