"""Where a target's concurrency is decided: `Fleet.map` runs one function per target, over one connection
per node (fleet/connections.py).

Shape of a run:
- targets are grouped by node (the node's connection key); at most `forks` nodes are worked on at once;
- each node is connected once, before its targets fan out; a node that cannot be connected marks all its
  targets "unreachable" with the same one-line reason;
- once a node's targets in this map are done, its connection is spare: kept for a later map while there is
  room (`forks` spare connections, shared with dial-ahead), else closed (fleet/connections.py). So a run
  holds at most 2 x forks connections (and paramiko threads) open, however many nodes it has;
- a node's targets run concurrently, at most `channels_per_node` at a time (the connection's channel limit
  enforces the same bound for anything else running on it, such as node facts);
- one target's failure never stops the others; results come back in input order (fleet/outcome.py);
- with `start`, a target can be started without a thread of its own (`Pending`: a node's containers that
  share one channel, fleet/batches.py); the node's own thread starts its targets, up to
  `channels_per_node` in flight, and finishes each as its result comes in;
- `interrupt()` (the CLI calls it on the first Ctrl-C, through `interrupt_all`) stops the Fleet from
  starting any more targets, in this map and every later one: targets not yet started come back
  "failed" with a `Interrupted` error, targets already running finish (their own timeouts still apply),
  so the caller can write its records and print its recap.

No other module starts a thread per target or bounds how many run: the node batches and the node-facts
cache (fleet/batches.py) only hand `map` what to start, and dial-ahead is bounded by `forks` here.
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
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from fleetfix.errors import FleetfixError
from fleetfix.fleet.connections import Connections, Connector, ensure_descriptors, node_key
from fleetfix.fleet.outcome import EventHandler, Outcome, call, not_started, report
from fleetfix.guests import Guest, open_guest
from fleetfix.target import Target
from fleetfix.transport.base import DEFAULT_MAX_OUTPUT, FeedableTransport, Transport

R = TypeVar("R")
DEFAULT_FORKS = 32
DEFAULT_CHANNELS_PER_NODE = 8  # OpenSSH's MaxSessions is 10


@dataclass(frozen=True)
class Pending(Generic[R]):
    """A started target whose result another thread delivers: what a `StartFn` returns instead of holding a
    thread until the target ends. Why: starting, waking and ending a thread per target in flight cost more
    controller CPU than a probe's own parsing and diagnosis (docs/performance.md).

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


