"""A real QEMU VM (tests/lab/qemuvm.py): Debian's cloud kernel under TCG, Debian's qemu-guest-agent, and
the node's `qm` talking to that agent as qemu-server does (guest-sync-delimited, 5 s per command, 1 s
polls). fleetfix probes it, fixes it with cuda-toolkit.yaml (twice: the second changes nothing), meets
the agent's own limits as a user would, and rolls a failed apply back to a qcow2 snapshot. Opt-in: the
real build of the tiny extension inside a second VM (FLEETFIX_REAL_VM_BUILD=1).

One VM boots per module (what a boot and each test cost: docs/testbed.md "Real guests"); each test leaves
it running, with its agent up.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import in_ci
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.e2e.test_real_lxc import failed_steps
from tests.lab import qemuvm
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.cli import TINY_EXTENSION_IN_CT, add_tiny_extension_source
from tests.lab.qemuvm import QemuVM, create_qemu_vm

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
    assert applied.exit_code == 0, failed_steps(applied)
    [target] = applied.json()["targets"]
    assert target["status"] == "changed"
    print(f"cuda-toolkit.yaml on the real VM: {time.monotonic() - started:.0f} s")
    nvcc = real_vm.sh("/usr/local/cuda-12.8/bin/nvcc --version", check=False).stdout.decode()
    assert "release 12.8, V12.8.93" in nvcc

    again = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json", timeout=1200)
    assert again.exit_code == 0, failed_steps(again)
    [rerun] = again.json()["targets"]
    assert (rerun["status"], rerun["counts"]["changed"]) == ("ok", 0)
    reprobed = run_cli("probe", *targets, "--json", timeout=600).json()["targets"][0]
    assert not TOOLKIT_CODES & findings(reprobed)


# ----------------------------------------------------------------------------------------------------------
# The agent's own limits, as users meet them
# ----------------------------------------------------------------------------------------------------------
def guest_exec_calls(lab: Lab, since: int) -> list[list[str]]:
    return [argv for argv in lab.node().qm_calls()[since:] if argv[:2] == ["guest", "exec"]]


def test_one_mib_of_stdin_reaches_the_agent_and_one_byte_more_is_refused_by_qm(
    lab: Lab, real_vm: QemuVM,
) -> None:
    data = os.urandom(1024 * 1024)
    done = lab.ssh(None, ["qm", "guest", "exec", str(VMID), "--pass-stdin", "1", "--", "sha256sum"],
                   input=data, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["out-data"] == f"{hashlib.sha256(data).hexdigest()}  -\n"
    refused = lab.ssh(None, ["qm", "guest", "exec", str(VMID), "--pass-stdin", "1", "--", "sha256sum"],
                      input=data + b"x", timeout=120)
    assert (refused.returncode, refused.stdout) == (255, b"")
    assert refused.stderr == b"'input-data' (STDIN) is limited to 1 MiB, aborting\n"


def test_qm_returns_a_pid_at_its_timeout_and_exec_status_follows_the_command(
    lab: Lab, real_vm: QemuVM,
) -> None:
    status, answer, stderr = qm(lab, "guest", "exec", str(VMID), "--timeout", "1", "--",
                                "sh", "-c", "sleep 3; echo finished")
    assert (status, stderr, set(answer)) == (0, "timeout reached, returning pid\n", {"pid"})
    deadline = time.monotonic() + 120
    while True:
        status, polled, _ = qm(lab, "guest", "exec-status", str(VMID), str(answer["pid"]))
        assert status == 0
        if polled["exited"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (polled["exited"], polled["exitcode"], polled["out-data"]) == (1, 0, "finished\n")


def test_a_command_longer_than_qms_default_wait_completes_through_fleetfix(
    lab: Lab, real_vm: QemuVM,
) -> None:
    # qm's own wait is 30 s by default; a long build would come back as a bare pid. fleetfix gives qm its
    # own limit (0: none) so qm keeps polling the agent until the command ends. The bed's qm takes its
    # default from a knob (tests/lab/qm.py DEFAULT_TIMEOUT_FILE): 3 s here, so a 6 s command outlasts it
    # without 30 s of sleep. First shown: qm left to its default gives up at the knob's 3 s.
    knob = lab.node().state.dir / "qm-default-timeout"
    knob.write_text("3")
    try:
        status, answer, stderr = qm(lab, "guest", "exec", str(VMID), "--", "sh", "-c", "sleep 6; echo built")
        assert (status, stderr, set(answer)) == (0, "timeout reached, returning pid\n", {"pid"})
        since = len(lab.node().qm_calls())
        result = run_cli("exec", *vm_args(lab, VMID), "--json", "--", "sh", "-c", "sleep 6; echo built",
                         timeout=300)
    finally:
        knob.unlink()
    assert result.exit_code == 0, result.stdout + result.stderr
    [record] = result.json()
    assert (record["exit_code"], record["stdout"]) == (0, "built\n")
    [call] = guest_exec_calls(lab, since)
    assert call[call.index("--timeout") + 1] == "0"


def test_an_agent_restart_mid_command_is_a_clear_per_target_error(lab: Lab, real_vm: QemuVM) -> None:
    # The command restarts the agent under it (as `systemctl restart qemu-guest-agent` would); the new
    # agent answers, but no longer knows the pid qm is polling.
    result = run_cli("exec", *vm_args(lab, VMID), "--", "sh", "-c", "kill $(pidof qemu-ga); sleep 2",
                     timeout=300)
    assert result.exit_code == 4, result.stdout + result.stderr
    assert f"VM {VMID} on {lab.node().address}: the QEMU guest agent" in result.stdout
    assert "result is lost" in result.stdout and "Traceback" not in result.stderr
    real_vm.wait_for_agent(180)  # Restart=always: the agent is back


def test_a_reboot_mid_command_is_a_clear_per_target_error_and_the_vm_comes_back(
    lab: Lab, real_vm: QemuVM,
) -> None:
    reset = threading.Timer(8.0, lambda: real_vm.qmp("system_reset"))
    reset.start()
    started = time.monotonic()
    try:
        result = run_cli("exec", *vm_args(lab, VMID), "--", "sh", "-c", "sleep 60; echo never", timeout=300)
    finally:
        reset.join()
    print(f"fleetfix exec ended {time.monotonic() - started:.0f} s after it started (reset at 8 s)")
    assert result.exit_code == 4, result.stdout + result.stderr
    assert f"VM {VMID} on {lab.node().address}: the QEMU guest agent" in result.stdout
    assert "result is lost" in result.stdout and "never" not in result.stdout
    print(f"agent back after {real_vm.wait_for_agent(300):.0f} s more")
    status, answer, _ = qm(lab, "guest", "exec", str(VMID), "--", "cat", "/proc/uptime")
    assert status == 0 and float(answer["out-data"].split()[0]) < 300  # a fresh boot


# ----------------------------------------------------------------------------------------------------------
# Snapshots: internal qcow2 snapshots, taken and rolled back as qemu-server does (qemuvm.py snapshot_disk)
# ----------------------------------------------------------------------------------------------------------
# Step 1 changes a file; step 2 changes more and then fails its verify: a half-applied VM.
HALF_APPLIED = """\
name: half-applied
steps:
  - name: write marker
    check: test -f /etc/fleetfix-marker
    apply: echo changed > /etc/fleetfix-marker
  - name: break things
    check: test -f /etc/fleetfix-second
    apply: echo changed > /etc/fleetfix-second && rm /etc/debian_version
    verify: echo "verify says no" >&2; exit 1
