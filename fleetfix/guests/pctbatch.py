"""Many containers of one node over one SSH channel: the node runs their `pct exec`s and frames the results.

Why: every exec channel costs the controller a dozen SSH packets (open, exec request, window, data, EOF,
close, exit status), each handled in Python by paramiko, and the probe's script would go out once per
container. Here a node's containers share one channel and the script is sent once (docs/performance.md
has the measurements).

The protocol. The controller runs the driver (`pctbatch.pl`) on the node with: the backstop in seconds,
the most bytes of one container's stdout (and, apart, stderr) to keep, the bytes every container gets on
stdin (each through a pipe of its own: nothing one container can reopen and write reaches another's
command; docs/security.md, cross-guest paths), a script for the node itself (empty: none), then the command
for `pct exec CTID -- ...`. It writes
container ids to the driver's stdin, one per line, as it starts each target, so the node starts exactly
what the controller started: Fleet's `channels_per_node` and an interrupt (start nothing more) mean what
they mean with a channel per container (fleetfix.fleet decides both; this module only carries them out).
EOF ends the batch once the containers in flight are done. The line `node` instead of an id runs the
batch's node script on the node itself (`submit_node`: the probe's node facts, one channel fewer per node).
Each container's result is one frame, written in one piece when it has ended (the node script's: CTID 0):

    fleetfix-batch CTID EXIT OUTLEN ERRLEN DROPPED\n<OUTLEN bytes of stdout><ERRLEN bytes of stderr>

DROPPED counts the bytes over the cap (cut on the node as they are read). EXIT is pct's exit status, 128+N
for a signal.

Why Perl: `pct` is Perl (pve-container's `src/PVE/CLI/pct.pm`), so wherever there is a pct to run there is
a perl with POSIX and IO::Select. The driver forks once per container, for pct itself: a shell would add a
subshell, `timeout`, `flock` and `cat` per container, which cost the node more CPU per container than a
channel of its own (docs/performance.md).

Timeouts: the watchdog inside the container fires first (`container_argv`, as with a channel each). The
driver's backstop, two to three seconds later (its clock counts whole seconds), SIGKILLs that pct's process
group only: the one-channel backstop (the node's watchdog) `kill -KILL 0`s its session, which here would be
every container of the batch. The controller waits for a frame until the backstop plus FRAME_GRACE_SECONDS,
then reports a timeout.

Whatever the batch cannot answer, `submit` or `result` returns None for, and the caller runs that container
on its own channel: no perl on the node (the driver fails before it reads an id), a lost connection, output
that does not parse as frames.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources

from fleetfix.errors import FleetfixError
from fleetfix.guests.lxc import NODE_BACKSTOP_SECONDS, container_argv, pct_result
from fleetfix.transport.base import TIMEOUT_EXIT_CODE, CommandResult, FeedableTransport, StdinFeed, Stream
from fleetfix.transport.remote import watchdog_seconds

# How long past a container's backstop the controller waits for its frame: the frame is written as soon
# as pct has ended, so this only covers a node too loaded to schedule the write.
FRAME_GRACE_SECONDS = 30.0

@functools.cache
def driver() -> str:
    """The node-side driver's Perl source (read when the first batch is made, not at import)."""
    return resources.files("fleetfix.guests").joinpath("pctbatch.pl").read_text(encoding="utf-8")


_HEADER = re.compile(rb"fleetfix-batch (\d+) (-?\d+) (\d+) (\d+) (\d+)\n")
_MAX_HEADER = 128
NODE_JOB = 0  # the node script's frame id: no container has it (Proxmox CTIDs start at 100)


class BatchCommand:
    """What a batch runs: `argv` in every container (`pct exec CTID -- argv`, under `timeout`), each with
    its own copy of `stdin`, and `node_script` on the node itself ("": none). stdin travels as one argument
    of the node's command line, so it is text and the caller keeps it under Linux's 128 KiB per argument.
    A plain class: making a dataclass costs several times as much, and this module is in every start-up."""

    __slots__ = ("argv", "node_script", "stdin", "timeout")

    def __init__(self, argv: Sequence[str], stdin: str, timeout: float, node_script: str = "") -> None:
        self.argv = argv
        self.stdin = stdin
        self.timeout = timeout
        self.node_script = node_script


