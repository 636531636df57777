"""A Fleet's node connections: one per node for the Fleet's lifetime, opened once, shared by its guests.

- a node's connection is keyed by `SSHSettings.key` (every setting that affects trust), so two nodes share
  a connection only when they would be trusted the same way;
- it is opened on first use under a per-node lock: concurrent first uses wait for that one attempt, and a
  node that cannot be connected keeps its one-line reason, so every target of it reports the same error
  without a second attempt;
- `start_connecting` opens them in the background ahead of `Fleet.map` (dial-ahead);
- `privileged_transport` wraps a node's transport in sudo when its settings say `become`.

paramiko is imported only when the first SSH connection is made (the default connector), so importing this
module stays cheap for `--help` and for tests with a fake connector.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from fleetfix.errors import ConfigError, FleetfixError, UnexpectedError
from fleetfix.fleet.outcome import describe
from fleetfix.secrets import resolve_reference
from fleetfix.target import SSHSettings, Target
from fleetfix.transport.base import (
    CommandResult,
    FeedableTransport,
    NodeTransport,
    OutputSink,
    Transport,
)
from fleetfix.transport.local import LocalTransport


class NodeConnection(Protocol):
    """What a connector returns: an open connection to one node (`ssh.SSHConnection` in production)."""

    label: str

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult: ...

    def close(self) -> None: ...


# Opens a connection to a node or raises a TransportError (ConnectError, HostKeyError, ...).
Connector = Callable[[SSHSettings], NodeConnection]


@dataclass
class _NodeSlot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    connection: NodeConnection | None = None
    error: FleetfixError | None = None  # the first connect failure, reported for every target of the node


# A node's connection holds its socket open for the Fleet's lifetime: the descriptors a run needs grow with
# its nodes. PER_NODE leaves room for a second descriptor per node; HEADROOM is the rest of the process
# (the interpreter, records, the audit store, SFTP transfers, the pipes of a local target).
DESCRIPTORS_PER_NODE = 2
DESCRIPTOR_HEADROOM = 256


def ensure_descriptors(nodes: int) -> None:
    """Before a run connects `nodes` nodes: raise this process's soft RLIMIT_NOFILE to what they need, up to
    the hard limit (any process may), or refuse with the limit and the fix before any node is dialled, instead
    of failing nodes one by one with EMFILE midway (Linux's default soft limit is 1024)."""
    import resource

    need = DESCRIPTORS_PER_NODE * nodes + DESCRIPTOR_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(
            f"{nodes} nodes need about {need} open files, and this process may open at most {hard} "
            f"(RLIMIT_NOFILE, hard limit): raise it (`ulimit -n {need}` as root, or LimitNOFILE={need} in "
            "the service's systemd unit), or run on fewer nodes at once with --limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def node_key(target: Target) -> Hashable:
    """Which connection the target's node is reached over (this machine's nodes: one each, by name)."""
    ssh = target.node.ssh
    return ssh.key if ssh is not None else ("local", target.node.name)


class Connections:
    """The node connections of one Fleet. channels_per_node bounds each connection's open channels, so
    anything running on a node (targets, node facts, a batch) shares that one bound."""

    def __init__(self, connect: Connector | None, *, channels_per_node: int, max_output: int) -> None:
        self.channels_per_node = channels_per_node
        self.max_output = max_output
        self._connect = connect or self._connect_ssh
        self._slots: dict[Hashable, _NodeSlot] = {}
        self._passwords: dict[str, str] = {}  # become_password reference -> its value
        self._lock = threading.Lock()
        self._dialler: ThreadPoolExecutor | None = None  # start_connecting's threads

    def node_transport(self, target: Target) -> Transport:
        """The transport of the target's node. Connects on first use; raises the node's (kept)
        TransportError if it cannot be reached."""
        settings = target.node.ssh
        if settings is None:
            return LocalTransport(label=target.node.name, max_output=self.max_output)
        return NodeTransport(self._connection(settings), label=target.node.name)

    def privileged_transport(self, target: Target) -> Transport:
        """The node's transport for what needs root there: through sudo when the node's settings say
        `become` (transport/become.py), else the node's own."""
        node = self.node_transport(target)
        settings = target.node.ssh
        if settings is None or settings.become is None:
            return node
        from fleetfix.transport.become import BecomeTransport

        become = settings.become
        password = None
        if become.password is not None:
            with self._lock:  # resolved once per Fleet: reading an env var or a 0600 file each time is waste
                if become.password not in self._passwords:
                    self._passwords[become.password] = resolve_reference(become.password, "become_password")
                password = self._passwords[become.password]
        return BecomeTransport(node, become, password=password, node_name=target.node.name)

    def feedable_node_transport(self, target: Target) -> FeedableTransport | None:
        """The node's transport as root, when its commands can take stdin over time (SSH, this machine);
        None through become, since sudo rules name commands and cannot allow a driver script."""
        settings = target.node.ssh
        if settings is None:
            return LocalTransport(label=target.node.name, max_output=self.max_output)
        if settings.become is not None:
            return None
        connection = self._connection(settings)
        return connection if isinstance(connection, FeedableTransport) else None

    def _connection(self, settings: SSHSettings) -> NodeConnection:
        with self._lock:
            slot = self._slots.setdefault(settings.key, _NodeSlot())
        with slot.lock:  # concurrent first use of one node waits here instead of opening a second connection
            if slot.connection is not None:
                return slot.connection
            if slot.error is not None:
                raise slot.error
            try:
                slot.connection = self._connect(settings)
            except FleetfixError as error:
                slot.error = error
                raise
            except Exception as error:
                slot.error = UnexpectedError(f"{settings.address}:{settings.port}: {describe(error)}")
                raise slot.error from error
            return slot.connection

    def _connect_ssh(self, settings: SSHSettings) -> NodeConnection:
        # Dial first, then import paramiko while the TCP handshake, our identification line and the
        # server's answer travel: the import and the round trips overlap (transport/dial.py).
        from fleetfix.transport.dial import dial, take

        dialled = None if settings.jump_host else (take(settings) or dial(settings))
        try:
            from fleetfix.transport import ssh  # deferred: paramiko is slow to import
        except BaseException:
            if dialled is not None:
                dialled.close()
            raise
        return ssh.connect(settings, max_channels=self.channels_per_node, max_output=self.max_output,
                           dialled=dialled)

    def start_connecting(self, targets: Sequence[Target], *, limit: int) -> None:
        """Open the targets' node connections in the background now, at most `limit` at once. A failure is
        kept in the node's slot and reported by the first use, as if it had connected there."""
        nodes = {node_key(t): t.node.ssh for t in targets if t.node.ssh is not None}
        if not nodes:
            return
        # paramiko first, here and alone: every handshake waits for it, and imported by the connecting
        # threads while this one went on to its own imports the two would share the interpreter lock and
        # the first handshake would start later.
        from fleetfix.transport import ssh  # noqa: F401
        with self._lock:
            if self._dialler is None:
                self._dialler = ThreadPoolExecutor(min(limit, len(nodes)), thread_name_prefix="dial")
            dialler = self._dialler
        for settings in nodes.values():
            dialler.submit(self._connect_quietly, settings)

    def _connect_quietly(self, settings: SSHSettings) -> None:
        with contextlib.suppress(FleetfixError):  # kept in the slot: the first use reports it per target
            self._connection(settings)

    def close(self) -> None:
        """Close every connection (the next use reconnects)."""
        with self._lock:
            dialler, self._dialler = self._dialler, None
        if dialler is not None:  # connections still being opened land in their slots first
            dialler.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            if slot.connection is not None:
                slot.connection.close()
