"""Issue 20 item 4's acceptance through the real CLI: probe, exec and apply on a test-bed VM (qm guest exec
over real sshd, the `qm` stand-in, a guest agent in the VM), snapshot before the change and rollback on
failure with `qm`, and VMs that cannot take commands as clear per-target lines while the others go on."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fleetfix.fleet import Fleet
from fleetfix.guests.vm import QM_STDIN_LIMIT, QmGuestExecTransport
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.e2e.test_snapshots import FAILING
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.vm import VirtualMachine

MakeVm = Callable[..., VirtualMachine]
MakeCt = Callable[..., Container]
PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}
SNAPSHOT_LINE = re.compile(r"^\s*`-> (\S+)", re.MULTILINE)


def vm_args(lab: Lab, *vmids: int, ctids: tuple[int, ...] = ()) -> list[str]:
    args = host_args(lab, None, *ctids)
    for vmid in vmids:
        args += ["--vm", str(vmid)]
    return args


def qm_commands(lab: Lab, vmid: int, since: int) -> list[list[str]]:
    """qm calls about vmid other than guest exec, after the first `since` calls of the node."""
    return [argv for argv in lab.node().qm_calls()[since:] if argv[1:2] == [str(vmid)]]


def snapshots(lab: Lab, vmid: int) -> list[str]:
    listed = lab.ssh(None, ["qm", "listsnapshot", str(vmid)])
    assert listed.returncode == 0, listed.stderr
    return [name for name in SNAPSHOT_LINE.findall(listed.stdout.decode()) if name != "current"]


def findings(report: dict[str, Any]) -> set[str]:
    return {finding["code"] for finding in report["findings"]}


def test_probe_then_apply_fixes_a_vm_with_a_snapshot_first_and_a_rerun_changes_nothing(
    lab: Lab, make_vm: MakeVm, apt_repo: AptRepo, tmp_path: Path,
) -> None:
    machine = make_vm(name="gpu-vm", setup=problem_case)
    targets = vm_args(lab, machine.vmid)
    state = ["--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={apt_repo.base_url}"]

    probed = run_cli("probe", *targets, "--json")
    assert probed.exit_code == 3, probed.stdout + probed.stderr  # error findings, found in the VM
    [report] = probed.json()["targets"]
    guest = (report["guest"], report["vmid"], report["ctid"], report["status"])
    assert guest == ("vm", machine.vmid, None, "ok")
    assert findings(report) >= TOOLKIT_CODES
    assert report["node_facts"] is None  # a VM has its own kernel: the node's module is not its driver

    before = tree_digest(machine.upper_dir)
    checked = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--check", "--json")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert checked.json()["targets"][0]["status"] == "would-change"
    assert tree_digest(machine.upper_dir) == before, "check mode changed the VM"

    since = len(lab.node().qm_calls())
    applied = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--snapshot", "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    [target] = applied.json()["targets"]
    assert target["status"] == "changed"
    made = [argv[0] for argv in qm_commands(lab, machine.vmid, since) if argv[0] != "guest"]
    assert made == ["status", "snapshot"]  # (before this test's own listsnapshot below)
    [taken] = snapshots(lab, machine.vmid)
    assert target["snapshot"]["name"] == taken and re.fullmatch(r"fleetfix-\d{8}-\d{6}", taken)
    nvcc = machine.sh("/usr/local/cuda-12.8/bin/nvcc --version", check=False).stdout.decode()
    assert "release 12.8, V12.8.93" in nvcc

    again = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json")
    assert again.exit_code == 0, again.stdout + again.stderr
    [rerun] = again.json()["targets"]
    assert (rerun["status"], rerun["counts"]["changed"]) == ("ok", 0)
    reprobed = run_cli("probe", *targets, "--json").json()["targets"][0]
    assert not TOOLKIT_CODES & findings(reprobed)


def test_a_failed_apply_on_a_vm_is_rolled_back_and_the_vm_runs_again(
    lab: Lab, make_vm: MakeVm, tmp_path: Path,
) -> None:
    machine = make_vm(setup="echo before > /etc/lab-state")
    book = tmp_path / "book.yaml"
    book.write_text(FAILING)
    before = tree_digest(machine.upper_dir)
    since = len(lab.node().qm_calls())
    result = run_cli("apply", str(book), *vm_args(lab, machine.vmid), "--state-dir",
                     str(tmp_path / "state"), "--rollback-on-failure")
    assert result.exit_code == 1, result.stdout + result.stderr
    made = [argv for argv in qm_commands(lab, machine.vmid, since) if argv[0] != "guest"]
    [snapshot] = snapshots(lab, machine.vmid)
    assert f"rolled back to {snapshot}" in result.stdout.split("PLAY RECAP")[1]
    assert [argv[0] for argv in made] == ["status", "snapshot", "rollback"]
    assert made[-1][2:] == [snapshot, "--start", "1"]  # it was running: started again after the rollback
    assert machine.running and tree_digest(machine.upper_dir) == before
    after = run_cli("exec", *vm_args(lab, machine.vmid), "--", "cat", "/etc/lab-state")  # the agent is back
    assert after.exit_code == 0 and "before" in after.stdout, after.stdout + after.stderr


def test_vms_that_cannot_take_commands_are_one_line_each_and_the_others_run(
    lab: Lab, make_vm: MakeVm, make_ct: MakeCt,
) -> None:
    good, ct = make_vm(), make_ct()
    no_agent, agentless = make_vm(agent=False), make_vm(agent_installed=False)
    disabled, stopped = make_vm(config={"agent": "0"}), make_vm(running=False)
    vmids = (good.vmid, no_agent.vmid, agentless.vmid, disabled.vmid, stopped.vmid)
    targets = vm_args(lab, *vmids, ctids=(ct.ctid,))
    node = lab.node().address

    ran = run_cli("exec", *targets, "--", "hostname")
    assert ran.exit_code == 4, ran.stdout + ran.stderr  # some targets could not be reached
    assert f"== {node}/{good.vmid} exit 0\nvm{good.vmid}\n" in ran.stdout
    assert f"== {node}/{ct.ctid} exit 0\nct{ct.ctid}\n" in ran.stdout
    lines = [line for line in ran.stdout.splitlines() if "unreachable" in line]
    install = ("in the VM, install the agent (package qemu-guest-agent; Debian/Ubuntu: apt-get install "
               "qemu-guest-agent) and start it (systemctl start qemu-guest-agent)")

    def not_running(vmid: int) -> str:  # installed but not started, not installed, or `agent: 0`
        return (f"== {node}/{vmid} unreachable: VM {vmid} on {node}: the QEMU guest agent is not running: "
                f"{install}; if qm config {vmid} shows agent: 0, or the agent was enabled after the VM "
                f"started, qm set {vmid} --agent enabled=1 and qm reboot {vmid} first; or it stopped "
                "answering while the command ran (the VM rebooted or the agent restarted: the command's "
                "result is lost)")

    assert lines == [
        f"== {node}/{no_agent.vmid} unreachable: VM {no_agent.vmid} on {node} has no QEMU guest agent "
        f"configured: on the node, qm set {no_agent.vmid} --agent enabled=1, then a fresh start of the VM "
        f"(qm reboot {no_agent.vmid}) to add the agent's virtio-serial port; {install}",
        not_running(agentless.vmid),
        not_running(disabled.vmid),
        f"== {node}/{stopped.vmid} unreachable: VM {stopped.vmid} on {node} is stopped",
    ]
    assert "Traceback" not in ran.stderr

    probed = run_cli("probe", *targets, "--json")
    assert probed.exit_code == 4
    by_vmid = {report["vmid"]: report for report in probed.json()["targets"]}
    assert by_vmid[good.vmid]["status"] == by_vmid[ct.ctid]["status"] == "ok"
    for vmid in vmids[1:]:
        assert by_vmid[vmid]["status"] == "unreachable" and f"VM {vmid}" in by_vmid[vmid]["error"]
    assert f"qm set {no_agent.vmid} --agent enabled=1" in by_vmid[no_agent.vmid]["error"]
    assert "apt-get install qemu-guest-agent" in by_vmid[agentless.vmid]["error"]


def test_a_vm_and_a_container_each_get_the_fixes_of_their_kind(
    lab: Lab, make_vm: MakeVm, make_ct: MakeCt,
) -> None:
    """The same broken stack (a CUDA torch, no GPU device, little disk) in a VM and in a container: the VM is
    told PCI passthrough (hostpci) and `qm resize` with growing its file system inside, the container its
    config's device lines and `pct resize`, each with its own id and nothing of the other kind."""
    machine, ct = make_vm(setup=problem_case), make_ct(setup=problem_case)
    probed = run_cli("probe", *vm_args(lab, machine.vmid, ctids=(ct.ctid,)), "--json")
    assert probed.exit_code == 3, probed.stdout + probed.stderr
    by_id = {report["vmid"]: report for report in probed.json()["targets"]}
    hints = {guest: {f["code"]: f["fix"]["hint"] for f in by_id[guest]["findings"]}
             for guest in (machine.vmid, ct.ctid)}
    vm_gpu, ct_gpu = hints[machine.vmid]["GPU_NOT_VISIBLE"], hints[ct.ctid]["GPU_NOT_VISIBLE"]
    assert f"qm set {machine.vmid} --hostpci0 <the GPU's PCI address" in vm_gpu and ",pcie=1" in vm_gpu
    assert f"qm set {machine.vmid} --machine q35" in vm_gpu and "IOMMU" in vm_gpu
    assert "lxc." not in vm_gpu and "pct " not in vm_gpu and "/etc/pve/lxc" not in vm_gpu
    assert f"/etc/pve/lxc/{ct.ctid}.conf" in ct_gpu and "lxc.mount.entry" in ct_gpu
    assert f"pct set {ct.ctid} --dev0 /dev/nvidia0" in ct_gpu
    assert "qm " not in ct_gpu and "hostpci" not in ct_gpu
    for report in by_id.values():  # every other hint of either kind names no command of the other
        other = ("pct ", "lxc.", "/etc/pve/lxc") if report["guest"] == "vm" else ("qm ", "hostpci")
        for code, hint in ((f["code"], f["fix"]["hint"]) for f in report["findings"]):
            assert not any(word in hint for word in other), (report["guest"], code, hint)