@dataclass
class Submitted:
    """One container fed to the batch: its result comes later (`PctBatch.result`)."""

    ctid: int
    deadline: float  # time.monotonic() past which the controller stops waiting for the frame
    notify: Callable[[], None] | None = None  # called once, from the batch's thread, when it is done
    done: threading.Event = field(default_factory=threading.Event)
    fed: float = field(default_factory=time.monotonic)
    result: CommandResult | None = None  # None once done: the batch could not run it

    def finish(self) -> None:
        self.done.set()
        if self.notify is not None:
            self.notify()


@dataclass(frozen=True)
class _Frame:
    ctid: int
    exit_code: int
    stdout: bytes
    stderr: bytes
    dropped: int


class _FrameReader:
    """Frames out of the driver's stdout, chunk by chunk (an OutputSink); `broken` once a header does not
    parse, after which nothing more is read (and on_broken is called, once)."""

    def __init__(self, deliver: Callable[[_Frame], None], on_broken: Callable[[], None]) -> None:
        self._deliver = deliver
        self._on_broken = on_broken
        self._buffer = bytearray()
        self._header: tuple[int, int, int, int, int] | None = None
        self.broken = False

    def __call__(self, stream: Stream, chunk: bytes) -> None:
        if stream != "stdout" or self.broken:
            return  # the driver's own stderr stays in the channel's result
        self._buffer += chunk
        while True:
            if self._header is None and not self._read_header():
                if self.broken:
                    self._on_broken()
                return
            assert self._header is not None
            ctid, exit_code, out_len, err_len, dropped = self._header
            if len(self._buffer) < out_len + err_len:
                return
            stdout, stderr = bytes(self._buffer[:out_len]), bytes(self._buffer[out_len:out_len + err_len])
            del self._buffer[:out_len + err_len]
            self._header = None
            self._deliver(_Frame(ctid, exit_code, stdout, stderr, dropped))

    def _read_header(self) -> bool:
        end = self._buffer.find(b"\n", 0, _MAX_HEADER)
        if end < 0:
            self.broken = len(self._buffer) >= _MAX_HEADER
            return False
        match = _HEADER.fullmatch(bytes(self._buffer[:end + 1]))
        if match is None:
            self.broken = True
            return False
        ctid, exit_code, out_len, err_len, dropped = (int(group) for group in match.groups())
        self._header = (ctid, exit_code, out_len, err_len, dropped)
        del self._buffer[:end + 1]
        return True


