"""The fleet runner: run one function per target, concurrently, over one SSH connection per node.

Shape of a run (`Fleet.map`):
- targets are grouped by node (`SSHSettings.key`: every setting that affects trust, so two nodes share a
  connection only when they would be trusted the same way); at most `forks` nodes are worked on at once;
- each node's connection is opened lazily, once for the Fleet's lifetime, under a per-node lock, and shared
  by the node and all its containers; a node that cannot be connected marks all its targets
  "unreachable" with the same one-line reason, after one attempt;
- a node's targets run concurrently, at most `channels_per_node` at a time (the connection's channel limit
  enforces the same bound for anything else running on it, such as node facts);
- one target's failure never stops the others; results come back in input order;
- with `start`, a target can be started without a thread of its own (`Pending`: a node's containers that
  share one channel, guests/pctbatch.py); the node's own thread starts its targets, up to
  `channels_per_node` in flight, and finishes each as its result comes in;
- `interrupt()` (the CLI calls it on the first Ctrl-C, through `interrupt_all`) stops the Fleet from
  starting any more targets, in this map and every later one: targets not yet started come back
  "failed" with a `Interrupted` error, targets already running finish (their own timeouts still apply),
  so the caller can write its records and print its recap.

paramiko is imported only when the first SSH connection is made (the default connector), so importing this
module stays cheap for `--help` and for tests with a fake connector.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, BinaryIO, Generic, Literal, Protocol, TypeVar

from fleetfix.errors import (
    BecomeError,
    FleetfixError,
    GuestError,
    Interrupted,
    TransferError,
    UnexpectedError,
)
from fleetfix.guests import Guest, open_guest
from fleetfix.secrets import resolve_reference
from fleetfix.target import SSHSettings, Target
from fleetfix.transport.base import (
    DEFAULT_MAX_OUTPUT,
    CommandResult,
    FeedableTransport,
    FileTransport,
    OutputSink,
    Transferred,
    Transport,
)
from fleetfix.transport.local import LocalTransport

R = TypeVar("R")
Status = Literal["ok", "failed", "unreachable"]
DEFAULT_FORKS = 32
DEFAULT_CHANNELS_PER_NODE = 8  # OpenSSH's MaxSessions is 10


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
# on_event(kind, target, detail): kind is "start", then one of "ok" / "failed" / "unreachable" with the
# error's one-line message as detail. Called from worker threads: the handler must be thread-safe.
EventHandler = Callable[[str, Target, str], None]


@dataclass(frozen=True)
class Pending(Generic[R]):
    """A started target whose result another thread delivers: what a `StartFn` returns instead of holding a
    thread until the target ends. Why: a thread per target in flight (started, woken, ended) cost more
    controller CPU than a probe's own parsing and diagnosis; 200 batched containers cost ~70 ms less on
    their nodes' threads (issue 21, docs/performance.md).

    finish() runs on the node's thread once `notify` was called, or once `deadline` (time.monotonic())
    has passed without it; it returns the target's value or raises as the target function would, or
    raises `RunOnThread` to have the target function run for it after all."""

    deadline: float
    finish: Callable[[], R]


class RunOnThread(Exception):
    """Raised by `StartFn` or `Pending.finish`: run the target function for this target, on a thread."""


# start(target, transport, notify): start the target without waiting for it and return its Pending, calling
# notify() (from any thread, once) when its result is in; or return None: run the target function for it.
StartFn = Callable[[Target, Transport, Callable[[], None]], Pending[R] | None]


@dataclass(frozen=True)
class Outcome(Generic[R]):
    target: Target
    status: Status
    value: R | None = None
    error: FleetfixError | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, target: Target, error: Exception, duration: float) -> Outcome[Any]:
        """How an exception raised for a target is recorded, never raised on: a stopped, missing or
        agent-less guest, or sudo refused, is unreachable (nothing ran, like a node down); any other
        FleetfixError failed; anything else is a bug, failed as an UnexpectedError, and the others go on."""
        if isinstance(error, (GuestError, BecomeError)):
            return cls(target, "unreachable", error=error, duration=duration)
        if isinstance(error, FleetfixError):
            return cls(target, "failed", error=error, duration=duration)
        wrapped = UnexpectedError(f"unexpected error: {_describe(error)}")
        wrapped.__cause__ = error
        return cls(target, "failed", error=wrapped, duration=duration)


@dataclass
class _NodeSlot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    connection: NodeConnection | None = None
    error: FleetfixError | None = None  # the first connect failure, reported for every target of the node


# Every Fleet not yet closed, so a signal handler can reach the ones doing work (weak: a Fleet that is
# dropped without close() must not be kept alive by this).
_live_fleets: weakref.WeakSet[Fleet] = weakref.WeakSet()
_live_fleets_lock = threading.Lock()


def interrupt_all() -> int:
    """Interrupt every open Fleet (see `Fleet.interrupt`); returns how many there were. Safe to call from a
    signal handler: it only sets events."""
    with _live_fleets_lock:
        fleets = list(_live_fleets)
    for fleet in fleets:
        fleet.interrupt()
    return len(fleets)


class Fleet:
    def __init__(
        self, *, forks: int = DEFAULT_FORKS, channels_per_node: int = DEFAULT_CHANNELS_PER_NODE,
        connect: Connector | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> None:
        """max_output: what one command's stdout (and stderr) may hold in memory, per target
        (transport.base.CappedOutput)."""
        if forks < 1 or channels_per_node < 1:
            raise ValueError("forks and channels_per_node must be at least 1")
        self.forks = forks
        self.channels_per_node = channels_per_node
        self.max_output = max_output
        self._connect = connect or self._connect_ssh
        self._slots: dict[Hashable, _NodeSlot] = {}
        self._passwords: dict[str, str] = {}  # become_password reference -> its value
        self._slots_lock = threading.Lock()
        self._interrupted = threading.Event()
        self._dialler: ThreadPoolExecutor | None = None  # start_connecting's threads
        with _live_fleets_lock:
            _live_fleets.add(self)

    # -- interruption ---------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Start no more targets (in-flight ones finish). Irreversible for this Fleet."""
        self._interrupted.set()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    # -- transports -----------------------------------------------------------------------------------

    def transport(self, target: Target) -> Transport:
        """The target's transport: commands inside its guest, over its node's connection."""
        return self.guest(target).transport()

    def guest(self, target: Target) -> Guest:
        """The target's guest driver (exec, status, snapshots), over its node's privileged transport."""
        return open_guest(target, self.privileged_transport(target))

    def privileged_transport(self, target: Target) -> Transport:
        """The node's transport for what needs root there (`pct`, `qm`, `pvesh`, a node's own work):
        through sudo when the node's settings say `become` (transport/become.py), else the node's own."""
        node = self.node_transport(target)
        settings = target.node.ssh
        if settings is None or settings.become is None:
            return node
        from fleetfix.transport.become import BecomeTransport

        become = settings.become
        password = None
        if become.password is not None:
            with self._slots_lock:  # resolved once per Fleet: an env var or a 0600 file
                if become.password not in self._passwords:
                    self._passwords[become.password] = resolve_reference(become.password, "become_password")
                password = self._passwords[become.password]
        return BecomeTransport(node, become, password=password, node_name=target.node.name)

    def node_transport(self, target: Target) -> Transport:
        """The transport of the target's node (one command per node, e.g. node facts). Connects on first
        use; raises the node's (cached) TransportError if it cannot be reached."""
        settings = target.node.ssh
        if settings is None:
            return LocalTransport(label=target.node.name, max_output=self.max_output)
        return _NodeTransport(self._connection(settings), label=target.node.name)

    def feedable_node_transport(self, target: Target) -> FeedableTransport | None:
        """The node's transport as root (no become: sudo rules name commands, not a driver script) when its
        commands can take stdin over time (SSH, this machine), else None. For running many of the node's
        containers over one channel (guests/pctbatch.py)."""
        settings = target.node.ssh
        if settings is None:
            return LocalTransport(label=target.node.name, max_output=self.max_output)
        if settings.become is not None:
            return None
        connection = self._connection(settings)
        return connection if isinstance(connection, FeedableTransport) else None

    def _connection(self, settings: SSHSettings) -> NodeConnection:
        with self._slots_lock:
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
                slot.error = UnexpectedError(f"{settings.address}:{settings.port}: {_describe(error)}")
                raise slot.error from error
            return slot.connection

    def _connect_ssh(self, settings: SSHSettings) -> NodeConnection:
        # Dial first, then import paramiko (~60-90 ms, the first time) while the TCP handshake, our
        # identification line and the server's answer travel: see transport/dial.py.
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

    def start_connecting(self, targets: Sequence[Target]) -> None:
        """Open the targets' node connections in the background now (at most `forks` at once); `map` then
        finds them open or opening. A command calls this as soon as it knows its targets, before importing
        what it needs afterwards (the probe's models and rules, rich, ...): those imports then overlap the
        round trips of the SSH handshakes instead of preceding them (issue 21). A failure is kept in the
        node's slot and reported by `map`, as if it had connected there."""
        nodes = {_node_key(t): t.node.ssh for t in targets if t.node.ssh is not None}
        if not nodes or self._interrupted.is_set():
            return
        # paramiko first, here and alone: every handshake waits for it, and imported by the connecting
        # threads while this one went on to its own imports, the two shared the interpreter lock and the
        # first handshake started ~0.24 s after the dial instead of ~0.08 s (one target, issue 21).
        from fleetfix.transport import ssh  # noqa: F401
        with self._slots_lock:
            if self._dialler is None:
                self._dialler = ThreadPoolExecutor(min(self.forks, len(nodes)), thread_name_prefix="dial")
            dialler = self._dialler
        for settings in nodes.values():
            dialler.submit(self._connect_quietly, settings)

    def _connect_quietly(self, settings: SSHSettings) -> None:
        with contextlib.suppress(FleetfixError):  # kept in the slot: map reports it per target
            self._connection(settings)

    # -- running --------------------------------------------------------------------------------------

    def map(
        self, targets: Sequence[Target], fn: Callable[[Target, Transport], R], *,
        on_event: EventHandler | None = None, start: StartFn[R] | None = None,
    ) -> list[Outcome[R]]:
        """Call fn(target, transport) for every target; one Outcome per target, in input order. With start,
        each target is first offered to start (see `Pending`); fn runs for those it returns None for."""
        outcomes: list[Outcome[R] | None] = [None] * len(targets)
        by_node: dict[Hashable, list[int]] = {}
        for index, target in enumerate(targets):
            by_node.setdefault(_node_key(target), []).append(index)

        def run_one(index: int) -> None:
            if self._interrupted.is_set():  # checked per target: in-flight ones are left to finish
                outcomes[index] = self._not_started(targets[index], on_event)
                return
            outcomes[index] = self._run_target(targets[index], fn, on_event)

        def run_node(indices: list[int]) -> None:
            first = targets[indices[0]]
            if self._interrupted.is_set():  # do not even connect
                for index in indices:
                    run_one(index)
                return
            # Connect once, before fanning out. A failure is cached in the node's slot and each target
            # below reports it as unreachable.
            with contextlib.suppress(FleetfixError):
                self.node_transport(first)
            if len(indices) == 1:
                run_one(indices[0])
            elif start is not None:
                _StagedNode(self, targets, fn, start, on_event, outcomes).run(indices)
            else:
                with ThreadPoolExecutor(min(self.channels_per_node, len(indices))) as pool:
                    list(pool.map(run_one, indices))

        groups = list(by_node.values())
        if len(groups) == 1:
            run_node(groups[0])
        else:
            with ThreadPoolExecutor(min(self.forks, len(groups))) as pool:
                list(pool.map(run_node, groups))  # list(): re-raise a bug in an on_event handler
        return [outcome for outcome in outcomes if outcome is not None]

    def _not_started(self, target: Target, on_event: EventHandler | None) -> Outcome[Any]:
        outcome: Outcome[Any] = Outcome(target, "failed", error=Interrupted("interrupted: not started"))
        if on_event:
            on_event(outcome.status, target, str(outcome.error))
        return outcome

    def _run_target(
        self, target: Target, fn: Callable[[Target, Transport], R], on_event: EventHandler | None
    ) -> Outcome[R]:
        begun = self._begin_target(target, on_event)
        outcome = begun if isinstance(begun, Outcome) else _call(fn, target, *begun)
        _report(outcome, on_event)
        return outcome

    def _begin_target(self, target: Target, on_event: EventHandler | None
                      ) -> tuple[Transport, float] | Outcome[Any]:
        """Say the target starts; its transport and start time, or its Outcome if its node is unreachable."""
        if on_event:
            on_event("start", target, "")
        started = time.monotonic()
        try:
            return self.transport(target), started
        except FleetfixError as error:  # the node could not be connected
            return Outcome(target, "unreachable", error=error, duration=time.monotonic() - started)

    # -- lifetime -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every node connection (the next use reconnects)."""
        with _live_fleets_lock:
            _live_fleets.discard(self)
        with self._slots_lock:
            dialler, self._dialler = self._dialler, None
        if dialler is not None:  # connections still being opened land in their slots first
            dialler.shutdown(wait=True, cancel_futures=True)
        with self._slots_lock:
            slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            if slot.connection is not None:
                slot.connection.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _StagedNode(Generic[R]):
    """One node's targets run from the node's thread: each is offered to `start`; the Pending ones finish
    here as their results come in, the others run on threads as in `Fleet.map`. At most
    `channels_per_node` are in flight, Pending or not; an interrupt starts no more, as in `Fleet.map`."""

    def __init__(
        self, fleet: Fleet, targets: Sequence[Target], fn: Callable[[Target, Transport], R],
        start: StartFn[R], on_event: EventHandler | None, outcomes: list[Outcome[R] | None],
    ) -> None:
        self._fleet = fleet
        self._targets = targets
        self._fn = fn
        self._start = start
        self._on_event = on_event
        self._outcomes = outcomes
        self._ready: queue.SimpleQueue[int] = queue.SimpleQueue()  # indices whose result is in
        self._pending: dict[int, tuple[Pending[R], Transport, float]] = {}  # with its transport, start time
        self._threaded: dict[int, Future[None]] = {}  # index -> the thread running fn for it
        self._pool: ThreadPoolExecutor | None = None

    def run(self, indices: list[int]) -> None:
        try:
            for index in indices:
                while len(self._pending) + len(self._threaded) >= self._fleet.channels_per_node:
                    self._finish_next()
                self._begin(index)
            while self._pending or self._threaded:
                self._finish_next()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _begin(self, index: int) -> None:
        target = self._targets[index]
        if self._fleet.interrupted:
            self._outcomes[index] = self._fleet._not_started(target, self._on_event)
            return
        begun = self._fleet._begin_target(target, self._on_event)
        if isinstance(begun, Outcome):
            self._done(index, begun)
            return
        transport, started = begun
        try:
            pending = self._start(target, transport, functools.partial(self._ready.put, index))
        except RunOnThread:
            pending = None
        except Exception as error:
            self._done(index, _failure(target, error, started))
            return
        if pending is None:
            self._on_thread(index, transport, started)
        else:
            self._pending[index] = (pending, transport, started)

    def _finish_next(self) -> None:
        """Wait for one target in flight to end, and finish it."""
        deadline = min((pending.deadline for pending, _, _ in self._pending.values()), default=None)
        try:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            index = self._ready.get(timeout=wait)
        except queue.Empty:  # the earliest deadline passed: that target is done waiting
            index = min(self._pending, key=lambda i: self._pending[i][0].deadline)
        if index in self._threaded:  # its thread recorded the outcome
            self._threaded.pop(index).result()  # re-raises a bug in an on_event handler, as Fleet.map does
            return
        if index not in self._pending:  # a late notify for a target that timed out already
            return
        pending, transport, started = self._pending.pop(index)
        target = self._targets[index]
        try:
            value = pending.finish()
        except RunOnThread:
            self._on_thread(index, transport, started)
        except Exception as error:
            self._done(index, _failure(target, error, started))
        else:
            self._done(index, Outcome(target, "ok", value=value, duration=time.monotonic() - started))

    def _on_thread(self, index: int, transport: Transport, started: float) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._fleet.channels_per_node)
        self._threaded[index] = self._pool.submit(self._run_threaded, index, transport, started)

    def _run_threaded(self, index: int, transport: Transport, started: float) -> None:
        try:
            self._done(index, _call(self._fn, self._targets[index], transport, started))
        finally:
            self._ready.put(index)

    def _done(self, index: int, outcome: Outcome[R]) -> None:
        self._outcomes[index] = outcome
        _report(outcome, self._on_event)


