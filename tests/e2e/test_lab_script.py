"""`scripts/lab.sh` as a new user drives it (README, docs/quickstart.md): up, status, env, a probe through the
inventory it wrote, down; and down leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.cli import prerequisite_problems

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "lab.sh"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def lab_sh(lab_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETFIX_LAB_DIR": str(lab_dir), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def lab_processes(lab_dir: Path) -> list[str]:
    """Command lines of live processes that mention the lab directory (its serve process, sshd, CTs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(lab_dir) in argv:
                found.append(argv)
    return found


@pytest.mark.timeout(600)
def test_up_status_env_probe_down(tmp_path: Path) -> None:
    problems = prerequisite_problems(healthy=False)
    if problems:
        pytest.skip("the lab cannot start here: " + "; ".join(problems))
    lab_dir = tmp_path / "lab"
    try:
        up = lab_sh(lab_dir, "up", "--no-healthy")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "CT 200 train-a (problem)" in up.stdout and "Stop it: scripts/lab.sh down" in up.stdout

        again = lab_sh(lab_dir, "up", "--no-healthy")  # idempotent: describes the running lab
        assert again.returncode == 0 and up.stdout.splitlines()[0] == again.stdout.splitlines()[0]

        status = lab_sh(lab_dir, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "checks: sshd up, apt repo up" in status.stdout

        exports = lab_sh(lab_dir, "env")
        assert exports.returncode == 0
        probe_command = f'{sys.executable} -m fleetfix probe -i "$LAB_INVENTORY" --json'
        probe = subprocess.run(
            ["bash", "-c", f"{exports.stdout}\n{probe_command}"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )
        assert probe.returncode == 3, probe.stdout + probe.stderr  # the problem containers: findings
        assert '"CUDA_RUNTIME_WITHOUT_TOOLKIT"' in probe.stdout
    finally:
        down = lab_sh(lab_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not lab_dir.exists()
    assert lab_processes(lab_dir) == []
    stopped = lab_sh(lab_dir, "status")
    assert stopped.returncode == 3 and "no lab running" in stopped.stdout
