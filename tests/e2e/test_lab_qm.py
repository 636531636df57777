"""The test bed's VMs, proven with plain OpenSSH: sshd node -> `qm` stand-in -> guest agent in the VM.

These tests say what fleetfix's VM tests may rely on: `qm guest exec` as qemu-server implements it (the
JSON and its Perl format, --pass-stdin and its 1 MiB limit, qm's timeout returning the pid, its one-line
dies for a VM without agent, stopped or missing), the agent's semantics from QEMU's qga/commands.c (its own
environment, its process group, the 16 MiB output cap), and qm's snapshots, status, list and pvesh's VM
index (docs/findings.md "Proxmox VMs (qm)").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab import vm as vmlib
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.vm import VirtualMachine

MakeVm = Callable[..., VirtualMachine]
MakeCt = Callable[..., Container]


def qm(
    lab: Lab, *args: str, input: bytes = b"", node: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return lab.ssh(node, ["qm", *args], input=input)


def guest_exec(lab: Lab, vmid: int, *command: str, options: tuple[str, ...] = (), input: bytes = b""
               ) -> dict[str, Any]:
    """`qm guest exec` that succeeded as qm: its JSON (qm exits 0 whatever the command's exit code)."""
    result = qm(lab, "guest", "exec", str(vmid), *options, "--", *command, input=input)
    assert result.returncode == 0, result.stderr.decode()
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def out(answer: dict[str, Any]) -> bytes:
    """out-data as the command's bytes: qm prints each byte as the character of that number."""
    return str(answer.get("out-data", "")).encode("latin-1")


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


# --- qm guest exec --------------------------------------------------------------------------------------
def test_guest_exec_runs_in_the_vm_and_prints_qms_pretty_json(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm(name="gpu-vm", setup="echo 'inside the VM' > /etc/lab-marker")
    result = qm(lab, "guest", "exec", str(machine.vmid), "--", "sh", "-c", "cat /etc/lab-marker; hostname")
    assert result.returncode == 0, err(result)
    # to_json(pretty, canonical): keys sorted, three spaces, " : ", booleans turned into 1/0.
    assert result.stdout.decode() == (
        '{\n   "exitcode" : 0,\n   "exited" : 1,\n   "out-data" : "inside the VM\\ngpu-vm\\n",\n'
        '   "out-truncated" : 0\n}\n'
    )


@pytest.mark.parametrize("code", [0, 1, 7, 100, 254])
def test_the_commands_exit_code_is_in_the_json_and_qm_exits_0(lab: Lab, make_vm: MakeVm, code: int) -> None:
    machine = make_vm()
    answer = guest_exec(lab, machine.vmid, "sh", "-c", f"echo oops >&2; exit {code}")
    assert (answer["exitcode"], answer["exited"], answer["err-data"]) == (code, 1, "oops\n")


def test_a_command_killed_by_a_signal_reports_the_signal(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    answer = guest_exec(lab, machine.vmid, "sh", "-c", "kill -TERM $$")
    assert (answer.get("signal"), "exitcode" in answer) == (15, False)


def test_bytes_arrive_as_characters_of_their_number(lab: Lab, make_vm: MakeVm) -> None:
    # A Perl byte string through a UTF-8 JSON encoder: é (C3 A9) is printed as "Ã©" (C3 83 C2 A9).
    machine = make_vm()
    result = qm(lab, "guest", "exec", str(machine.vmid), "--", "printf", "\\303\\251")
    assert b'"out-data" : "\xc3\x83\xc2\xa9"' in result.stdout
    assert out(json.loads(result.stdout)) == "é".encode()


def test_pass_stdin_takes_one_mebibyte_verbatim_and_not_a_byte_more(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    data = os.urandom(1 << 20)
    answer = guest_exec(lab, machine.vmid, "sha256sum", options=("--pass-stdin", "1"), input=data)
    assert out(answer).split()[0].decode() == hashlib.sha256(data).hexdigest()
    vmid = str(machine.vmid)
    too_much = qm(lab, "guest", "exec", vmid, "--pass-stdin", "1", "--", "cat", input=data + b"x")
    assert (too_much.returncode, err(too_much)) == (
        255, "'input-data' (STDIN) is limited to 1 MiB, aborting\n")


def test_without_pass_stdin_the_command_reads_dev_null(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    answer = guest_exec(lab, machine.vmid, "sh", "-c", "cat; readlink /proc/self/fd/0", input=b"not passed")
    assert out(answer) == b"/dev/null\n"


def test_the_agents_environment_not_the_callers_and_root(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    result = lab.ssh(None, f"FOO=bar LANG=C.UTF-8 qm guest exec {machine.vmid} -- sh -c 'id -u; env'")
    lines = out(json.loads(result.stdout)).decode().splitlines()
    assert lines[0] == "0"
    env = dict(line.split("=", 1) for line in lines[1:])
    assert "FOO" not in env and "LANG" not in env and "HOME" not in env
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_commands_run_in_the_agents_process_group_so_kill_0_kills_the_agent(
    lab: Lab, make_vm: MakeVm,
) -> None:
    # qga's guest_exec_task_setup does no setsid/setpgid: a command's `kill 0` reaches qemu-ga itself.
    # That is why fleetfix's watchdog in a VM runs under setsid.
    machine = make_vm()
    script = "ps -o pgid= -p $$; pgrep -f '^/usr/bin/python3 -I -S /usr/sbin/qemu-ga$'"
    command_group, agent = out(guest_exec(lab, machine.vmid, "sh", "-c", script)).split()
    assert command_group == agent  # the agent leads its group (systemd's setsid); the command is in it
    in_own_session = guest_exec(lab, machine.vmid, "setsid", "sh", "-c", "kill -KILL 0")
    assert in_own_session.get("signal") == 9 and machine.agent_running()
    # Without it the agent dies with the command (before or after answering: qm fails either way)...
    killed = qm(lab, "guest", "exec", str(machine.vmid), "--", "sh", "-c", "kill -KILL 0")
    assert (killed.returncode, killed.stdout) == (255, b"")
    # ... and the VM takes no more commands.
    after = qm(lab, "guest", "exec", str(machine.vmid), "--", "true")
    assert (after.returncode, err(after)) == (255, "QEMU guest agent is not running\n")


def test_qms_timeout_returns_the_pid_and_the_command_runs_on(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    result = qm(lab, "guest", "exec", str(machine.vmid), "--timeout", "1", "--", "sleep", "1234")
    assert result.returncode == 0 and err(result) == "timeout reached, returning pid\n"
    pid = json.loads(result.stdout)["pid"]
    assert machine.exec(["pgrep", "-f", "^sleep 1234$"]).stdout.decode().split() == [str(pid)]
    status = qm(lab, "guest", "exec-status", str(machine.vmid), str(pid))
    assert json.loads(status.stdout) == {"exited": 0}
    refused = qm(lab, "guest", "exec", str(machine.vmid), "--synchronous", "0", "--timeout", "5", "--",
                 "true")
    assert refused.returncode == 255 and "synchronous: needs to be set for 'timeout'" in err(refused)


def test_output_is_cut_at_16_mib_and_flagged(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    answer = guest_exec(lab, machine.vmid, "sh", "-c", "head -c 17000000 /dev/zero | tr '\\0' y")
    assert (len(out(answer)), answer["out-truncated"], answer["exitcode"]) == (16 * 1024 * 1024, 1, 0)


def test_no_agent_stopped_missing_and_empty_fail_like_qm(lab: Lab, make_vm: MakeVm) -> None:
    no_agent = make_vm(agent=False)
    not_installed = make_vm(agent_installed=False)
    disabled = make_vm(config={"agent": "0"})
    stopped = make_vm(running=False)
    expected = {
        no_agent.vmid: "No QEMU guest agent configured\n",
        not_installed.vmid: "QEMU guest agent is not running\n",
        disabled.vmid: "QEMU guest agent is not running\n",  # `agent: 0` is defined: the ping fails
        stopped.vmid: f"VM {stopped.vmid} is not running\n",
        999: "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n",
    }
    for vmid, message in expected.items():
        result = qm(lab, "guest", "exec", str(vmid), "--", "true")
        assert (result.returncode, result.stdout, err(result)) == (255, b"", message), vmid
    running = make_vm()
    empty = qm(lab, "guest", "exec", str(running.vmid))
    assert (empty.returncode, err(empty)) == (255, "command or input-data (or both) required\n")


def test_installing_the_agent_starts_it(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm(agent_installed=False)
    assert not machine.agent_running()
    machine.install_agent()
    assert guest_exec(lab, machine.vmid, "true")["exitcode"] == 0


# --- status / list / start / stop / one id space ---------------------------------------------------------
def test_qm_list_prints_nothing_without_vms(lab_factory: Callable[..., Lab]) -> None:
    bed = lab_factory()
    result = qm(bed, "list")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_qm_list_status_start_stop(lab_factory: Callable[..., Lab]) -> None:
    bed = lab_factory()
    bed.add_vm(None, 301, name="beta", running=False)
    alpha = bed.add_vm(None, 300, name="alpha")
    lines = qm(bed, "list").stdout.decode().splitlines()
    assert lines[0].split() == ["VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID"]
    assert lines[1].split() == ["300", "alpha", "running", "4096", "32.00", str(alpha.pid1)]
    assert lines[2].split() == ["301", "beta", "stopped", "4096", "32.00", "0"]
    assert qm(bed, "status", "301").stdout == b"status: stopped\n"
    assert qm(bed, "start", "301").returncode == 0
    assert qm(bed, "status", "301").stdout == b"status: running\n"
    assert out(guest_exec(bed, 301, "hostname")) == b"beta\n"  # the agent started with the VM
    again = qm(bed, "start", "301")
    assert (again.returncode, err(again)) == (255, "VM 301 already running\n")
    assert qm(bed, "stop", "301").returncode == 0
    assert qm(bed, "status", "301").stdout == b"status: stopped\n"
    assert qm(bed, "status", "999").returncode == 255


def test_containers_and_vms_share_one_id_space(lab: Lab, make_ct: MakeCt, make_vm: MakeVm) -> None:
    ct = make_ct()
    with pytest.raises(RuntimeError, match=f"unable to create VM {ct.ctid} - CT {ct.ctid} already exists"):
        make_vm(ct.ctid)
    missing = qm(lab, "status", str(ct.ctid))  # qm does not see containers
    assert f"qemu-server/{ct.ctid}.conf' does not exist" in err(missing)


def test_every_qm_call_is_logged(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    qm(lab, "status", str(machine.vmid))
    assert lab.node().qm_calls()[-1] == ["status", str(machine.vmid)]


# --- snapshots, pvesh -------------------------------------------------------------------------------------
def test_snapshot_rollback_restores_the_disk_and_start_brings_the_agent_back(
    lab: Lab, make_vm: MakeVm,
) -> None:
    machine = make_vm(setup="echo v1 > /etc/lab-state")
    vmid = str(machine.vmid)
    before = tree_digest(machine.upper_dir)
    assert qm(lab, "snapshot", vmid, "fleetfix-20260101", "--description", "before").returncode == 0
    guest_exec(lab, machine.vmid, "sh", "-c", "echo v2 > /etc/lab-state; rm -rf /usr/share/doc")
    assert tree_digest(machine.upper_dir) != before
    assert qm(lab, "rollback", vmid, "fleetfix-20260101").returncode == 0
    assert qm(lab, "status", vmid).stdout == b"status: stopped\n"  # a rollback stops a running VM
    assert tree_digest(machine.upper_dir) == before
    assert qm(lab, "rollback", vmid, "fleetfix-20260101", "--start", "1").returncode == 0
    assert out(guest_exec(lab, machine.vmid, "cat", "/etc/lab-state")) == b"v1\n"
    listing = qm(lab, "listsnapshot", vmid).stdout.decode().splitlines()
    assert re.fullmatch(r"`-> fleetfix-20260101 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +before", listing[0])
    assert re.fullmatch(r" `-> current +You are here!", listing[1])
    assert qm(lab, "delsnapshot", vmid, "fleetfix-20260101").returncode == 0
    missing = qm(lab, "rollback", vmid, "fleetfix-20260101")
    assert (missing.returncode, err(missing)) == (255, "snapshot 'fleetfix-20260101' does not exist\n")


@pytest.mark.parametrize(("vmid", "disk", "can"), [
    (801, "local:801/vm-801-disk-0.raw,size=8G", False),  # a `dir` storage holds raw images: no snapshots
    (802, "local:802/vm-802-disk-0.qcow2,size=8G", True),  # ... but a qcow2 image snapshots itself
    (803, "local-zfs:vm-803-disk-0,size=8G", True),
])
def test_snapshot_needs_storage_that_can(lab: Lab, make_vm: MakeVm, vmid: int, disk: str, can: bool) -> None:
    make_vm(vmid, config={"scsi0": disk}, running=False)
    result = qm(lab, "snapshot", str(vmid), "fleetfix-x1")
    expected = (0, "") if can else (255, "snapshot feature is not available\n")
    assert (result.returncode, err(result)) == expected


def test_pvesh_lists_vms_without_a_type_and_a_placeholder_name(lab: Lab, make_vm: MakeVm) -> None:
    named = make_vm(name="gpu-vm", tags=["gpu", "passthrough"])
    unnamed = make_vm(running=False, config={"name": ""})
    result = lab.ssh(None, ["pvesh", "get", "/nodes/pve1/qemu", "--output-format", "json"])
    entries = {entry["vmid"]: entry for entry in json.loads(result.stdout)}
    assert (entries[named.vmid]["name"], entries[named.vmid]["status"], entries[named.vmid]["tags"]) == (
        "gpu-vm", "running", "gpu;passthrough")
    assert "type" not in entries[named.vmid]
    assert (entries[unnamed.vmid]["name"], entries[unnamed.vmid]["status"]) == (
        f"VM {unnamed.vmid}", "stopped")


def test_closing_a_lab_stops_its_vms_and_their_agents(tmp_path: Path) -> None:
    bed = Lab(tmp_path / "bed")
    first = bed.add_vm(None, 300)
    bed.add_vm(None, 301, running=False)
    assert qm(bed, "start", "301").returncode == 0  # started over SSH: cleaned up all the same
    for vmid in (300, 301):
        assert bed.node().vm(vmid).exec(["pgrep", "-f", "/usr/sbin/qemu-ga$"]).stdout.strip()
    pids = [machine.pid1 for machine in vmlib.vms(bed.node().state)]
    assert all(pids)
    upper = str(first.upper_dir)
    bed.close()
    for pid in pids:
        state = Path(f"/proc/{pid}/stat")
        assert not state.exists() or state.read_text().split(") ")[1].startswith("Z"), f"pid {pid} alive"
    assert upper not in Path("/proc/self/mountinfo").read_text()
    assert not (tmp_path / "bed").exists()
