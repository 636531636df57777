"""The fleet's wheel lock: pins read with their file:line, and every mistake one line naming file, line and
field (exit 2 through the CLI, before anything is fetched)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetfix.errors import ConfigError
from fleetfix.wheels.lock import load_wheel_lock

REPO = Path(__file__).resolve().parents[2]
HEX = "4f" * 32
URL = ("https://github.com/Dao-AILab/causal-conv1d/releases/download/v1.6.1/"
       "causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl")
GOOD = f"""\
# committed next to the inventory
wheels:
  causal-conv1d:
    {URL}: sha256:{HEX}
    http://mirror.internal/gh/causal_conv1d-1.6.1-cp312-cp312-linux_x86_64.whl: {HEX.upper()}
  Mamba_SSM: {{}}
  fleetfix-tiny-ext:
    https://sdists.internal/fleetfix_tiny_ext-0.1.0.tar.gz: {HEX}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wheels.lock"
    path.write_text(text)
    return path


def test_pins_are_read_with_where_they_are(tmp_path: Path) -> None:
    lock = load_wheel_lock(write(tmp_path, GOOD))
    assert len(lock) == 3
    pin = lock.pin(URL)
    assert pin is not None and (pin.sha256, pin.where) == (HEX, f"{tmp_path}/wheels.lock:4")
    mirror = lock.pin("http://mirror.internal/gh/causal_conv1d-1.6.1-cp312-cp312-linux_x86_64.whl")
    assert mirror is not None and mirror.sha256 == HEX  # bare hex, any case, as sha256sum prints it
    assert lock.pin(URL.replace("v1.6.1", "v1.6.2")) is None
    sdist = lock.pin("https://sdists.internal/fleetfix_tiny_ext-0.1.0.tar.gz")  # an item's source
    assert sdist is not None and sdist.where == f"{tmp_path}/wheels.lock:8"
    assert len(load_wheel_lock(write(tmp_path, "wheels:\n"))) == 0


@pytest.mark.parametrize(("text", "line", "field", "message"), [
    (f"wheels:\n  causal-conv1d:\n    {URL}: sha256:{HEX[:-1]}\n", 3, f"wheels.causal-conv1d.{URL}",
     "expected sha256:<64 hex digits>"),
    (f"wheels:\n  causal-conv1d:\n    {URL}: md5:{HEX}\n", 3, f"wheels.causal-conv1d.{URL}",
     "expected sha256:"),
    (f"wheels:\n  causal-conv1d:\n    {URL}: 12\n", 3, f"wheels.causal-conv1d.{URL}", "got '12'"),
    (f"wheels:\n  mamba-ssm:\n    {URL}: {HEX}\n", 3, f"wheels.mamba-ssm.{URL}",
     "the file is causal-conv1d's, not mamba-ssm's"),
    (f"wheels:\n  causal-conv1d:\n    ftp://x/causal_conv1d-1.whl: {HEX}\n", 3,
     "wheels.causal-conv1d.ftp://x/causal_conv1d-1.whl", "expected the http(s) URL of a .whl file"),
    (f"wheels:\n  causal-conv1d:\n    {URL}?x=1: {HEX}\n", 3, f"wheels.causal-conv1d.{URL}?x=1",
     "expected the http(s) URL"),
    (f"wheels:\n  causal-conv1d:\n    {URL}: {HEX}\n    {URL}: {HEX}\n", 4, f"wheels.causal-conv1d.{URL}",
     "duplicate key"),
    (f"wheels:\n  causal-conv1d:\n    {URL}: {HEX}\n  causal_conv1d:\n    {URL}: {HEX}\n", 5,
     f"wheels.causal_conv1d.{URL}", "this URL is pinned already, at"),
    ("wheels:\n  causal-conv1d: sha256:abc\n", 2, "wheels.causal-conv1d", "expected a mapping of URL"),
    ("wheels: [a]\n", 1, "wheels", "expected a mapping of distribution name"),
    (f"wheels:\n  mamba-ssm:\n    https://x/causal-conv1d-1.6.1.tar.gz: {HEX}\n", 3,
     "wheels.mamba-ssm.https://x/causal-conv1d-1.6.1.tar.gz", "the file is causal-conv1d's, not mamba-ssm's"),
    (f"wheels:\n  causal-conv1d:\n    https://x/causal-conv1d.tar.bz2: {HEX}\n", 3,
     "wheels.causal-conv1d.https://x/causal-conv1d.tar.bz2", "or an sdist (.tar.gz, .zip)"),
    ("pins: {}\n", 1, None, "a wheel lock is a mapping with one key, wheels"),
])
def test_a_bad_lock_is_one_line_naming_file_line_and_field(tmp_path: Path, text: str, line: int,
                                                           field: str | None, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_wheel_lock(path)
    assert (error.value.path, error.value.line, error.value.field) == (str(path), line, field)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_cli_refuses_a_bad_lock_before_any_step(tmp_path: Path) -> None:
    lock = write(tmp_path, f"wheels:\n  causal-conv1d:\n    {URL}: sha256:nothex\n")
    playbook = tmp_path / "p.yaml"
    marker = tmp_path / "ran"
    playbook.write_text(f"name: p\nsteps:\n- name: s\n  check: 'false'\n  apply: touch {marker}\n")
    done = subprocess.run([sys.executable, "-m", "fleetfix", "apply", str(playbook), "--local", "--state-dir",
                           str(tmp_path / "state"), "--wheel-lock", str(lock)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fleetfix: error: {lock}:3: wheels.causal-conv1d.{URL}: expected sha256:"), line
    assert not marker.exists()
