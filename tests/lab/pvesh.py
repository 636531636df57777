#!/usr/bin/python3
"""A stand-in for Proxmox VE's `pvesh`, answering the read-only calls fleetfix's discovery makes.

    pvesh get /nodes                                 [--output-format json|json-pretty]
    pvesh get /nodes/NODE/lxc                        the per-node container index (vmstatus objects)
    pvesh get /nodes/NODE/lxc/VMID/status/current
    pvesh get /nodes/NODE/lxc/VMID/snapshot          snapshots plus the "current" pseudo entry
    pvesh get /nodes/NODE/qemu                       the per-node VM index (QemuServer::vmstatus objects:
                                                     no `type` field, name "VM <id>" when unset)
    pvesh get /nodes/NODE/qemu/VMID/status/current | /nodes/NODE/qemu/VMID/snapshot

Output is JSON (only the JSON formats are modelled). Errors: one line on stderr, exit 255, like pvesh.
proxmoxer's SSH backends run exactly `pvesh get <path> --output-format json` (docs/DOMAIN.md 5.4).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import container as ctlib
import vm as vmlib


class PveshError(Exception):
    pass


# What pvesh reports for a guest's live usage; the stand-in's guests use none worth reporting.
_IDLE_COUNTERS = {"cpu": 0, "uptime": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}


def _with_runtime(status: dict[str, Any], pid: int | None, config: dict[str, str]) -> dict[str, Any]:
    """The fields a running guest adds (pid, uptime), and the config keys pvesh passes on as they are."""
    if pid:
        status["pid"] = pid
        status["uptime"] = max(int(time.time() - os.stat(f"/proc/{pid}").st_mtime), 0)
    for key in ("tags", "lock"):
        if key in config:
            status[key] = config[key]
    if config.get("template") == "1":
        status["template"] = 1
    return status


def _vmstatus(ct: ctlib.Container) -> dict[str, Any]:
    config = ct.config().main
    memory_mb = int(config.get("memory", "512"))
    swap_mb = int(config.get("swap", "512"))
    size = re.search(r"size=(\d+)G", config.get("rootfs", ""))
    status: dict[str, Any] = {
        "vmid": ct.ctid,
        "name": config.get("hostname", f"CT{ct.ctid}"),
        "status": ct.status,
        "type": "lxc",
        "cpus": int(config.get("cores", "1")),
        "maxmem": memory_mb * 1024 * 1024,
        "maxswap": swap_mb * 1024 * 1024,
        "maxdisk": int(size.group(1)) * 1024**3 if size else 0,
        "mem": 0,
        "disk": 0,
        **_IDLE_COUNTERS,
    }
    return _with_runtime(status, ct.pid1, config)


def _vm_status(machine: vmlib.VirtualMachine) -> dict[str, Any]:
    config = machine.config().main
    size = re.search(r"size=(\d+)G", config.get("scsi0", ""))
    status: dict[str, Any] = {
        "vmid": machine.vmid,
        "name": machine.name,
        "status": machine.status,
        "cpus": int(config.get("cores", "1")) * int(config.get("sockets", "1")),
        "maxmem": int(config.get("memory", "512")) * 1024 * 1024,
        "maxdisk": int(size.group(1)) * 1024**3 if size else 0,
        "mem": 0,
        "memhost": 0,
        "disk": 0,
        **_IDLE_COUNTERS,
    }
    return _with_runtime(status, machine.pid1, config)


def _snapshots(ct: ctlib.Container) -> list[dict[str, Any]]:
    config = ct.config()
    entries: list[dict[str, Any]] = []
    for name, values in config.snapshots.items():
        entry: dict[str, Any] = {"name": name, "description": values.get("description", "")}
        if "snaptime" in values:
            entry["snaptime"] = int(values["snaptime"])
        if "parent" in values:
            entry["parent"] = values["parent"]
        entries.append(entry)
    current: dict[str, Any] = {"name": "current", "description": "You are here!", "running": int(ct.running)}
    if "parent" in config.main:
        current["parent"] = config.main["parent"]
    entries.append(current)
    return entries


def get(node: ctlib.NodeState, path: str) -> Any:
    parts = [part for part in path.split("/") if part]
    if parts == ["nodes"]:
        return [{"node": node.name, "status": "online", "type": "node", "id": f"node/{node.name}"}]
    if len(parts) >= 3 and parts[0] == "nodes" and parts[2] == "lxc":
        if parts[1] not in (node.name, "localhost"):
            raise PveshError(
                f"hostname lookup '{parts[1]}' failed - failed to get address info for: {parts[1]}: "
                "Name or service not known"
            )
        if len(parts) == 3:
            return [_vmstatus(ct) for ct in node.containers()]
        ct = node.container(int(parts[3])) if parts[3].isdigit() else None
        if ct is None or not ct.exists():
            raise PveshError(f"Configuration file 'nodes/{node.name}/lxc/{parts[3]}.conf' does not exist")
        if parts[4:] == ["status", "current"]:
            return _vmstatus(ct)
        if parts[4:] == ["snapshot"]:
            return _snapshots(ct)
    if len(parts) >= 3 and parts[0] == "nodes" and parts[2] == "qemu":
        if parts[1] not in (node.name, "localhost"):
            raise PveshError(
                f"hostname lookup '{parts[1]}' failed - failed to get address info for: {parts[1]}: "
                "Name or service not known"
            )
        if len(parts) == 3:
            return [_vm_status(machine) for machine in vmlib.vms(node)]
        machine = vmlib.vm(node, int(parts[3])) if parts[3].isdigit() else None
        if machine is None or not machine.exists():
            raise PveshError(
                f"Configuration file 'nodes/{node.name}/qemu-server/{parts[3]}.conf' does not exist"
            )
        if parts[4:] == ["status", "current"]:
            return _vm_status(machine)
        if parts[4:] == ["snapshot"]:
            return _snapshots(machine)
    raise PveshError(f"no 'get' handler for '{path}'")


def main(argv: list[str]) -> int:
    try:
        node = ctlib.NodeState.from_env()
        if len(argv) < 2 or argv[0] != "get":
            raise PveshError("only 'pvesh get <path>' is modelled by the test bed")
        output_format = "text"
        rest = argv[2:]
        for index, arg in enumerate(rest):
            if arg == "--output-format" and index + 1 < len(rest):
                output_format = rest[index + 1]
        result = get(node, argv[1])
        indent = 4 if output_format == "json-pretty" else None
        sys.stdout.write(json.dumps(result, indent=indent) + "\n")
        return 0
    except (PveshError, ctlib.ContainerError) as error:
        sys.stderr.write(f"{error}\n")
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