class PctBatch:
    """One node's containers running one command (with the same stdin, each its own copy) over one channel.

    `submit(ctid, notify)` starts the batch on first use and feeds the id; once notified (or past the
    deadline), `result(submitted)` is the container's result as `PctTransport.execute` would return it
    (GuestError for a stopped or missing CT, a timeout as timed_out), or None when the batch cannot run
    it: the caller runs it on its own channel then. No thread waits in between (Fleet's staged targets).
    `submit_node()` and `node_result` do the same for `node_script`, run on the node itself.
    `close()` when no more ids will come (the batch also ends by itself after `expected` ids)."""

    def __init__(self, node: FeedableTransport, node_name: str, command: BatchCommand, *, max_output: int,
                 expected: int) -> None:
        self._node = node
        self._node_name = node_name
        self._timeout = command.timeout
        self._backstop = watchdog_seconds(command.timeout) + NODE_BACKSTOP_SECONDS
        self._argv = ("perl", "-e", driver(), "--", str(self._backstop), str(max_output), command.stdin,
                      command.node_script, *container_argv(command.argv, command.timeout))
        self._has_node_script = bool(command.node_script)
        self._expected = expected
        self._fed = 0
        self._feed = StdinFeed()
        self._frames = _FrameReader(self._deliver, on_broken=self._feed.close)  # and nothing more starts
        self._slots: dict[int, Submitted] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ended = False
        self.error: FleetfixError | None = None  # why the batch ended early, if it did

    def submit(self, ctid: int, notify: Callable[[], None] | None = None) -> Submitted | None:
        """Feed the container to the node without waiting for it (None: the batch cannot run it). notify(),
        if given, is called once from the batch's thread when its result is in, or the batch gave up on it."""
        if ctid == NODE_JOB:
            return None
        return self._submit(ctid, notify)

    def submit_node(self) -> Submitted | None:
        """Run the node script on the node, alongside the containers (None: the batch cannot, or has none);
        `node_result` waits for it."""
        return self._submit(NODE_JOB, None) if self._has_node_script else None

    def _submit(self, slot_id: int, notify: Callable[[], None] | None) -> Submitted | None:
        line = "node\n" if slot_id == NODE_JOB else f"{slot_id}\n"
        with self._lock:
            if self._ended or self._frames.broken or slot_id in self._slots:
                return None
            if not self._feed.put(line.encode()):  # closed: the node starts nothing more
                return None
            submitted = Submitted(slot_id, time.monotonic() + self._backstop + FRAME_GRACE_SECONDS, notify)
            self._slots[slot_id] = submitted
            if self._thread is None:
                self._thread = threading.Thread(target=self._run_batch, daemon=True,
                                                name=f"pct-batch-{self._node_name}")
                self._thread.start()
            if slot_id != NODE_JOB:
                self._fed += 1
                if self._fed >= self._expected:
                    self._feed.close()
        return submitted

    def result(self, submitted: Submitted) -> CommandResult | None:
        """A submitted container's result, as `run` returns it; a timeout if it is not done by now."""
        if not submitted.done.is_set():
            return _not_answered(submitted)
        if submitted.result is None:
            return None
        return pct_result(submitted.result, submitted.ctid, self._node_name, self._timeout)

    def node_result(self, submitted: Submitted, timeout: float | None = None) -> CommandResult | None:
        """The node script's result, waited for up to `timeout` seconds after it was fed (at most to its
        deadline; a timeout then); None: the batch could not run it, the caller runs it on a channel of its
        own."""
        until = submitted.deadline if timeout is None else min(submitted.deadline, submitted.fed + timeout)
        submitted.done.wait(max(0.0, until - time.monotonic()))
        return submitted.result if submitted.done.is_set() else _not_answered(submitted)

    def close(self) -> None:
        """No more ids: the node finishes the containers in flight, then the channel ends (or closes with
        the connection)."""
        self._feed.close()

    def _deliver(self, frame: _Frame) -> None:
        with self._lock:
            slot = self._slots.get(frame.ctid)
        if slot is None or slot.done.is_set():
            return
        duration = time.monotonic() - slot.fed
        # The driver's backstop SIGKILLed pct's process group (137): the container's watchdog had not fired.
        timed_out = frame.exit_code == 128 + 9 and duration >= self._backstop
        slot.result = CommandResult(
            TIMEOUT_EXIT_CODE if timed_out else frame.exit_code, frame.stdout.decode(errors="replace"),
            frame.stderr.decode(errors="replace"), duration, timed_out=timed_out, dropped=frame.dropped)
        slot.finish()

    def _run_batch(self) -> None:
        try:
            result = self._node.execute_fed(self._argv, self._feed, on_output=self._frames)
            if not result.ok:
                said = result.stderr.strip()[-200:]
                self.error = FleetfixError(f"{self._node_name}: batch exit {result.exit_code}: {said}")
        except FleetfixError as error:
            self.error = error
        finally:
            self._feed.close()
            with self._lock:
                self._ended = True
                pending = [slot for slot in self._slots.values() if not slot.done.is_set()]
            for slot in pending:  # never answered: each runs on its own channel
                slot.finish()


def _not_answered(submitted: Submitted) -> CommandResult:
    waited = time.monotonic() - submitted.fed
    return CommandResult(TIMEOUT_EXIT_CODE, "", f"no result from the node after {waited:.0f}s\n", waited,
                         timed_out=True)
