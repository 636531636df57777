"""Talking to a real qemu-ga through QEMU's agent socket, as qemu-server's QMPClient does.

PVE connects to /var/run/qemu-server/VMID.qga (a QEMU `-chardev socket,server=on` wired to the
virtio-serial port `org.qemu.guest_agent.0`), one connection per command, and writes two lines: a
`guest-sync-delimited` with a fresh id, then the command. The agent answers the sync with a 0xFF byte
before its JSON (so a reader can skip whatever an earlier, abandoned command left in the channel), then the
command's answer. QMPClient.pm (qemu-server, read at e6352be):

- `$qmpcmd = to_json({execute => 'guest-sync-delimited', arguments => {id => int($cmd->{id})}}) . "\\n"
  . to_json({execute => ..., arguments => ...}) . "\\n"`; the id is `"$$" . "0" . $seq` (pid, "0", counter);
- the reply is parsed with `s/^.*\\xff([^\\n]+}\\r?\\n[^\\n]+})\\r?\\n(.*)$/$2/so`, a sync answer with an
  older id is skipped ("skip results from previous commands"), another id dies "got wrong command id";
- connecting retries every 100 ms until the command's timeout; guest-ping has 3 s (Agent.pm
  qga_check_running), guest-exec and guest-exec-status the default 5 s; running out is "got timeout".

QEMU's socket chardev serves one client at a time: a second `qm` waits in the listen backlog until the
first one closes. Standard library only, lean (the bed's `qm` pays for its imports on every call).
"""

from __future__ import annotations

import json
import os
import socket
import time

PING_TIMEOUT = 3.0
DEFAULT_TIMEOUT = 5.0
CONNECT_RETRY_SECONDS = 0.1
_sequence = 0


class AgentError(OSError):
    """No answer: the socket is missing or refuses, or the agent did not answer in time (PVE's words)."""


def _next_id() -> int:
    global _sequence
    _sequence += 1
    return int(f"{os.getpid()}0{_sequence}")


def _connect(path: str, deadline: float) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as error:
            sock.close()
            if isinstance(error, FileNotFoundError) or time.monotonic() >= deadline:
                raise AgentError(f"unable to connect to VM qga socket - {error.strerror}") from None
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise AgentError("unable to connect to VM qga socket - timeout") from None
        time.sleep(CONNECT_RETRY_SECONDS)


def command(path: str, execute: str, arguments: dict[str, object] | None = None,
            timeout: float = DEFAULT_TIMEOUT) -> dict[str, object]:
    """One agent command on its own connection; the agent's answer object ({"return": ...} or
    {"error": {...}}). AgentError when nothing (complete) came back within timeout."""
    deadline = time.monotonic() + timeout
    sync_id = _next_id()
    request = {"execute": execute, "arguments": arguments or {}}
    payload = (json.dumps({"execute": "guest-sync-delimited", "arguments": {"id": sync_id}}) + "\n"
               + json.dumps(request) + "\n").encode()
    with _connect(path, deadline) as sock:
        sock.sendall(payload)
        buffer = b""
        while True:
            start = buffer.rfind(b"\xff")
            if start >= 0:
                lines = buffer[start + 1:].split(b"\n")
                if len(lines) >= 3:  # sync answer, command answer, and what follows the last newline
                    synced = json.loads(lines[0])
                    got = synced.get("return")
                    if not isinstance(got, int) or got < sync_id:
                        buffer = b"\n".join(lines[2:])  # an older command's answer: drop it, keep reading
                        continue
                    if got != sync_id:
                        raise AgentError(f"got wrong command id '{got}' (expected {sync_id})")
                    answer: dict[str, object] = json.loads(lines[1])
                    return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError("got timeout")
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                raise AgentError("got timeout") from None
            if not chunk:
                raise AgentError("the agent socket closed before the answer was complete")
            buffer += chunk


def ping(path: str, timeout: float = PING_TIMEOUT) -> bool:
    try:
        return "return" in command(path, "guest-ping", timeout=timeout)
    except (AgentError, ValueError):
        return False
