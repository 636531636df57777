"""Dialling a node before paramiko is loaded: the TCP connection and the SSH identification line go out
first, and paramiko (with `cryptography`, a slow import) loads while they travel.

Why: for one target, start-up was most of the time to a result (docs/performance.md). An SSH connection
starts with both sides sending their identification line (RFC 4253 4.2); the server answers ours with its
own and its KEXINIT without waiting for anything else, and forks and re-execs its session process
meanwhile. Sending ours from a plain socket, before the import, lets that round trip
and the server's work overlap the import instead of following it. paramiko then starts on the connected
socket, told that its identification line was sent already (`DialledSocket.send` drops paramiko's copy of
it, which must be byte for byte the one sent: it is part of the key exchange hash, `local_version`).

No paramiko here, on purpose: this module is what runs before it is imported.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from typing import Any

from fleetfix import __version__
from fleetfix.errors import (
    ConnectError,
    ConnectRefusedError,
    ConnectTimeoutError,
    NameResolutionError,
    TransportError,
    one_line,
)
from fleetfix.target import SSHSettings

# Our identification line (RFC 4253 4.2: "SSH-protoversion-softwareversion", no spaces or dashes in the
# software version). paramiko's own would name paramiko's version, which is not known before the import.
CLIENT_VERSION = f"SSH-2.0-fleetfix_{__version__}"
_LINE = (CLIENT_VERSION + "\r\n").encode()


class DialledSocket(socket.socket):
    """A connected socket whose identification line has been sent: the first send of that same line
    (paramiko's, as its transport starts) is dropped instead of sent twice."""

    identification_pending: bool = False

    def send(self, data: Any, flags: int = 0) -> int:
        if self.identification_pending:
            self.identification_pending = False
            if bytes(data) == _LINE:
                return len(data)
            # Not the line we sent: the connection is unusable (the server read ours already).
            raise TransportError("SSH identification line mismatch: paramiko's local_version was not set")
        return super().send(data, flags)


def open_socket(settings: SSHSettings) -> socket.socket:
    """A TCP connection to the node, connect errors mapped to TransportErrors (one line each)."""
    endpoint = f"{settings.address}:{settings.port}"
    try:
        sock = socket.create_connection((settings.address, settings.port), timeout=settings.connect_timeout)
    except socket.gaierror as error:
        raise NameResolutionError(f"{endpoint}: cannot resolve host: {error.strerror}") from None
    except TimeoutError:
        raise ConnectTimeoutError(
            f"{endpoint}: connect timed out after {settings.connect_timeout:g}s") from None
    except ConnectionRefusedError:
        raise ConnectRefusedError(f"{endpoint}: connection refused") from None
    except OSError as error:
        raise ConnectError(f"{endpoint}: {error.strerror or one_line(error)}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def dial(settings: SSHSettings) -> DialledSocket:
    """Connect to the node and send our identification line; hand the socket to SSHConnection(sock=...)."""
    plain = open_socket(settings)
    dialled = DialledSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
    try:
        dialled.settimeout(settings.connect_timeout)
        dialled.sendall(_LINE)
    except OSError as error:
        dialled.close()
        reason = error.strerror or one_line(error)
        raise ConnectError(f"{settings.address}:{settings.port}: {reason}") from None
    dialled.identification_pending = True
    return dialled


# -- dialling ahead -----------------------------------------------------------------------------------------
# A command that knows its nodes dials them at once (dial_ahead), before importing the fleet runner and
# paramiko; the fleet's connector then takes the socket (take) instead of dialling. Daemon threads: a
# connect waits on the network, not the interpreter, and a command that fails before it connects leaves
# its parked sockets to the process's exit.

_parked: dict[tuple[Any, ...], tuple[threading.Event, list[DialledSocket | TransportError]]] = {}
_parked_lock = threading.Lock()


def dial_ahead(nodes: Iterable[SSHSettings], *, limit: int) -> None:
    """Start dialling these nodes (the first `limit` distinct ones: what the fleet connects first; a node
    dialled long before its turn could outlast sshd's LoginGraceTime). Jump-host nodes are left to the
    connector (their socket is a channel of another connection)."""
    chosen: dict[tuple[Any, ...], SSHSettings] = {}
    for settings in nodes:
        if settings.jump_host is None and len(chosen) < limit:
            chosen.setdefault(settings.key, settings)
    for key, settings in chosen.items():
        with _parked_lock:
            if key in _parked:
                continue
            entry: tuple[threading.Event, list[DialledSocket | TransportError]] = (threading.Event(), [])
            _parked[key] = entry
        threading.Thread(target=_dial_into, args=(settings, entry), name="dial-ahead", daemon=True).start()


def _dial_into(settings: SSHSettings,
               entry: tuple[threading.Event, list[DialledSocket | TransportError]]) -> None:
    done, box = entry
    try:
        box.append(dial(settings))
    except TransportError as error:
        box.append(error)
    finally:
        done.set()


def take(settings: SSHSettings) -> DialledSocket | None:
    """The socket dial_ahead opened for this node (waiting for it if it is still connecting), once; None
    if it was not dialled ahead. Raises what dialling raised."""
    with _parked_lock:
        entry = _parked.pop(settings.key, None)
    if entry is None:
        return None
    done, box = entry
    done.wait()
    found = box[0]
    if isinstance(found, TransportError):
        raise found
    return found
