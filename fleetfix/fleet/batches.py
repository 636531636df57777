"""One script on every target, with the node's containers batched: what the probe runs its scripts through.

`run_scripts(fleet, targets, job, finish)` sends `job.script(target)` to every target on sh's stdin and
hands finish() each target's output once its script has ended; it returns one `Outcome` per target, from
`Fleet.map`. The caller says what to run and how to read it (a `ScriptJob`); what runs where, and how many
at once, is decided here and in `Fleet.map`:

- containers of one node that get the same script (the same `job.key`) share one channel
  (guests/pctbatch.py): the first of them to start opens it, the node's thread feeds each id as the Fleet
  starts that target and finishes it as its result comes in (Fleet's staged targets: no thread waits for
  one). Nodes with one such container, or reached through become, or whose connection cannot feed stdin
  over time (a test's fake), run each container on its own channel, as does anything a batch could not
  answer;
- the node script runs once per node, for the targets on the node's kernel (a VM has its own kernel and
  driver: it never asks), started beside the first of them instead of before it: in that target's batch if
  it has one (no channel or thread of its own), else on a thread and channel of its own. The others go on
  to their own scripts and wait for it only when their own has ended.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from fleetfix.errors import FleetfixError
from fleetfix.fleet.outcome import Outcome
from fleetfix.fleet.run import Fleet, Pending, RunOnThread
from fleetfix.guests import NODE_BATCHES
from fleetfix.guests.pctbatch import BatchCommand, PctBatch, Submitted
from fleetfix.target import Target
from fleetfix.transport.base import SHELL_STDIN, CommandResult, Transport, command_line, run_script

N = TypeVar("N")
R = TypeVar("R")


# ScriptJob, NodeScript and Ran are plain classes, not dataclasses: the probe's start-up imports this
# module, and making a dataclass costs several times what a plain class does.


class NodeScript(Generic[N]):
    """A script run on the node itself, once, for the targets on the node's kernel; `parse` reads its
    stdout (exit 0 only) once per node."""

    __slots__ = ("parse", "script", "timeout")

    def __init__(self, script: str, timeout: float, parse: Callable[[str], N]) -> None:
        self.script = script
        self.timeout = timeout
        self.parse = parse


class ScriptJob(Generic[N]):
    """What `run_scripts` runs and how its results are read; nothing here says how many run at once.

    name: what the script is called in a timeout's message ("probe"); script(target): the target's script
    as sent, the same for targets with the same key(target), so targets of one node with equal keys can
    share a batch; on_first_start: called once, as the first target's script goes out."""

    __slots__ = ("key", "name", "node", "on_first_start", "script", "timeout")

    def __init__(self, name: str, script: Callable[[Target], str], key: Callable[[Target], Hashable],
                 timeout: float, node: NodeScript[N], on_first_start: Callable[[], object] | None = None,
                 ) -> None:
        self.name = name
        self.script = script
        self.key = key
        self.timeout = timeout
        self.node = node
        self.on_first_start = on_first_start


class Ran(Generic[N]):
    """A target whose script has ended: its output, not read yet, and its node's parsed result."""

    __slots__ = ("duration", "node", "stdout", "target")

    def __init__(self, target: Target, stdout: str, node: N | None, duration: float) -> None:
        self.target = target
        self.stdout = stdout
        self.node = node
        self.duration = duration


def script_output(result: CommandResult, job: ScriptJob[N]) -> str:
    """The output in a script's result; a timeout is the target's failure."""
    if result.timed_out:
        raise FleetfixError(f"{job.name} timed out after {job.timeout:.0f}s")
    return result.stdout


def run_scripts(fleet: Fleet, targets: Sequence[Target], job: ScriptJob[N],
                finish: Callable[[Ran[N]], R]) -> list[Outcome[R]]:
    """One Outcome per target, in input order: ok with what finish made of its output, or why not."""
    run = _ScriptRun(fleet, targets, job, finish)
    try:
        return fleet.map(targets, run.on_channel, start=run.in_batch)
    finally:
        run.batches.close()


class _ScriptRun(Generic[N, R]):
    """One `run_scripts`: the two ways a target's script runs (its own channel, or its node's batch)."""

    def __init__(self, fleet: Fleet, targets: Sequence[Target], job: ScriptJob[N],
                 finish: Callable[[Ran[N]], R]) -> None:
        self._fleet = fleet
        self._job = job
        self._finish = finish
        self._node = _NodeOnce(fleet, job)
        self.batches: NodeBatches[N] = NodeBatches(fleet, targets, job)
        self._first = threading.Lock()

    def on_channel(self, target: Target, transport: Transport) -> R:
        """A target on a channel of its own."""
        started = time.monotonic()
        on_node_kernel = self._begin(target)
        result = run_script(transport, self._job.script(target), timeout=self._job.timeout)
        return self._ended(target, script_output(result, self._job), on_node_kernel, started)

    def in_batch(self, target: Target, _transport: Transport, notify: Callable[[], None]
                 ) -> Pending[R] | None:
        """A target in its node's batch, without a thread waiting for it (None: not batched)."""
        started = time.monotonic()
        submitted = self.batches.submit(target, notify)
        if submitted is None:
            return None  # on_channel begins it
        batch, fed = submitted
        on_node_kernel = self._begin(target, batch)

        def finished() -> R:
            result = batch.result(fed)
            if result is None:  # the batch could not run it: on a channel of its own
                raise RunOnThread
            return self._ended(target, script_output(result, self._job), on_node_kernel, started)

        return Pending(fed.deadline, finished)

    def _begin(self, target: Target, batch: PctBatch | None = None) -> bool:
        """What every target starts with; whether the node script's result applies to it."""
        if self._job.on_first_start is not None and self._first.acquire(blocking=False):
            self._job.on_first_start()  # the first target is connected: its script goes out now
        # The node's kernel module is the driver only for guests on the node's kernel (not a VM's).
        on_node_kernel = self._fleet.guest(target).shares_node_kernel
        if on_node_kernel:
            self._node.start(target, batch)
        return on_node_kernel

    def _ended(self, target: Target, stdout: str, on_node_kernel: bool, started: float) -> R:
        node = self._node.get(target) if on_node_kernel else None
        return self._finish(Ran(target, stdout, node, time.monotonic() - started))


