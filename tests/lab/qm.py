#!/usr/bin/python3
"""A stand-in for Proxmox VE's `qm`, for test-bed nodes (tests/lab/vm.py has the VMs, qga.py the agent).

It follows qemu-server's `src/PVE/CLI/qm.pm`, `PVE/QemuServer/Agent.pm` and `PVE/API2/Qemu.pm`
(docs/findings.md "Proxmox VMs (qm)") where fleetfix can observe it:

    qm guest exec VMID [--synchronous 0|1] [--timeout N] [--pass-stdin 0|1] [--] CMD...
        stdin read to EOF with --pass-stdin (more than 1 MiB dies), then: config loaded, `agent:` line
        required, VM running, guest-ping answered (3 s), the command spawned by the VM's agent; polls its
        status until it exited or N s (default 30, 0 = no limit) passed; prints the Perl JSON of the status
        (exitcode|signal, exited 1/0, out-data/err-data, out-truncated/err-truncated 1/0) and exits 0, or
        on timeout warns "timeout reached, returning pid" and prints {"pid": P}: the command runs on.
    qm guest exec-status VMID PID
    qm list | status ID | start ID | stop ID | config ID
    qm snapshot ID NAME [--description D] [--vmstate 0|1] | listsnapshot ID | rollback ID NAME [--start 0|1]
    qm delsnapshot ID NAME [--force 0|1]
        (the same code as pct's: PVE::AbstractConfig and print_snapshot_tree serve both; a disk on storage
        "local" that is not qcow2 makes snapshot die: "snapshot feature is not available")

Errors are PVE's one-line messages on stderr with exit status 255 (a Perl `die`). Every invocation is
appended to <node dir>/qm.log (one JSON argv per line).

A real QEMU VM (tests/lab/qemuvm.py: vm/ID/qemu.json) gets qemu-server's own conversation with a real
qemu-ga (qga_real.py): one connection per agent command, guest-sync-delimited first, guest-ping with 3 s,
guest-exec and guest-exec-status with QMPClient's default 5 s, and a 1 s sleep between status polls, as
qm.pm `exec` does. For the agent stand-in (qga.py) one deliberate difference: the stand-in polls every
20 ms, or the test bed's runs would spend most of their time asleep. The answers are the same. Snapshots
of a stand-in VM are copies of its upper dir and do not freeze its file systems through the agent, as PVE
does when the agent runs; a real VM's are qcow2 snapshots taken as qemu-server takes them (QMP
blockdev-snapshot-internal-sync after guest-fsfreeze-freeze while it runs, qemu-img snapshot while it is
stopped; `--vmstate 1` keeps its RAM too, and its rollback resumes it: qemuvm.py says how).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pct_exec
import qga_real
from pct_exec import EXIT_DIE, NODE_DIR_ENV, PctDie, bool_option, check_vmid, missing_config, parse_options
from qga_client import AgentUnavailable, agent_enabled, ping, request

STDIN_LIMIT = 1024 * 1024  # qm.pm: "'input-data' (STDIN) is limited to 1 MiB, aborting"
POLL_SECONDS = 0.02  # real qm: sleep 1 (see the module docstring)
REAL_POLL_SECONDS = 1.0  # qm.pm `exec`: `sleep 1` between qemu_exec_status calls
DEFAULT_TIMEOUT = 30
# A test-bed knob, not PVE's: a number of seconds in this file of the node dir replaces the 30 s default,
# so a test can show a command outlasting qm's default wait without sleeping 30 s (tests/e2e/test_real_vm.py
# writes it, and shows qm without --timeout giving up at it, before it relies on it).
DEFAULT_TIMEOUT_FILE = "qm-default-timeout"


def default_timeout(node_dir: str) -> int:
    try:
        with open(os.path.join(node_dir, DEFAULT_TIMEOUT_FILE)) as knob:
            return int(knob.read())
    except FileNotFoundError:
        return DEFAULT_TIMEOUT


# ----------------------------------------------------------------------------------------------------------
# guest exec / exec-status: the lean path (no container module), paid for by every command in a VM
# ----------------------------------------------------------------------------------------------------------
def _config(node_dir: str, vmid: int) -> dict[str, str]:
    """The main section of qemu-server/VMID.conf (load_config dies when there is none)."""
    path = os.path.join(node_dir, "qemu-server", f"{vmid}.conf")
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        raise missing_config(node_dir, vmid, "qemu-server") from None
    main: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            break
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            main[key.strip()] = value.strip()
    return main


def _socket(node_dir: str, vmid: int) -> str:
    return os.path.join(node_dir, "vm", str(vmid), "qga.sock")


def _is_real_vm(node_dir: str, vmid: int) -> bool:
    """A QEMU guest with a real qemu-ga (qemuvm.py's marker), not the namespace stand-in."""
    return os.path.isfile(os.path.join(node_dir, "vm", str(vmid), "qemu.json"))


def _assert_agent_available(node_dir: str, vmid: int, config: dict[str, str]) -> None:
    """PVE::QemuServer::Agent::assert_agent_available, in its order."""
    if "agent" not in config:  # `defined`, not enabled: `agent: 0` passes here and fails the ping
        raise PctDie("No QEMU guest agent configured")
    if pct_exec.running_pid1(node_dir, vmid, "vm") is None:
        raise PctDie(f"VM {vmid} is not running")
    alive = qga_real.ping if _is_real_vm(node_dir, vmid) else ping
    if not (agent_enabled(config["agent"]) and alive(_socket(node_dir, vmid))):
        raise PctDie("QEMU guest agent is not running")


def _agent_cmd(node_dir: str, vmid: int, config: dict[str, str], name: str, arguments: dict[str, object]
               ) -> dict[str, object]:
    """PVE's agent_cmd: the availability checks, the command, `Agent error: DESC` on its error."""
    _assert_agent_available(node_dir, vmid, config)
    try:
        if _is_real_vm(node_dir, vmid):
            answer = qga_real.command(_socket(node_dir, vmid), name, arguments)
        else:
            answer = request(_socket(node_dir, vmid), {"execute": name, "arguments": arguments})
    except (AgentUnavailable, qga_real.AgentError) as error:
        # PVE::QemuServer::Monitor::mon_cmd: die "VM $vmid qmp command '$cmd' failed - $err"
        raise PctDie(f"VM {vmid} qmp command '{name}' failed - {error}") from None
    error = answer.get("error")
    if isinstance(error, dict):
        raise PctDie(f"Agent error: {error.get('desc')}")
    result = answer.get("return")
    assert isinstance(result, dict)
    return result


def _exec_status(node_dir: str, vmid: int, config: dict[str, str], pid: int) -> dict[str, object]:
    """qemu_exec_status: out-data/err-data base64-decoded into (Perl) byte strings, booleans as 1/0."""
    status = _agent_cmd(node_dir, vmid, config, "guest-exec-status", {"pid": pid})
    for key in ("out-data", "err-data"):
        value = status.get(key)
        if isinstance(value, str) and value:
            status[key] = base64.b64decode(value).decode("latin-1")  # a byte string, as Perl holds it
    return {key: int(value) if isinstance(value, bool) else value for key, value in status.items()}


def perl_json(value: dict[str, object]) -> bytes:
    """to_json($result, {pretty => 1, canonical => 1, utf8 => 1}): keys sorted, 3-space indent, `" : "`,
    and each character of a (byte) string UTF-8 encoded, so bytes >= 0x80 come out double-encoded."""
    items = sorted(value.items())
    lines = [f"   {json.dumps(key)} : {json.dumps(item, ensure_ascii=False)}" for key, item in items]
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode("utf-8") if lines else b"{}\n"


def _read_stdin() -> bytes:
    data = bytearray()
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > STDIN_LIMIT:
            raise PctDie("'input-data' (STDIN) is limited to 1 MiB, aborting")


def _integer(name: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    if not text.isdigit():
        raise PctDie(f"400 Parameter verification failed.\n{name}: type check ('integer') failed - "
                     f"got '{text}'")
    return int(text)


def cmd_guest_exec(node_dir: str, args: list[str]) -> int:
    options, positional = parse_options(args, {"synchronous": True, "timeout": True, "pass-stdin": True})
    vmid = check_vmid(positional[0] if positional else None)
    command = positional[1:]
    sync = bool_option(options.get("synchronous"), default=True)
    if "timeout" in options and not sync:
        raise PctDie("400 Parameter verification failed.\nsynchronous: needs to be set for 'timeout'")
    timeout = _integer("timeout", options.get("timeout"), default_timeout(node_dir))
    input_data = _read_stdin() if bool_option(options.get("pass-stdin"), default=False) else None
    config = _config(node_dir, vmid)
    if not command and input_data is None:
        raise PctDie("command or input-data (or both) required")
    if not command:
        raise PctDie("Agent error: Parameter 'path' is missing")
    arguments: dict[str, object] = {"path": command[0], "arg": command[1:], "capture-output": True}
    if input_data is not None:
        arguments["input-data"] = base64.b64encode(input_data).decode()
    result = _agent_cmd(node_dir, vmid, config, "guest-exec", arguments)
    if sync:
        pid = result["pid"]
        assert isinstance(pid, int)
        poll = REAL_POLL_SECONDS if _is_real_vm(node_dir, vmid) else POLL_SECONDS
        started = int(time.time())
        while timeout == 0 or int(time.time()) - started < timeout:
            status = _exec_status(node_dir, vmid, config, pid)
            if status.get("exited"):
                result = status
                break
            time.sleep(poll)
        if not result.get("exited"):
            sys.stderr.write("timeout reached, returning pid\n")
            sys.stderr.flush()
    sys.stdout.buffer.write(perl_json(result))
    return 0


def cmd_guest_exec_status(node_dir: str, args: list[str]) -> int:
    _, positional = parse_options(args, {})
    vmid = check_vmid(positional[0] if positional else None)
    if len(positional) < 2 or not positional[1].isdigit():
        raise PctDie("400 not enough arguments")
    config = _config(node_dir, vmid)
    sys.stdout.buffer.write(perl_json(_exec_status(node_dir, vmid, config, int(positional[1]))))
    return 0


# ----------------------------------------------------------------------------------------------------------
# list / status / start / stop / config / snapshots: the full lab modules, imported only here
# ----------------------------------------------------------------------------------------------------------
def _node(node_dir: str) -> Any:
    from pathlib import Path

    import container as ctlib

    return ctlib.NodeState(Path(node_dir))


def _vm(node: Any, text: str | None) -> Any:
    import vm as vmlib

    machine = vmlib.vm(node, check_vmid(text))
    if not machine.exists():
        raise missing_config(str(node.dir), machine.vmid, "qemu-server")
    return machine


def _vm_volumes_without_snapshots(config: dict[str, str]) -> list[str]:
    """Disks whose storage cannot snapshot them: on "local" (a `dir` storage) only qcow2 images can;
    CD-ROMs are not snapshotted at all (QemuConfig's has_feature skips them)."""
    import re

    keys = []
    for key, value in config.items():
        if not re.fullmatch(r"(ide|sata|scsi|virtio)\d+|efidisk0|tpmstate0", key) or "media=cdrom" in value:
            continue
        volume = value.split(",", 1)[0]
        storage = volume.split(":", 1)[0] if ":" in volume else None
        if storage == "local" and not volume.endswith(".qcow2"):
            keys.append(key)
    return keys


def cmd_list(node_dir: str, args: list[str]) -> int:
    import vm as vmlib

    parse_options(args, {"full": True})
    machines = vmlib.vms(_node(node_dir))
    if not machines:
        return 0  # qm.pm: `exit 0 if (!scalar(@$vmlist))`, before the header
    row = "{:>10} {:<20} {:<10} {:<10} {:>12} {:<10}\n"
    out = row.format("VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID")
    for machine in machines:
        config = machine.config().main
        size = 0.0
        for part in config.get("scsi0", "").split(","):
            if part.startswith("size=") and part.endswith("G"):
                size = float(part[5:-1])
        out += row.format(machine.vmid, machine.name, machine.status, config.get("memory", "512"),
                          f"{size:.2f}", machine.pid1 or 0)
    sys.stdout.write(out)
    return 0


def cmd_status(node_dir: str, args: list[str]) -> int:
    options, positional = parse_options(args, {"verbose": False})
    machine = _vm(_node(node_dir), positional[0] if positional else None)
    if options.get("verbose"):
        print(f"name: {machine.name}\nqmpstatus: {machine.status}\nstatus: {machine.status}\n"
              f"vmid: {machine.vmid}")
    else:
        print(f"status: {machine.status}")  # qm.pm: "status: $qmpstatus" (running, stopped, paused, ...)
    return 0


def cmd_start(node_dir: str, args: list[str]) -> int:
    _, positional = parse_options(args, {"skiplock": False, "timeout": True})
    machine = _vm(_node(node_dir), positional[0] if positional else None)
    if machine.running:
        raise PctDie(f"VM {machine.vmid} already running")
    machine.start()
    return 0


def cmd_stop(node_dir: str, args: list[str]) -> int:
    _, positional = parse_options(args, {"skiplock": False, "timeout": True, "overrule-shutdown": False})
    _vm(_node(node_dir), positional[0] if positional else None).stop()
    return 0


def cmd_config(node_dir: str, args: list[str]) -> int:
    _, positional = parse_options(args, {"current": False, "snapshot": True})
    config = _vm(_node(node_dir), positional[0] if positional else None).config().main
    for key in sorted(config):
        if key not in ("parent", "digest"):
            print(f"{key}: {config[key]}")
    return 0


# A real QEMU VM's snapshots are qcow2 snapshots (qemuvm.py QemuVM.snapshot_disk, which cites qemu-server);
# the stand-in VM's are copies of its upper dir, as a container's. The config sections are pct's code.
def _is_qemu(machine: Any) -> bool:
    return hasattr(machine, "snapshot_disk")


def _take(machine: Any, name: str, options: dict[str, str]) -> dict[str, str]:
    import pct

    if not _is_qemu(machine):
        return pct._copy_upper(machine, name, options)
    # PVE saves RAM state only for a running VM (a stopped one has none): the option is then ignored.
    vmstate = bool_option(options.get("vmstate"), default=False) and machine.running
    for warning in machine.snapshot_disk(name, vmstate=vmstate):
        sys.stderr.write(f"{warning}\n")
    # PVE's key names the state volume (vm-ID-state-NAME); the bed keeps the state inside the qcow2.
    return {"vmstate": f"local:{machine.vmid}/vm-{machine.vmid}-state-{name}.raw"} if vmstate else {}


def _restore(machine: Any, name: str, section: dict[str, str]) -> None:
    import pct

    if _is_qemu(machine):
        machine.rollback_disk(name)
    else:
        pct._restore_upper(machine, name, section)


def _resume(machine: Any, name: str) -> None:
    if _is_qemu(machine):
        machine.start(loadvm=name)  # QemuConfig.pm __snapshot_rollback_vm_start(statefile => vmstate)


def _drop(machine: Any, name: str) -> None:
    import pct

    if _is_qemu(machine):
        machine.delete_disk_snapshot(name)
    else:
        pct._drop_upper(machine, name)


def cmd_snapshot(node_dir: str, args: list[str]) -> int:
    import pct

    return pct.cmd_snapshot(_node(node_dir), args, find=_vm, no_snapshots=_vm_volumes_without_snapshots,
                            allowed={"description": True, "vmstate": True}, take=_take)


def cmd_listsnapshot(node_dir: str, args: list[str]) -> int:
    import pct

    return pct.cmd_listsnapshot(_node(node_dir), args, find=_vm)


def cmd_rollback(node_dir: str, args: list[str]) -> int:
    import pct

    return pct.cmd_rollback(_node(node_dir), args, find=_vm, restore=_restore, resume=_resume)


def cmd_delsnapshot(node_dir: str, args: list[str]) -> int:
    import pct

    return pct.cmd_delsnapshot(_node(node_dir), args, find=_vm, drop=_drop)


COMMANDS: dict[str, Callable[[str, list[str]], int]] = {
    "list": cmd_list,
    "status": cmd_status,
    "start": cmd_start,
    "stop": cmd_stop,
    "config": cmd_config,
    "snapshot": cmd_snapshot,
    "listsnapshot": cmd_listsnapshot,
    "rollback": cmd_rollback,
    "delsnapshot": cmd_delsnapshot,
}
GUEST_COMMANDS = {"exec": cmd_guest_exec, "exec-status": cmd_guest_exec_status}


def main(argv: list[str]) -> int:
    try:
        node_dir = os.environ.get(NODE_DIR_ENV)
        if not node_dir:
            raise PctDie(f"{NODE_DIR_ENV} is not set: this qm stand-in only runs on a test-bed node")
        pct_exec.log_invocation(node_dir, argv, "qm.log")
        if argv[:1] == ["guest"] and len(argv) > 1 and argv[1] in GUEST_COMMANDS:
            return GUEST_COMMANDS[argv[1]](node_dir, argv[2:])
        if not argv or argv[0] not in COMMANDS:
            raise PctDie(f"unknown command 'qm {' '.join(argv[:2])}'".rstrip())
        return COMMANDS[argv[0]](node_dir, argv[1:])
    except PctDie as error:
        sys.stdout.flush()
        sys.stderr.write(f"{error}\n")
        return EXIT_DIE
    except Exception as error:  # container/vm errors, pct-style one line
        if type(error).__name__ != "ContainerError":
            raise
        sys.stdout.flush()
        sys.stderr.write(f"{error}\n")
        return EXIT_DIE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
