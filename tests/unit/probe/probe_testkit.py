"""Helpers for the probe tests: run the real probe.sh under a real shell, load recorded fixtures.

(A uniquely named module, not conftest.py, so `from probe_testkit import ...` cannot pick up
another directory's conftest.)
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fleetfix.probe import Facts, parse_facts
from fleetfix.probe.script import build_probe_script
from tests.lab.aptrepo import CudaRelease

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"
PCT_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"   # what `pct exec` forces
# Every external command probe.sh may call besides python, nvidia-smi and dpkg tooling.
BASIC_TOOLS = ("sh", "dash", "cat", "sed", "tr", "grep", "ls", "df", "uname", "readlink", "timeout",
               "nproc", "getconf")


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def facts_of(data: dict[str, Any]) -> Facts:
    return parse_facts(json.dumps(data))


def edited(name: str, edit: Callable[[dict[str, Any]], None]) -> Facts:
    """A recorded fixture with one change applied: the way each rule test states its case."""
    data = copy.deepcopy(load_fixture(name))
    edit(data)
    return facts_of(data)


def run_probe(
    script: str | None = None, *, shell: str = "dash", path: str | None = None,
    root: Path | None = None, env: dict[str, str] | None = None, hermetic: bool = False,
    timeout: float = 60, cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run probe.sh the way a transport does: `SHELL -s` with the script on stdin."""
    full_env = {"PATH": path or os.environ["PATH"], "HOME": "/root"}
    if root is not None:
        full_env["FLEETFIX_PROBE_ROOT"] = str(root)
    if hermetic:
        full_env["FLEETFIX_PROBE_EXTRA_PATH"] = ""
    full_env.update(env or {})
    return subprocess.run(
        [shell, "-s"], input=script if script is not None else build_probe_script(),
        capture_output=True, text=True, env=full_env, timeout=timeout, check=False, cwd=cwd,
    )


def probe_facts(*args: Any, **kwargs: Any) -> Facts:
    done = run_probe(*args, **kwargs)
    assert done.returncode == 0, done.stderr
    return parse_facts(done.stdout)


class FakeBin:
    """A directory to use as the whole PATH: real basic tools as symlinks, plus fake commands."""

    def __init__(self, path: Path, tools: Iterable[str] = BASIC_TOOLS) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        for tool in tools:
            real = shutil.which(tool, path=PCT_PATH)
            if real:
                (path / tool).symlink_to(real)

    def script(self, name: str, body: str) -> Path:
        target = self.path / name
        target.write_text("#!/bin/sh\n" + body)
        target.chmod(0o755)
        return target

    def link(self, name: str, real: str) -> None:
        (self.path / name).symlink_to(real)


def write(root: Path, relative: str, text: str | bytes, mode: int | None = None) -> Path:
    target = root / relative.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        target.write_bytes(text)
    else:
        target.write_text(text)
    if mode is not None:
        target.chmod(mode)
    return target


def fake_nvcc(root: Path, relative: str, version: str, release: str) -> Path:
    """An nvcc that prints the real banner: the test bed's stand-in banner code, which
    tests/e2e/test_standin_ground_truth.py holds to the real nvcc 13.0 and NVIDIA's 12.x ptxas."""
    banner = CudaRelease(version, release).nvcc_banner()
    return write(root, relative, f"#!/bin/sh\ncat <<'EOF'\n{banner}EOF\n", mode=0o755)
