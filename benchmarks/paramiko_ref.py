"""The minimal paramiko reference (issue 21): what the same remote work costs with paramiko and nothing else.

    python -m benchmarks.paramiko_ref SPEC.json      (the spec of benchmarks/fleetfix_run.py)

One paramiko connection per node (through the latency proxy, the node's host key checked against the lab's
known_hosts, key auth, AES-GCM first as fleetfix does), and per container one exec channel running
`pct exec CT -- /bin/sh -s` with fleetfix's probe script on stdin (`with_buffered_stdout`, as fleetfix
sends it), reading stdout to EOF and the exit status; the node-facts script once per node on its own
channel. At most `forks` nodes at once and `channels_per_node` channels per node, like fleetfix. No
parsing, no diagnosis, no error mapping, no watchdog, no output caps: the floor of a Python controller.
Prints one JSON line: how many containers answered with exit 0 and output that parses as JSON.
"""

from __future__ import annotations

import functools
import json
import resource
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paramiko

from fleetfix.probe import build_node_script, build_probe_script
from fleetfix.probe.run import with_buffered_stdout

# How long a channel may wait for its next bytes (and to open): a reference that hangs measures nothing,
# and a quiet 1,000-node run once sat for 12 minutes at 12 s of CPU with no way to tell where.
CHANNEL_TIMEOUT = 300.0


def run(transport: paramiko.Transport, command: str, stdin: bytes) -> tuple[int, bytes]:
    channel = transport.open_session(timeout=CHANNEL_TIMEOUT)
    try:
        channel.settimeout(CHANNEL_TIMEOUT)
        channel.exec_command(command)
        channel.sendall(stdin)
        channel.shutdown_write()
        chunks = []
        while data := channel.recv(65536):
            chunks.append(data)
        return channel.recv_exit_status(), b"".join(chunks)
    finally:
        channel.close()


@functools.cache
def _host_keys(path: str) -> paramiko.HostKeys:
    """known_hosts read once per process, not once per node: at 1,000 nodes reading it per node is a
    million key parses, which no controller would do."""
    return paramiko.HostKeys(path)


def node_work(node: dict[str, Any], spec: dict[str, Any], probe: bytes, node_script: bytes) -> int:
    timeout = float(spec.get("timeout", 10))  # seconds to connect and to finish the key exchange
    sock = socket.create_connection((node["address"], node["proxy_port"] or node["port"]), timeout=timeout)
    transport = paramiko.Transport(sock)
    options = transport.get_security_options()
    gcm = "aes128-gcm@openssh.com"
    options.ciphers = (gcm, *(cipher for cipher in options.ciphers if cipher != gcm))
    transport.start_client(timeout=timeout)
    known = _host_keys(spec["known_hosts"])
    key = transport.get_remote_server_key()
    entry = known.lookup(f"[{node['address']}]:{node['port']}")
    if entry is None or entry.get(key.get_name()) != key:
        raise SystemExit(f"{node['name']}: host key not verified")
    transport.auth_publickey("root", paramiko.PKey.from_path(spec["identity"]))
    try:
        with ThreadPoolExecutor(int(spec["channels_per_node"])) as pool:
            facts = pool.submit(run, transport, "/bin/sh -s", node_script)
            results = list(pool.map(lambda ctid: run(transport, f"pct exec {ctid} -- /bin/sh -s", probe),
                                    node["ctids"]))
            facts.result()
        ok = 0
        for status, output in results:
            try:
                json.loads(output)
            except ValueError:
                continue
            ok += status == 0
        return ok
    finally:
        transport.close()


def node_or_none(node: dict[str, Any], spec: dict[str, Any], probe: bytes, node_script: bytes) -> int:
    """node_work, a failure counted as no container answering and said on stderr with the node's name."""
    try:
        return node_work(node, spec, probe, node_script)
    except (OSError, EOFError, paramiko.SSHException, SystemExit) as error:
        print(f"{node['name']}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 0


def main(argv: list[str]) -> int:
    # As fleetfix raises its own soft limit to what its nodes need (fleet/connections.py), the reference
    # takes its hard one: at forks 1,000 it holds 1,000 sockets at once, past the default soft 1,024.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    spec: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    probe = with_buffered_stdout(build_probe_script()).encode()
    node_script = build_node_script().encode()
    with ThreadPoolExecutor(min(int(spec["forks"]), len(spec["nodes"]))) as pool:
        oks = list(pool.map(lambda node: node_or_none(node, spec, probe, node_script), spec["nodes"]))
    targets = sum(len(node["ctids"]) for node in spec["nodes"])
    print(json.dumps({"targets": targets, "ok": sum(oks)}))
    return 0 if sum(oks) == targets else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