class _NodeOnce(Generic[N]):
    """The node script's parsed result, gathered once per node by whichever of its targets comes first."""

    def __init__(self, fleet: Fleet, job: ScriptJob[N]) -> None:
        self._fleet = fleet
        self._job = job
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._results: dict[str, N | None] = {}
        self._batched: dict[str, tuple[PctBatch, Submitted]] = {}  # the node script runs in this batch

    def _node_lock(self, target: Target) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(target.node.name, threading.Lock())

    def start(self, target: Target, batch: PctBatch | None = None) -> None:
        """Start the node script if no target of the node has, alongside this target's own script: in its
        batch if it has one, else on a thread and channel of its own. `get` waits for it."""
        name = target.node.name
        if name in self._results or name in self._batched:  # the node's later targets: nothing to start
            return
        node_lock = self._node_lock(target)
        if not node_lock.acquire(blocking=False):
            return
        submitted = batch.submit_node() if batch is not None else None
        if batch is not None and submitted is not None:  # the batch's thread answers; `get` waits for it
            with self._lock:
                self._batched[name] = (batch, submitted)
            node_lock.release()
            return
        threading.Thread(target=self._fill_then_release, args=(target, node_lock), daemon=True,
                         name=f"node-script-{name}").start()

    def _fill_then_release(self, target: Target, node_lock: threading.Lock) -> None:
        try:
            # A failure is not kept: `get` tries again on the target's own thread and raises it there.
            with contextlib.suppress(Exception):
                self._fill(target)
        finally:
            node_lock.release()

    def get(self, target: Target) -> N | None:
        """The node's result, gathered now or waited for if another target is gathering it."""
        with self._node_lock(target):
            self._fill(target)
            return self._results[target.node.name]

    def _fill(self, target: Target) -> None:  # with the node's lock held
        if target.node.name not in self._results:
            self._results[target.node.name] = self._gather(target)

    def _gather(self, target: Target) -> N | None:
        node = self._job.node
        with self._lock:
            batched = self._batched.get(target.node.name)
        result = batched[0].node_result(batched[1], node.timeout) if batched is not None else None
        if result is None:  # no batch, or it could not run the script: a channel of its own
            result = run_script(self._fleet.node_transport(target), node.script, timeout=node.timeout)
        if not result.ok:
            return None
        return node.parse(result.stdout)


class NodeBatches(Generic[N]):
    """The batches of one `run_scripts`, one per node and script key, opened by their first target."""

    # The script travels as one argument of the node's command line; Linux limits one argument to 128 KiB
    # (MAX_ARG_STRLEN), and this leaves room for the quoting.
    MAX_COMMAND_LINE = 100_000

    def __init__(self, fleet: Fleet, targets: Sequence[Target], job: ScriptJob[N]) -> None:
        self._fleet = fleet
        self._job = job
        self._expected: dict[tuple[str, Hashable], int] = {}
        for target in targets:
            if target.guest.kind in NODE_BATCHES:
                key = self._key(target)
                self._expected[key] = self._expected.get(key, 0) + 1
        self._batches: dict[tuple[str, Hashable], PctBatch | None] = {}
        self._lock = threading.Lock()

    def _key(self, target: Target) -> tuple[str, Hashable]:
        return target.node.name, self._job.key(target)

    def submit(self, target: Target, notify: Callable[[], None]) -> tuple[PctBatch, Submitted] | None:
        """Feed the target to its node's batch (PctBatch.submit), or None: run it on its own channel."""
        key = self._key(target)
        if self._expected.get(key, 0) < 2 or target.guest.id is None:
            return None
        with self._lock:
            if key not in self._batches:
                self._batches[key] = self._open(target, key)
            batch = self._batches[key]
        if batch is None:
            return None
        submitted = batch.submit(target.guest.id, notify)
        return None if submitted is None else (batch, submitted)

    def _open(self, target: Target, key: tuple[str, Hashable]) -> PctBatch | None:
        node = self._fleet.feedable_node_transport(target)
        if node is None:
            return None
        script = self._job.script(target)
        if len(command_line([script])) > self.MAX_COMMAND_LINE:  # as quoted for the node's shell
            return None
        command = BatchCommand(SHELL_STDIN, script, self._job.timeout, self._job.node.script)
        make = NODE_BATCHES[target.guest.kind]
        return make(node, target.node.name, command, max_output=self._fleet.max_output,
                    expected=self._expected[key])

    def close(self) -> None:
        """No more targets: each node finishes what it runs and ends its channel."""
        with self._lock:
            batches = [batch for batch in self._batches.values() if batch is not None]
        for batch in batches:
            batch.close()