"""


def guest_sh(lab: Lab, script: str) -> str:
    """A script's stdout, run by the VM's real agent through the node's `qm guest exec`."""
    status, answer, stderr = qm(lab, "guest", "exec", str(VMID), "--", "sh", "-c", script)
    assert status == 0 and answer["exited"] == 1, stderr
    return str(answer.get("out-data", ""))


def uptime(lab: Lab) -> float:
    return float(guest_sh(lab, "cat /proc/uptime").split()[0])


def test_a_failed_apply_rolls_the_real_vm_back_to_its_disk_snapshot(
    lab: Lab, real_vm: QemuVM, tmp_path: Path,
) -> None:
    real_vm.write_file("/etc/lab-state", "before\n")
    booted_before = time.time() - uptime(lab)
    book = tmp_path / "half-applied.yaml"
    book.write_text(HALF_APPLIED)
    since = len(lab.node().qm_calls())
    started = time.monotonic()
    result = run_cli("apply", str(book), *vm_args(lab, VMID), "--state-dir", str(tmp_path / "state"),
                     "--snapshot", "--rollback-on-failure", "--json", timeout=900)
    print(f"apply with snapshot and rollback on the real VM: {time.monotonic() - started:.0f} s")
    assert result.exit_code == 1, result.stdout + result.stderr
    [target] = result.json()["targets"]
    name = target["snapshot"]["name"]
    assert target["snapshot"]["rolled_back"] is True, target["snapshot"]
    made = [argv for argv in lab.node().qm_calls()[since:] if argv[0] != "guest"]
    assert [argv[0] for argv in made] == ["status", "snapshot", "rollback"]
    assert made[-1][1:] == [str(VMID), name, "--start", "1"]
    # An internal snapshot in the VM's own qcow2, disk only (no RAM state: fleetfix passes no --vmstate).
    assert real_vm.disk_snapshots()[name] == 0

    # Inside the guest, through the real agent: the change is gone, the state before it is there, and the
    # VM was booted again (rollback stops it; --start 1 starts it).
    assert real_vm.running
    seen = guest_sh(lab, "cat /etc/lab-state; for f in /etc/fleetfix-marker /etc/fleetfix-second; do "
                         "test -e $f && echo $f; done; cat /etc/debian_version")
    assert seen.startswith("before\n12.") and seen.count("\n") == 2, seen
    assert time.time() - uptime(lab) > booted_before + 1

    status, _, stderr = qm(lab, "delsnapshot", str(VMID), name)  # while running: QMP's delete
    assert status == 0, stderr
    assert name not in real_vm.disk_snapshots()