def test_a_timeout_kills_the_command_in_the_vm_and_spares_the_agent(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    result = run_cli("exec", *vm_args(lab, machine.vmid), "--timeout", "2", "--json", "--", "sh", "-c",
                     "sleep 1234; echo never")
    [record] = result.json()
    assert (record["timed_out"], record["stdout"]) == (True, ""), record
    # Nothing of it is left in the VM (qm alone would have left it running), and the agent still answers.
    assert machine.exec(["pgrep", "-f", "sleep 1234"]).stdout == b""
    assert machine.agent_running()
    assert run_cli("exec", *vm_args(lab, machine.vmid), "--", "true").exit_code == 0


def test_output_the_agent_cut_is_an_error_the_user_sees(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    command = ["--", "sh", "-c", "head -c 17000000 /dev/zero | tr '\\0' y"]
    result = run_cli("exec", *vm_args(lab, machine.vmid), "--max-output", "64M", *command)
    assert result.exit_code != 0
    cut = "the QEMU guest agent cut the command's stdout at 16 MiB; its output is incomplete"
    assert cut in result.stdout
    assert "yyyy" not in result.stdout
    # Under the default cap (8 MiB per stream) qm's answer itself is too big: said so, not misread.
    capped = run_cli("exec", *vm_args(lab, machine.vmid), *command)
    assert capped.exit_code != 0
    assert "qm guest exec answered with more than the output cap" in capped.stdout + capped.stderr


def test_stdin_over_qms_limit_is_staged_and_arrives_whole(lab: Lab, make_vm: MakeVm) -> None:
    machine = make_vm()
    node = lab.node()
    settings = SSHSettings(node.address, node.port, identity_file=str(lab.client_key),
                           known_hosts=str(lab.known_hosts))
    data = os.urandom(QM_STDIN_LIMIT * 2 + 12345)
    with Fleet() as fleet:
        transport = fleet.transport(Target("vm", NodeRef(node.name, settings), GuestRef.vm(machine.vmid)))
        assert isinstance(transport, QmGuestExecTransport)
        result = transport.execute(["sha256sum"], stdin=data, timeout=60)
    assert result.ok, result.stderr
    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert machine.exec(["sh", "-c", "ls /tmp"]).stdout == b""  # the staged file is gone


def test_files_go_to_and_come_back_from_a_vm_in_pieces_checksummed(
    lab: Lab, make_vm: MakeVm, tmp_path: Path,
) -> None:
    """Guest.push/pull of a VM: over `qm guest exec` only (no file API on qm's CLI), in stdin pieces of at
    most 1 MiB and base64 pieces of 4 MiB back; the file lands by rename only after its sha256 matched."""
    machine = make_vm(name="files-vm")
    node = lab.node()
    settings = SSHSettings(node.address, node.port, identity_file=str(lab.client_key),
                           known_hosts=str(lab.known_hosts))
    data = os.urandom(9 * 1024 * 1024 + 4321)  # three pull pieces, ten push pieces
    (tmp_path / "wheel.whl").write_bytes(data)
    with Fleet() as fleet:
        guest = fleet.guest(Target("vm", NodeRef(node.name, settings), GuestRef.vm(machine.vmid)))
        pushed = guest.push(tmp_path / "wheel.whl", "/root/wheel.whl", mode=0o640)
        pulled = guest.pull("/root/wheel.whl", tmp_path / "back.whl")
    assert pushed.sha256 == pulled.sha256 == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "back.whl").read_bytes() == data
    listed = machine.exec(["sh", "-c", "stat -c '%a %s' /root/wheel.whl; ls -a /root"]).stdout.decode()
    assert listed.splitlines()[0] == f"640 {len(data)}"
    assert ".tmp" not in listed  # no temp file left beside it


def test_inventory_vms_and_discovered_vms_are_targets(
    lab_factory: Callable[..., Lab], tmp_path: Path,
) -> None:
    bed = lab_factory()  # a private node: discovery sees exactly these guests
    node = bed.node()
    bed.add_container(None, 200, name="train-a")
    bed.add_vm(None, 300, name="gpu-vm", tags=("passthrough",))
    bed.add_vm(None, 301, running=False)
    common: dict[str, Any] = {"identity_file": str(bed.client_key), "known_hosts": str(bed.known_hosts)}
    env = {"FLEETFIX_STATE_DIR": str(tmp_path / "state")}

    static = tmp_path / "static.yaml"
    static.write_text(yaml.safe_dump({"defaults": common, "nodes": [{
        "name": node.name, "address": node.address, "port": node.port,
        "containers": [{"ctid": 200}],
        "vms": [{"vmid": 300, "name": "gpu-vm", "vars": {"python": "python3"}}],
    }]}))
    ran = run_cli("exec", "-i", str(static), "--json", "--", "hostname", env=env)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert {record["target"]: record["stdout"] for record in ran.json()} == {
        "pve1/200": "train-a\n", "gpu-vm": "gpu-vm\n"}

    discovered = tmp_path / "discovered.yaml"
    source = {"name": "lab", "via_ssh": node.name, "filter": {"guests": ["lxc", "vm"]}}
    discovered.write_text(yaml.safe_dump({"defaults": common, "proxmox": [source], "nodes": [
        {"name": node.name, "address": node.address, "port": node.port}]}))
    listed = run_cli("inventory", "list", "-i", str(discovered), "--json", env=env)
    assert listed.exit_code == 0, listed.stdout + listed.stderr
    data = listed.json()
    kinds = {t["name"]: (t["guest"], t["vmid"]) for t in data["targets"]}
    assert kinds == {"train-a": ("lxc", 200), "gpu-vm": ("vm", 300)}
    assert [(s["target"], s["reason"]) for s in data["skipped"]] == [
        ("pve1/301", "stopped: only running guests can be reached")]
    text = run_cli("inventory", "list", "-i", str(discovered), env=env).stdout
    assert re.search(r"^gpu-vm +pve1 +\S+ +vm 300 +passthrough", text, re.MULTILINE), text
    probed = run_cli("probe", "-i", str(discovered), "--limit", "gpu-vm", "--json", env=env)
    assert json.loads(probed.stdout)["targets"][0]["status"] == "ok", probed.stdout + probed.stderr
