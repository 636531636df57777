"""The fleetfix side of the benchmark, run in its own process so its CPU and peak RSS are its own.

    python -m benchmarks.fleetfix_run SPEC.json

SPEC: {"identity": path, "known_hosts": path, "forks": int, "channels_per_node": int,
       "nodes": [{"name", "address", "port", "proxy_port" (or null: direct), "ctids": [int, ...]}]}

Probes every container with `fleetfix.probe.run.probe_targets` (the library behind `fleetfix probe`: one SSH
connection per node, its containers over one channel, node facts once per node) through the latency proxy:
the connector dials the proxy port but the host key is still checked for the node's own address:port.
Prints one JSON line: statuses, the first errors, and this process's CPU (probe phase and whole process,
from `resource.getrusage(RUSAGE_SELF)`) and peak RSS.
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_SELF)

    # Imported here, as the CLI does on `probe`: what this costs is part of what is measured.
    from fleetfix.fleet import Fleet, NodeConnection
    from fleetfix.probe.run import probe_targets
    from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
    from fleetfix.transport.ssh import SSHConnection

    proxy_ports = {(node["address"], node["port"]): node["proxy_port"] for node in spec["nodes"]}
    channels = int(spec["channels_per_node"])

    def through_proxy(settings: SSHSettings) -> socket.socket:
        port = proxy_ports[(settings.address, settings.port)] or settings.port
        return socket.create_connection((settings.address, port), timeout=settings.connect_timeout)

    def connect(settings: SSHSettings) -> NodeConnection:
        return SSHConnection(settings, max_channels=channels, sock_factory=through_proxy).open()

    targets: list[Target] = []
    for node in spec["nodes"]:
        ssh = SSHSettings(
            node["address"], node["port"], identity_file=spec["identity"], known_hosts=spec["known_hosts"]
        )
        ref = NodeRef(node["name"], ssh)
        targets += [Target(f"{node['name']}/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in node["ctids"]]

    imported = resource.getrusage(resource.RUSAGE_SELF)
    probe_started = time.monotonic()
    with Fleet(forks=int(spec["forks"]), channels_per_node=channels, connect=connect) as fleet:
        reports = probe_targets(fleet, targets)
    probe_wall = time.monotonic() - probe_started
    after = resource.getrusage(resource.RUSAGE_SELF)

    statuses = Counter(report.status for report in reports)
    with_node_facts = sum(1 for report in reports if report.node is not None)
    print(json.dumps({
        "targets": len(targets),
        "statuses": dict(statuses),
        "with_node_facts": with_node_facts,
        "errors": sorted({report.error for report in reports if report.error})[:5],
        "probe_wall_s": probe_wall,
        "probe_cpu_s": _cpu_seconds(after) - _cpu_seconds(imported),
        "setup_cpu_s": _cpu_seconds(imported) - _cpu_seconds(before),
        "setup_wall_s": probe_started - started,
        "maxrss_kib": after.ru_maxrss,
    }))
    return 0 if statuses.get("ok", 0) == len(targets) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