def test_qm_snapshot_with_vmstate_resumes_the_real_vm_where_it_was(lab: Lab, real_vm: QemuVM) -> None:
    # --vmstate 1 keeps the RAM: a file on tmpfs (RAM only) comes back, the disk's later change goes, and
    # the guest was not booted (its uptime went on).
    guest_sh(lab, "echo in-ram > /dev/shm/fleetfix-ram")
    before = uptime(lab)
    status, _, stderr = qm(lab, "snapshot", str(VMID), "withram", "--vmstate", "1")
    assert status == 0, stderr
    assert real_vm.disk_snapshots()["withram"] > 0
    guest_sh(lab, "rm /dev/shm/fleetfix-ram; echo later > /etc/fleetfix-later")

    status, _, stderr = qm(lab, "rollback", str(VMID), "withram")  # no --start: the RAM state starts it
    assert status == 0, stderr
    assert real_vm.running
    seen = guest_sh(lab, "cat /dev/shm/fleetfix-ram; test -e /etc/fleetfix-later || echo gone")
    assert seen == "in-ram\ngone\n"
    assert uptime(lab) >= before
    status, _, stderr = qm(lab, "delsnapshot", str(VMID), "withram")
    assert status == 0, stderr
    assert "withram" not in real_vm.disk_snapshots()


LARGE_OUTPUT_ENV = "FLEETFIX_REAL_VM_LARGE_OUTPUT"


@pytest.mark.skipif(os.environ.get(LARGE_OUTPUT_ENV) != "1",
                    reason=f"minutes of an emulated guest (docs/testbed.md); {LARGE_OUTPUT_ENV}=1 runs it")
