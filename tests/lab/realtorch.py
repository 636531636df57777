"""A real CUDA build of torch for the test bed: a venv on this machine, visible in every container.

Containers are overlays of this machine's ``/`` (see container.py), and ``/opt`` is not hidden, so a venv
created here under ``/opt`` is importable inside every container at the same path with no copying. Writes a
container makes to it land in that container's upper dir only (copy-up), so the shared venv stays clean.

The venv is several GB and takes about a minute to install from this machine's local package index, so it
is built once per machine and version and reused across test sessions: ``/opt/fleetfix-torch-<version>``
(override the parent with ``$FLEETFIX_REAL_TORCH_ROOT``). A marker file written last tells a complete venv
from one a killed build left half done (which is removed and rebuilt), and an flock serialises concurrent
test sessions that want the same venv.

It is created with Debian's ``/usr/bin/python3``, the interpreter containers have; never with a pyenv or
other interpreter that lives outside the container's view.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.lab.locks import file_lock

REAL_TORCH_VERSION = "2.14.1"
REAL_TORCH_CUDA = "13.0"
ROOT_ENV = "FLEETFIX_REAL_TORCH_ROOT"
CACHE_ENV = "FLEETFIX_TEST_CACHE"
BASE_PYTHON = Path("/usr/bin/python3")
# Build requirements of CUDA extensions that `pip install --no-build-isolation` takes from the env itself.
BUILD_REQUIREMENTS = ("setuptools", "wheel", "ninja", "packaging")
_MARKER = ".fleetfix-complete"


class RealTorchError(RuntimeError):
    """The real torch venv could not be created (pip failed, no local wheel, no venv module)."""


@dataclass(frozen=True)
class RealTorch:
    venv: Path
    version: str
    cuda: str
    build_seconds: float  # how long the build that produced this venv took (recorded in the marker)
    from_cache: bool

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def cache_root() -> Path:
    """Downloads and built repos kept across sessions ($FLEETFIX_TEST_CACHE, default /opt/fleetfix-test-cache:
    under /opt, so containers see wheel directories at the same path)."""
    root = Path(os.environ.get(CACHE_ENV) or "/opt/fleetfix-test-cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or "/opt")


def venv_path(version: str = REAL_TORCH_VERSION, root: Path | None = None) -> Path:
    return (root or default_root()) / f"fleetfix-torch-{version}"


def _run(argv: list[str], *, timeout: float) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise RealTorchError(f"{' '.join(argv)} failed ({done.returncode}):\n" + "\n".join(tail))


def ensure_real_torch(
    version: str = REAL_TORCH_VERSION, *, root: Path | None = None, timeout: float = 1800
) -> RealTorch:
    """The venv with torch==VERSION (+ extension build requirements), built now if this machine lacks it."""
    venv = venv_path(version, root)
    marker = venv / _MARKER
    with file_lock(venv.parent / f".{venv.name}.lock"):
        if marker.is_file():
            return RealTorch(venv, version, REAL_TORCH_CUDA, float(marker.read_text() or 0), True)
        shutil.rmtree(venv, ignore_errors=True)  # a build that was killed half way
        started = time.monotonic()
        _run([str(BASE_PYTHON), "-m", "venv", str(venv)], timeout=300)
        python = str(venv / "bin" / "python")
        _run([python, "-m", "pip", "install", "--quiet", f"torch=={version}", *BUILD_REQUIREMENTS],
             timeout=timeout)
        probe = subprocess.run(
            [python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
            capture_output=True, text=True, timeout=300,
        )
        reported = probe.stdout.split()
        if probe.returncode != 0 or len(reported) != 2 or not reported[0].startswith(version):
            raise RealTorchError(f"{python}: torch does not import as {version}: "
                                 f"{probe.stdout}{probe.stderr}")
        elapsed = time.monotonic() - started
        marker.write_text(f"{elapsed:.1f}")
        return RealTorch(venv, version, reported[1], elapsed, False)