class _NodeTransport:
    """A node connection under the target's name (the connection itself is shared, not owned)."""

    def __init__(self, connection: NodeConnection, label: str) -> None:
        self.connection = connection
        self.label = label

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        return self.connection.execute(argv, stdin=stdin, timeout=timeout, on_output=on_output)

    # Files go to the connection when it can carry them (SSH: SFTP); guests stage their transfers here.
    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        return self._files().upload(source, path, mode=mode, max_bytes=max_bytes)

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        return self._files().download(path, sink, max_bytes=max_bytes)

    def remove(self, path: str) -> None:
        self._files().remove(path)

    def _files(self) -> FileTransport:
        if not isinstance(self.connection, FileTransport):
            raise TransferError(f"{self.label}: this node connection cannot transfer files")
        return self.connection


def _call(fn: Callable[[Target, Transport], R], target: Target, transport: Transport, started: float
          ) -> Outcome[R]:
    try:
        value = fn(target, transport)
    except Exception as error:
        return _failure(target, error, started)
    return Outcome(target, "ok", value=value, duration=time.monotonic() - started)


def _report(outcome: Outcome[Any], on_event: EventHandler | None) -> None:
    if on_event:
        on_event(outcome.status, outcome.target, str(outcome.error or ""))


def _failure(target: Target, error: Exception, started: float) -> Outcome[Any]:
    return Outcome.failed(target, error, time.monotonic() - started)


def _node_key(target: Target) -> Hashable:
    ssh = target.node.ssh
    return ssh.key if ssh is not None else ("local", target.node.name)


def _describe(error: BaseException) -> str:
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
