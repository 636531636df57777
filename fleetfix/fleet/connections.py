"""A Fleet's node connections: one per node at a time, opened on first use, shared by its guests.

- a node's connection is keyed by `SSHSettings.key` (every setting that affects trust), so two nodes share
  a connection only when they would be trusted the same way;
- it is opened on first use under a per-node lock: concurrent first uses wait for that one attempt, and a
  node that cannot be connected keeps its one-line reason, so every target of it reports the same error
  without a second attempt;
- `Fleet.map` works on a node inside `working_on(its targets)`; once no map works on it, its connection is
  spare: kept open for a later map of the same run (apply plans, then runs) while there is room, else
  closed. Spare connections (idle ones and those dialled ahead) are at most `spare`, so with `forks` nodes
  worked on at once a run holds at most forks + spare connections, each with its socket and paramiko's
  thread, however many nodes it has;
- `start_connecting` opens them in the background ahead of `Fleet.map` (dial-ahead), in the map's order,
  no further ahead than that room;
- a connection asked for outside a map's own targets (a wheel builder's node, discovery's API node) is
  the caller's to keep using: it stays open until the Fleet closes, as every connection did before;
- `privileged_transport` wraps a node's transport in sudo when its settings say `become`.

paramiko is imported only when the first SSH connection is made (the default connector), so importing this
module stays cheap for `--help` and for tests with a fake connector.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
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
    # The fields below are guarded by Connections._lock.
    users: int = 0  # map groups working on the node now
    members: set[int] = field(default_factory=set)  # id() of those groups' targets: their own requests
    mapped: bool = False  # a map has worked on it: dial-ahead leaves it alone
    kept: bool = False  # asked for outside a map's own targets: open until the Fleet closes
    spare: str = ""  # "ahead" (dialled for a map) or "idle" (its map is done) while in Connections._spare


# A connection holds its socket open while it lasts: PER_CONNECTION leaves room for a second descriptor per
# connection; HEADROOM is the rest of the process (the interpreter, records, the audit store, SFTP transfers,
# the pipes of a local target, and the few connections kept outside a map: a wheel builder's node).
DESCRIPTORS_PER_CONNECTION = 2
DESCRIPTOR_HEADROOM = 256


def ensure_descriptors(nodes: int, connections: int, forks: int) -> None:
    """Before a run on `nodes` nodes holds up to `connections` of them open at once (Fleet: forks + spare):
    raise this process's soft RLIMIT_NOFILE to what they need, up to the hard limit (any process may), or
    refuse with the limit and the fix before any node is dialled, instead of failing nodes one by one with
    EMFILE midway (Linux's default soft limit is 1024)."""
    import resource

    need = DESCRIPTORS_PER_CONNECTION * connections + DESCRIPTOR_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(
            f"{nodes} nodes at --forks {forks} hold up to {connections} connections at once, which need "
            f"about {need} open files, and this process may open at most {hard} (RLIMIT_NOFILE, hard "
            f"limit): raise it (`ulimit -n {need}` as root, or LimitNOFILE={need} in the service's systemd "
            "unit), or lower --forks")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def node_key(target: Target) -> Hashable:
    """Which connection the target's node is reached over (this machine's nodes: one each, by name)."""
    ssh = target.node.ssh
    return ssh.key if ssh is not None else ("local", target.node.name)


class Connections:
    """The node connections of one Fleet. channels_per_node bounds each connection's open channels, so
    anything running on a node (targets, node facts, a batch) shares that one bound. spare bounds the open
    connections no map works on (dialled ahead, or idle once their map is done)."""

    def __init__(self, connect: Connector | None, *, channels_per_node: int, max_output: int,
                 spare: int) -> None:
        self.channels_per_node = channels_per_node
        self.max_output = max_output
        self.spare = spare
        self._connect = connect or self._connect_ssh
        self._slots: dict[Hashable, _NodeSlot] = {}
        self._passwords: dict[str, str] = {}  # become_password reference -> its value
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a spare place came free, or the Fleet is closing
        self._spare: OrderedDict[Hashable, _NodeSlot] = OrderedDict()  # oldest first
        self._closing = False
        self._dialler: ThreadPoolExecutor | None = None  # start_connecting's threads

    def node_transport(self, target: Target) -> Transport:
        """The transport of the target's node. Connects on first use; raises the node's (kept)
        TransportError if it cannot be reached."""
        settings = target.node.ssh
        if settings is None:
            return LocalTransport(label=target.node.name, max_output=self.max_output)
        return NodeTransport(self._connection(settings, target), label=target.node.name)

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
        connection = self._connection(settings, target)
        return connection if isinstance(connection, FeedableTransport) else None

    def _connection(self, settings: SSHSettings, target: Target | None) -> NodeConnection:
        """The node's connection, opened now if it is not open. target None: dial-ahead's own request."""
        with self._lock:
            slot = self._slots.setdefault(settings.key, _NodeSlot())
            if target is not None and id(target) not in slot.members and not slot.kept:
                # Not a map's own target: whoever asks may go on using it after any map is done with the node.
                slot.kept = True
                self._unspare(settings.key, slot)
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

    # -- a map's nodes: in use, spare, closed ------------------------------------------------------------

    @contextlib.contextmanager
    def working_on(self, targets: Sequence[Target]) -> Iterator[None]:
        """A map works on the targets' node (all of one node) inside this: requests for these targets use
        the node's connection without keeping it; once no map works on the node, it becomes spare (or is
        closed, if there is no room)."""
        settings = targets[0].node.ssh
        if settings is None:  # this machine: no connection
            yield
            return
        key, ids = settings.key, {id(target) for target in targets}
        with self._lock:
            slot = self._slots.setdefault(key, _NodeSlot())
            slot.users += 1
            slot.mapped = True
            slot.members |= ids
            self._unspare(key, slot)
        try:
            yield
        finally:
            self._release(key, slot, ids)

    def _release(self, key: Hashable, slot: _NodeSlot, ids: set[int]) -> None:
        closing: list[NodeConnection] = []
        with self._lock:
            slot.users -= 1
            slot.members -= ids
            if slot.users or slot.kept or slot.connection is None or self._closing:
                return
            if len(self._spare) >= self.spare and not self._evict_idle(closing):
                closing.append(self._take_connection(slot))  # no room: closed now
            else:
                slot.spare = "idle"
                self._spare[key] = slot
                self._room.notify_all()  # dial-ahead may evict it
        for connection in closing:
            connection.close()

    def _unspare(self, key: Hashable, slot: _NodeSlot) -> None:  # with self._lock held
        if slot.spare:
            slot.spare = ""
            del self._spare[key]
            self._room.notify_all()

    def _evict_idle(self, closing: list[NodeConnection]) -> bool:  # with self._lock held
        """Close the longest idle spare connection (onto closing, to close outside the lock), if any."""
        for key, slot in self._spare.items():
            if slot.spare == "idle":
                self._unspare(key, slot)
                closing.append(self._take_connection(slot))
                return True
        return False

    @staticmethod
    def _take_connection(slot: _NodeSlot) -> NodeConnection:
        # With Connections._lock held: every request registers under it first (working_on, a kept
        # request, dial-ahead), so none can be handed this connection while it is being closed.
        connection, slot.connection = slot.connection, None
        assert connection is not None
        return connection

    def start_connecting(self, targets: Sequence[Target], *, limit: int) -> None:
        """Open the targets' node connections in the background now, at most `limit` at once and no further
        ahead than there is spare room. A failure is kept in the node's slot and reported by the first use,
        as if it had connected there."""
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
        """Dial-ahead for one node: once there is spare room, unless a map or a caller has come to it."""
        key = settings.key
        closing: list[NodeConnection] = []
        with self._lock:
            while True:
                slot = self._slots.setdefault(key, _NodeSlot())
                if self._closing or slot.mapped or slot.kept or slot.connection is not None \
                        or slot.error is not None:
                    return
                if len(self._spare) < self.spare or self._evict_idle(closing):
                    break
                self._room.wait()
            slot.spare = "ahead"
            self._spare[key] = slot
        for connection in closing:
            connection.close()
        try:
            with contextlib.suppress(FleetfixError):  # kept in the slot: the first use reports it per target
                self._connection(settings, None)
        finally:
            closing = []
            with self._lock:
                if slot.connection is None and slot.spare:  # it failed: its room is free again
                    self._unspare(key, slot)
                elif slot.connection is not None and slot.mapped \
                        and not (slot.users or slot.kept or slot.spare):
                    closing.append(self._take_connection(slot))  # a map was done with it before it opened
            for connection in closing:
                connection.close()

    def close(self) -> None:
        """Close every connection (the next use reconnects)."""
        with self._lock:
            dialler, self._dialler = self._dialler, None
            self._closing = True
            self._room.notify_all()
        if dialler is not None:  # connections still being opened land in their slots first
            dialler.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
            self._spare.clear()
            self._closing = False
        for slot in slots:
            if slot.connection is not None:
                slot.connection.close()
