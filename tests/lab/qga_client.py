"""Talking to a test-bed VM's guest agent (tests/lab/qga.py) on its socket, as PVE's QMP client does.

Lean on purpose (json and socket only): every `qm guest exec` of the stand-in pays for its imports.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

PING_TIMEOUT = 3.0  # PVE::QemuServer::Agent::qga_check_running: guest-ping with timeout => 3


class AgentUnavailable(OSError):
    """Nothing answered on the agent's socket."""


def request(path: str | Path, message: dict[str, object], timeout: float | None = None) -> dict[str, object]:
    """One request, one answer; AgentUnavailable (an OSError) when nothing answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            with sock.makefile("rb") as stream:
                line = stream.readline()
    except OSError as error:
        raise AgentUnavailable(str(error)) from None
    if not line:
        raise AgentUnavailable("the agent closed the connection")
    answer: dict[str, object] = json.loads(line)
    return answer


def ping(path: str | Path, timeout: float = PING_TIMEOUT) -> bool:
    try:
        return "return" in request(path, {"execute": "guest-ping"}, timeout=timeout)
    except AgentUnavailable:
        return False


def agent_enabled(value: str | None) -> bool:
    """Whether a config's `agent:` value enables the channel: `1`, `enabled=1,...` (PVE's
    parse_guest_agent: the default key is `enabled`, a boolean)."""
    if value is None:
        return False
    first = value.split(",", 1)[0].strip()
    flag = first.partition("=")[2] if first.startswith("enabled=") else first
    return flag.strip().lower() in ("1", "yes", "on", "true")
