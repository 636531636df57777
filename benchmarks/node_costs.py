"""What each node's connection costs the controller in bookkeeping, as the fleet grows: the known_hosts
lookups (two per connection, in a file that lists every node, plain or hashed names) and loading the
identity key (encrypted: its KDF). Against, in the same run, how it was done before: the file parsed for
each lookup and each hashed entry checked through paramiko, the key loaded for each connection.

    python -m benchmarks.node_costs [--nodes 10,100,1000,10000] [--json FILE]

CPU time of this process (time.process_time), per node: each way's lookups on a sample of the fleet's nodes
(`sampled_nodes`; a lookup in a hashed file is linear in the file either way, and the old way in a plain one
too, so every node of 10,000 would take minutes), plus, for the new way, parsing the file once, spread over
the fleet. No network: the lookups are what SSHConnection's handshake does with the file.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleetfix.transport import hostkeys, ssh
from fleetfix.transport._paramiko import HostKeys, PKey
from fleetfix.transport.hostkeys import KnownHostEntry, KnownHosts, known_hosts_name, load_known_hosts

OFFERED = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
SAMPLE = 40  # nodes


def node_address(index: int) -> tuple[str, int]:
    """A node's name and port, for the file only: nothing here connects (.test is reserved, RFC 6761)."""
    return f"pve{index}.fleet.test", 22


def write_known_hosts(path: Path, nodes: int, key_line: str, *, hashed: bool) -> None:
    lines = []
    for index in range(nodes):
        name = known_hosts_name(*node_address(index))
        lines.append(f"{HostKeys.hash_host(name) if hashed else name} {key_line}\n")
    path.write_text("".join(lines))


def old_entries_for(path: Path, name: str) -> list[KnownHostEntry]:
    """The lookup before this change: the whole file parsed, every entry matched, paramiko hashing."""
    def matches(entry: KnownHostEntry) -> bool:
        hit = False
        for pattern in entry.patterns:
            negated = pattern.startswith("!")
            pattern = pattern[1:] if negated else pattern
            if pattern.startswith("|1|"):
                found = HostKeys.hash_host(name, pattern) == pattern
            else:
                found = hostkeys._pattern_regex(pattern).fullmatch(name) is not None
            if found and negated:
                return False
            hit = hit or found
        return hit
    return [entry for entry in load_known_hosts(path) if matches(entry)]


def cpu_per_node(nodes: Sequence[int], connect: Callable[[int], object]) -> float:
    started = time.process_time()
    for index in nodes:
        connect(index)
    return (time.process_time() - started) / len(nodes)


def measure_known_hosts(work: Path, nodes: int, key: PKey, key_line: str, *, hashed: bool) -> dict[str, Any]:
    path = work / f"known_hosts-{nodes}-{'hashed' if hashed else 'plain'}"
    write_known_hosts(path, nodes, key_line, hashed=hashed)
    hostkeys._indexes.clear()

    def new_way(index: int) -> None:  # what one connection's handshake does (transport/ssh.py)
        known = KnownHosts(str(path))
        address, port = node_address(index)
        known.preferred_algorithms(address, port, OFFERED)
        known.verify(address, port, key, accept_new=False)

    def old_way(index: int) -> None:
        name = known_hosts_name(*node_address(index))
        for _ in range(2):
            assert old_entries_for(path, name), name

    sample = range(0, nodes, max(1, nodes // SAMPLE))
    started = time.process_time()
    hostkeys._index_of(path)  # the file parsed once, for the whole fleet
    new = (time.process_time() - started) / nodes + cpu_per_node(sample, new_way)
    old = cpu_per_node(sample, old_way)
    return {"nodes": nodes, "hashed": hashed, "old_ms_per_node": old * 1000, "new_ms_per_node": new * 1000,
            "sampled_nodes": len(sample), "old_fleet_s": old * nodes, "new_fleet_s": new * nodes}


def measure_key(work: Path, nodes: int) -> dict[str, Any]:
    """An ed25519 key encrypted by ssh-keygen with its default KDF rounds (16), loaded for every node."""
    path = work / "id_ed25519"
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "bench-passphrase", "-f", str(path)],
                       check=True)
    os.environ[ssh.PASSPHRASE_ENV] = "bench-passphrase"
    ssh._keys.clear()
    started = time.process_time()
    ssh._load_private_key(str(path), str(path), "bench-passphrase")
    one_load = time.process_time() - started
    new = cpu_per_node(range(nodes), lambda _: ssh.load_private_key(str(path)))
    return {"nodes": nodes, "old_ms_per_node": one_load * 1000, "new_ms_per_node": new * 1000,
            "old_fleet_s": one_load * nodes, "new_fleet_s": new * nodes}


def run(steps: Sequence[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host")], check=True)
        key_type, blob = (work / "host.pub").read_text().split()[:2]
        key = PKey.from_type_string(key_type, base64.b64decode(blob))
        known_hosts = [measure_known_hosts(work, n, key, f"{key_type} {blob}", hashed=hashed)
                       for n in steps for hashed in (False, True)]
        keys = [measure_key(work, n) for n in steps]
    return {"loadavg": os.getloadavg(), "known_hosts": known_hosts, "identity_key": keys}


def render(report: dict[str, Any]) -> str:
    lines = [f"per-node bookkeeping, CPU ms per node (load average {report['loadavg'][0]:.2f})",
             f"{'nodes':>7} {'':<18} {'before':>9} {'now':>8} {'fleet before':>13} {'fleet now':>10}"]
    for row in report["known_hosts"]:
        kind = "hashed" if row["hashed"] else "plain"
        lines.append(f"{row['nodes']:>7} {'known_hosts ' + kind:<18} {row['old_ms_per_node']:9.3f} "
                     f"{row['new_ms_per_node']:8.3f} {row['old_fleet_s']:12.2f}s {row['new_fleet_s']:9.2f}s")
    for row in report["identity_key"]:
        lines.append(f"{row['nodes']:>7} {'identity key (KDF)':<18} {row['old_ms_per_node']:9.3f} "
                     f"{row['new_ms_per_node']:8.3f} {row['old_fleet_s']:12.2f}s {row['new_fleet_s']:9.2f}s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node_costs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="10,100,1000,10000", help="fleet sizes, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run([int(n) for n in args.nodes.split(",")])
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
