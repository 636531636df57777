"""A real QEMU VM (tests/lab/qemuvm.py): Debian's cloud kernel under TCG, Debian's qemu-guest-agent, and
the node's `qm` talking to that agent as qemu-server does (guest-sync-delimited, 5 s per command, 1 s
polls). fleetfix probes it, fixes it with cuda-toolkit.yaml (twice: the second changes nothing), and meets
the agent's own limits as a user would.

One VM boots per module (a boot is ~15 s of an idle 2-core machine, minutes of a busy one); each test
leaves it running, with its agent up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import in_ci
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.lab import qemuvm
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.qemuvm import QemuVM

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}
VMID = 390


@pytest.fixture(scope="module")
def real_vm(lab: Lab, apt_repo: AptRepo) -> Iterator[QemuVM]:
    problem = qemuvm.unavailable_reason()
    if problem is not None:
        if in_ci():
            pytest.fail(f"CI=true and real QEMU VMs cannot run: {problem}", pytrace=False)
        pytest.skip(problem)
    machine = lab.add_qemu_vm(None, VMID, name="gpu-vm", forwards=(apt_repo.port,), setup=problem_case)
    assert isinstance(machine, QemuVM)
    try:
        yield machine
    finally:
        machine.destroy()


def vm_args(lab: Lab, vmid: int) -> list[str]:
    return [*host_args(lab), "--vm", str(vmid)]


def guest_repo(apt_repo: AptRepo) -> str:
    """The repository's URL as the VM reaches it: through the guestfwd relay, not 127.0.0.1."""
    return apt_repo.base_url.replace(f"{apt_repo.host}:", f"{qemuvm.GUEST_FORWARD_ADDRESS}:", 1)


def qm(lab: Lab, *args: str, timeout: float = 120) -> tuple[int, Any, str]:
    """`qm ARGS` on the node: (exit status, the JSON it printed or None, stderr)."""
    done = lab.ssh(None, ["qm", *args], timeout=timeout)
    out = done.stdout.decode()
    return done.returncode, (json.loads(out) if out.strip() else None), done.stderr.decode()


def findings(report: dict[str, Any]) -> set[str]:
    return {finding["code"] for finding in report["findings"]}


def test_qm_guest_exec_reaches_the_real_agent_in_a_real_kernel(lab: Lab, real_vm: QemuVM) -> None:
    status, answer, _ = qm(lab, "guest", "exec", str(VMID), "--", "cat", "/proc/version")
    assert status == 0 and answer["exited"] == 1 and answer["exitcode"] == 0
    # The guest's own kernel (Debian's cloud kernel), not this machine's.
    assert "cloud-amd64" in answer["out-data"]
    assert answer["out-data"] != Path("/proc/version").read_text()
    status, answer, _ = qm(lab, "guest", "exec", str(VMID), "--", "sh", "-c", "echo err >&2; exit 3")
    assert (answer["exitcode"], answer["err-data"], answer["exited"]) == (3, "err\n", 1)


def test_probe_then_cuda_toolkit_fixes_the_vm_and_a_second_apply_changes_nothing(
    lab: Lab, real_vm: QemuVM, apt_repo: AptRepo, tmp_path: Path,
) -> None:
    targets = vm_args(lab, VMID)
    probed = run_cli("probe", *targets, "--json", timeout=600)
    assert probed.exit_code == 3, probed.stdout + probed.stderr
    [report] = probed.json()["targets"]
    assert (report["guest"], report["vmid"], report["status"]) == ("vm", VMID, "ok")
    assert findings(report) >= TOOLKIT_CODES
    assert report["facts"]["torch"]["cuda"] == "12.8"

    state = ["--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={guest_repo(apt_repo)}"]
    started = time.monotonic()
    applied = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json", timeout=1200)
    assert applied.exit_code == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    [target] = applied.json()["targets"]
    assert target["status"] == "changed"
    print(f"cuda-toolkit.yaml on the real VM: {time.monotonic() - started:.0f} s")
    nvcc = real_vm.sh("/usr/local/cuda-12.8/bin/nvcc --version", check=False).stdout.decode()
    assert "release 12.8, V12.8.93" in nvcc

    again = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json", timeout=1200)
    assert again.exit_code == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [rerun] = again.json()["targets"]
    assert (rerun["status"], rerun["counts"]["changed"]) == ("ok", 0)
    reprobed = run_cli("probe", *targets, "--json", timeout=600).json()["targets"][0]
    assert not TOOLKIT_CODES & findings(reprobed)