def test_output_above_16_mib_is_an_error_never_short_facts(lab: Lab, real_vm: QemuVM) -> None:
    # qemu-ga keeps 16 MiB of a stream and flags the rest as truncated; its answer is then ~22 MB of
    # base64 through virtio-serial, which an emulated guest does not get across within qm's 5 s.
    result = run_cli("exec", *vm_args(lab, VMID), "--", "head", "-c", "17000000", "/dev/zero", timeout=900)
    assert result.exit_code != 0, result.stdout[-2000:] + result.stderr[-2000:]
    cut = "the QEMU guest agent cut the command's stdout at 16 MiB"
    slow = "the QEMU guest agent did not answer guest-exec-status within qm's 5 s"
    assert cut in result.stdout + result.stderr or slow in result.stdout, result.stdout + result.stderr
    real_vm.wait_for_agent(120)


# ----------------------------------------------------------------------------------------------------------
# build-extensions inside the real VM: opt-in (minutes of an emulated compiler; docs/testbed.md)
# ----------------------------------------------------------------------------------------------------------
BUILD_ENV = "FLEETFIX_REAL_VM_BUILD"
BUILD_VMID = 391
TINY_EXTENSION = f"{TINY_EXTENSION_IN_CT}=fleetfix_tiny_cuda+fleetfix_tiny"


@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get(BUILD_ENV) != "1",
                    reason=f"many minutes of an emulated compiler (docs/testbed.md); {BUILD_ENV}=1 runs it")
def test_build_extensions_compiles_the_tiny_extension_inside_the_real_vm(lab: Lab, tmp_path: Path) -> None:
    # The guest gets this machine's real torch 2.14.1+cu130, nvcc 13.0 and g++ 12 from a second, read-only
    # virtio disk (qemuvm.ensure_tools_disk), laid over its /usr and the venv with overlayfs; everything
    # else is the VM's own, and every command reaches it through the real agent.
    problem = qemuvm.unavailable_reason() or qemuvm.tools_unavailable_reason()
    if problem is not None:
        pytest.skip(problem)
    started = time.monotonic()
    tools = qemuvm.ensure_tools_disk()
    print(f"tools disk: {time.monotonic() - started:.0f} s")
    machine = create_qemu_vm(lab.node().state, BUILD_VMID, name="build-vm", memory=4096, disks=(tools,))
    try:
        machine.start()
        machine.exec(["/bin/sh", "-c", qemuvm.tools_mount_script()], check=True)
        add_tiny_extension_source(machine)
        targets = vm_args(lab, BUILD_VMID)

        started = time.monotonic()
        probed = run_cli("probe", *targets, "--json", timeout=1800)
        print(f"probe: {time.monotonic() - started:.0f} s")
        [report] = probed.json()["targets"]
        torch = report["facts"]["torch"]
        assert (torch["version"], torch["cuda"]) == ("2.14.1+cu130", "13.0"), torch
        assert torch["interpreter"].startswith(f"{qemuvm.TOOLS_TORCH_VENV}/bin/python"), torch

        started = time.monotonic()
        built = run_cli("apply", "playbooks/build-extensions.yaml", *targets,
                        "--var", f"extensions={TINY_EXTENSION}", "--var", "pip_args=--no-index",
                        "--var", "cuda_arch_list=9.0",
                        "--state-dir", str(tmp_path / "state"), "--json", timeout=3000)
        print(f"build-extensions.yaml: {time.monotonic() - started:.0f} s")
        assert built.exit_code == 0, built.stdout[-3000:] + built.stderr[-3000:]
        assert built.json()["targets"][0]["status"] == "changed"
        check = "import torch, fleetfix_tiny_cuda, fleetfix_tiny; print(fleetfix_tiny_cuda.built_with_cuda())"
        imported = machine.exec([torch["interpreter"], "-c", check], timeout=900, check=True)
        assert imported.stdout.decode().split() == ["13000"]  # CUDART_VERSION: nvcc 13.0 built it
    finally:
        machine.destroy()