def _ssh_nodes(targets: Sequence[Target]) -> int:
    """How many SSH connections the targets' nodes need (this machine's nodes need none)."""
    return len({node_key(target) for target in targets if target.node.ssh is not None})


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
        # As many spare connections (dialled ahead, or idle for a later map) as nodes worked on at once.
        self._connections = Connections(connect, channels_per_node=channels_per_node, max_output=max_output,
                                        spare=forks)
        self._interrupted = threading.Event()
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
        return self._connections.privileged_transport(target)

    def node_transport(self, target: Target) -> Transport:
        """The transport of the target's node (one command per node, e.g. node facts). Connects on first
        use; raises the node's (kept) TransportError if it cannot be reached."""
        return self._connections.node_transport(target)

    def feedable_node_transport(self, target: Target) -> FeedableTransport | None:
        """The node's transport as root (no become: sudo rules name commands, not a driver script) when its
        commands can take stdin over time (SSH, this machine), else None. For running many of the node's
        containers over one channel (guests/pctbatch.py)."""
        return self._connections.feedable_node_transport(target)

    def start_connecting(self, targets: Sequence[Target]) -> None:
        """Open the targets' node connections in the background now (at most `forks` at once); `map` then
        finds them open or opening. A command calls this as soon as it knows its targets, before importing
        what it needs afterwards (the probe's models and rules, rich, ...): those imports then overlap the
        round trips of the SSH handshakes instead of preceding them. A failure is kept for the node and
        reported by `map`, as if it had connected there."""
        if not self._interrupted.is_set():
            self._ensure_descriptors(targets)
            self._connections.start_connecting(targets, limit=self.forks)

    # -- running --------------------------------------------------------------------------------------

    def map(
        self, targets: Sequence[Target], fn: Callable[[Target, Transport], R], *,
        on_event: EventHandler | None = None, start: StartFn[R] | None = None,
    ) -> list[Outcome[R]]:
        """Call fn(target, transport) for every target; one Outcome per target, in input order. With start,
        each target is first offered to start (see `Pending`); fn runs for those it returns None for."""
        self._ensure_descriptors(targets)
        run = _Map(self, targets, fn, start, on_event)
        by_node: dict[Hashable, list[int]] = {}
        for index, target in enumerate(targets):
            by_node.setdefault(node_key(target), []).append(index)
        groups = list(by_node.values())
        if len(groups) == 1:
            run.run_node(groups[0])
        else:
            with ThreadPoolExecutor(min(self.forks, len(groups))) as pool:
                list(pool.map(run.run_node, groups))  # list(): re-raise a bug in an on_event handler
        return [outcome for outcome in run.outcomes if outcome is not None]

    def _ensure_descriptors(self, targets: Sequence[Target]) -> None:
        """The descriptors for the most connections open at once: the nodes worked on (forks) and the spare
        ones (dialled ahead or idle), never more than the nodes."""
        nodes = _ssh_nodes(targets)
        ensure_descriptors(nodes, min(nodes, self.forks + self._connections.spare), self.forks)

    # -- lifetime -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every node connection (the next use reconnects)."""
        with _live_fleets_lock:
            _live_fleets.discard(self)
        self._connections.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Map(Generic[R]):
    """One call of `Fleet.map`: its targets, what runs for each, and the outcomes so far (by index)."""

    def __init__(self, fleet: Fleet, targets: Sequence[Target], fn: Callable[[Target, Transport], R],
                 start: StartFn[R] | None, on_event: EventHandler | None) -> None:
        self.fleet = fleet
        self.targets = targets
        self.fn = fn
        self.start = start
        self.on_event = on_event
        self.outcomes: list[Outcome[R] | None] = [None] * len(targets)

    def run_node(self, indices: list[int]) -> None:
        """One node's targets, over its connection while they run (then it is spare or closed)."""
        with self.fleet._connections.working_on([self.targets[index] for index in indices]):
            self._run_node(indices)

    def _run_node(self, indices: list[int]) -> None:
        """One node's targets: on this thread if it is one, staged with `start`, else on threads."""
        if not self.fleet.interrupted:  # an interrupted Fleet does not even connect
            # Connect once, before fanning out. A failure is kept for the node and each target below
            # reports it as unreachable.
            with contextlib.suppress(FleetfixError):
                self.fleet.node_transport(self.targets[indices[0]])
        if len(indices) == 1 or self.fleet.interrupted:
            for index in indices:
                self.run_one(index)
        elif self.start is not None:
            _StagedNode(self, self.start, self.fleet.channels_per_node).run(indices)
        else:
            with ThreadPoolExecutor(min(self.fleet.channels_per_node, len(indices))) as pool:
                list(pool.map(self.run_one, indices))

    def run_one(self, index: int) -> None:
        """The target function for one target, on this thread."""
        begun = self.begin(index)
        if begun is not None:
            self.done(index, call(self.fn, self.targets[index], *begun))

    def begin(self, index: int) -> tuple[Transport, float] | None:
        """Say the target starts; its transport and start time, or None once its outcome is in: not started
        (interrupted: checked per target, in-flight ones are left to finish) or its node unreachable."""
        target = self.targets[index]
        if self.fleet.interrupted:
            self.done(index, not_started(target))
            return None
        if self.on_event:
            self.on_event("start", target, "")
        started = time.monotonic()
        try:
            return self.fleet.transport(target), started
        except FleetfixError as error:  # the node could not be connected
            self.done(index, Outcome(target, "unreachable", error=error, duration=time.monotonic() - started))
            return None

    def done(self, index: int, outcome: Outcome[R]) -> None:
        self.outcomes[index] = outcome
        report(outcome, self.on_event)


class _StagedNode(Generic[R]):
    """One node's targets run from the node's thread: each is offered to `start`; the Pending ones finish
    here as their results come in, the others run on threads as in `Fleet.map`. At most `channels` are in
    flight, Pending or not; an interrupt starts no more, as in `Fleet.map`."""

    def __init__(self, run: _Map[R], start: StartFn[R], channels: int) -> None:
        self._run = run
        self._start = start
        self._channels = channels
        self._ready: queue.SimpleQueue[int] = queue.SimpleQueue()  # indices whose result is in
        self._pending: dict[int, tuple[Pending[R], Transport, float]] = {}  # with its transport, start time
        self._threaded: dict[int, Future[None]] = {}  # index -> the thread running fn for it
        self._pool: ThreadPoolExecutor | None = None

    def run(self, indices: list[int]) -> None:
        try:
            for index in indices:
                while len(self._pending) + len(self._threaded) >= self._channels:
                    self._finish_next()
                self._begin(index)
            while self._pending or self._threaded:
                self._finish_next()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _begin(self, index: int) -> None:
        begun = self._run.begin(index)
        if begun is None:
            return
        transport, started = begun
        target = self._run.targets[index]
        try:
            pending = self._start(target, transport, functools.partial(self._ready.put, index))
        except RunOnThread:
            pending = None
        except Exception as error:
            self._run.done(index, Outcome.since(target, error, started))
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
        target = self._run.targets[index]
        try:
            value = pending.finish()
        except RunOnThread:
            self._on_thread(index, transport, started)
        except Exception as error:
            self._run.done(index, Outcome.since(target, error, started))
        else:
            self._run.done(index, Outcome(target, "ok", value=value, duration=time.monotonic() - started))

    def _on_thread(self, index: int, transport: Transport, started: float) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._channels)
        self._threaded[index] = self._pool.submit(self._run_threaded, index, transport, started)

    def _run_threaded(self, index: int, transport: Transport, started: float) -> None:
        try:
            self._run.done(index, call(self._run.fn, self._run.targets[index], transport, started))
        finally:
            self._ready.put(index)
