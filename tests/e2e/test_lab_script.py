"""`scripts/lab.sh` as a new user drives it (README, docs/quickstart.md): up, status, env, a probe through the
inventory it wrote (its containers and its VM: the real QEMU guest where QEMU can run here), down; and down
leaves nothing behind, QEMU included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lab import qemuvm
from tests.lab.cli import VM_KINDS, VM_REAL, VM_STAND_IN, prerequisite_problems

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "lab.sh"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def lab_sh(lab_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETFIX_LAB_DIR": str(lab_dir), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


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


def running_line(printed: str) -> str:
    return next(line for line in printed.splitlines() if line.startswith("fleetfix lab running"))


def fleetfix_in_lab(exports: str, command: str) -> subprocess.CompletedProcess[str]:
    """A fleetfix command line as the user types it, after `eval "$(scripts/lab.sh env)"`."""
    return subprocess.run(["bash", "-c", f"{exports}\n{sys.executable} -m fleetfix {command}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(900)
def test_up_status_env_probe_down(tmp_path: Path) -> None:
    problems = prerequisite_problems(healthy=False)
    if problems:
        pytest.skip("the lab cannot start here: " + "; ".join(problems))
    vm_kind = VM_REAL if qemuvm.unavailable_reason() is None else VM_STAND_IN
    lab_dir = tmp_path / "lab"
    try:
        up = lab_sh(lab_dir, "up", "--no-healthy", timeout=900)  # a first real VM also builds its image
        assert up.returncode == 0, up.stdout + up.stderr
        assert "CT 200 train-a (problem)" in up.stdout and "Stop it: scripts/lab.sh down" in up.stdout
        assert f"VM 300 gpu-vm (problem; {VM_KINDS[vm_kind]})" in up.stdout
        if vm_kind == VM_REAL:
            assert any("qemu-system-x86_64" in argv for argv in lab_processes(lab_dir))

        again = lab_sh(lab_dir, "up", "--no-healthy")  # idempotent: describes the running lab
        assert again.returncode == 0 and running_line(up.stdout) == running_line(again.stdout)

        status = lab_sh(lab_dir, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "checks: sshd up, apt repo up, VM 300 guest agent up" in status.stdout

        exports = lab_sh(lab_dir, "env")
        assert exports.returncode == 0
        probe = fleetfix_in_lab(exports.stdout, 'probe -i "$LAB_INVENTORY" --json')
        assert probe.returncode == 3, probe.stdout + probe.stderr  # the problem guests: findings
        reports = {target["target"]: target for target in json.loads(probe.stdout)["targets"]}
        assert set(reports) == {"train-a", "train-b", "gpu-vm"}
        vm = reports["gpu-vm"]
        assert (vm["guest"], vm["vmid"], vm["status"]) == ("vm", 300, "ok")
        for report in reports.values():
            codes = {finding["code"] for finding in report["findings"]}
            assert {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"} <= codes, report["target"]

        # The VM's cuda_repo_base in the inventory is the mirror as the VM reaches it (the real VM: through
        # QEMU's user network), so the playbooks' apt there finds it.
        inventory = yaml.safe_load(Path(lab_dir / "inventory.yaml").read_text())
        [entry] = inventory["nodes"][0]["vms"]
        base = entry.get("vars", {}).get("cuda_repo_base") or inventory["defaults"]["vars"]["cuda_repo_base"]
        assert (qemuvm.GUEST_FORWARD_ADDRESS in base) == (vm_kind == VM_REAL)
        fetch = ("import sys, urllib.request; "
                 "print(urllib.request.urlopen(sys.argv[1] + '/debian12/x86_64/Release').status)")
        fetched = fleetfix_in_lab(exports.stdout, f'exec -i "$LAB_INVENTORY" --limit gpu-vm -- '
                                                  f'python3 -c "{fetch}" {base}')
        assert fetched.returncode == 0 and "200" in fetched.stdout, fetched.stdout + fetched.stderr
    finally:
        down = lab_sh(lab_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not lab_dir.exists()
    assert lab_processes(lab_dir) == []
    stopped = lab_sh(lab_dir, "status")
    assert stopped.returncode == 3 and "no lab running" in stopped.stdout
