"""The seam to the remote side: run an argv with bytes on stdin, get a CommandResult back.

A non-zero exit is data, not an exception (`CommandResult.check()` raises when a caller wants it to).
Only failures to reach or drive the target raise, as `fleetfix.errors.TransportError` subclasses,
mapped from library errors at the seam.
"""

from __future__ import annotations

import functools
import hashlib
import queue
import shlex
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Literal, Protocol, cast, runtime_checkable

from fleetfix.errors import CommandFailedError, TransferError

# POSIX sh reads the script from stdin: no quoting layers, no argument-length limit.
SHELL_STDIN: tuple[str, ...] = ("/bin/sh", "-s")

Stream = Literal["stdout", "stderr"]
# Called with ("stdout" | "stderr", chunk) as output arrives, from the thread running the command (or a
# reader thread of it). Chunks are raw bytes, cut anywhere (even inside a line or a UTF-8 sequence); the
# CommandResult still carries the whole output.
OutputSink = Callable[[Stream, bytes], None]

# What one command's stdout (and, apart, its stderr) may hold in memory. A target that prints more (`cat
# /dev/zero`) keeps running; its first and last halves of the cap are kept and the middle is dropped, so
# the controller's memory does not grow with it. `--max-output` changes it.
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024


def format_size(size: int) -> str:
    """1536 -> "1.5 KiB": sizes in messages."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}".replace(".0 ", " ")
        value /= 1024
    raise AssertionError("unreachable")


def dropped_marker(dropped: int, cap: int) -> bytes:
    """The line put where output was dropped: says the cap and how much is missing."""
    return (f"\n[fleetfix: {dropped} bytes dropped here: output over the {format_size(cap)} cap]\n").encode()


class CappedOutput:
    """A stream's output, at most `cap` bytes kept: the first half and the last half, the middle dropped
    (its size counted). The end of a failing command's output says why it failed; its start says what it
    was doing."""

    def __init__(self, cap: int = DEFAULT_MAX_OUTPUT) -> None:
        if cap < 2:
            raise ValueError("an output cap of at least 2 bytes")
        self.cap = cap
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self._head) < self._head_cap:
            room = self._head_cap - len(self._head)
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_cap:  # trimmed in batches: amortised O(1) per byte
                del self._tail[:len(self._tail) - self._tail_cap]

    @property
    def dropped(self) -> int:
        return max(0, self.total - self.cap)

    def getvalue(self) -> bytes:
        """What was kept; where bytes were dropped, a marker line saying how many and the cap."""
        tail = bytes(self._tail[-self._tail_cap:])
        if not self.dropped:
            return bytes(self._head) + tail
        return bytes(self._head) + dropped_marker(self.dropped, self.cap) + tail


def cap_text(text: str, cap: int) -> str:
    """text cut to about cap bytes of UTF-8 (first and last half kept, with the marker), for records."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= cap:
        return text
    capped = CappedOutput(cap)
    capped.add(data)
    return capped.getvalue().decode("utf-8", "replace")


# The exit code a result carries when its command was killed at its deadline, however the kill came (the
# remote watchdog's KILL, a local kill, qm giving up): coreutils `timeout`'s, the code scripts know, and the
# same whichever transport or guest ran the command.
TIMEOUT_EXIT_CODE = 124


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    dropped: int = 0  # bytes of stdout and stderr not kept (over the output cap); a marker line says where

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> CommandResult:
        if not self.ok:
            tail = (self.stderr or self.stdout).strip().splitlines()[-1:] or [""]
            why = "timed out" if self.timed_out else f"exit {self.exit_code}"
            raise CommandFailedError(f"command failed ({why}): {tail[0]}")
        return self


@runtime_checkable
class Transport(Protocol):
    """Runs commands on one target (a node, a container, or this machine)."""

    label: str

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        """Run argv (no shell on our side) with stdin; return its exit code and output. on_output, if
        given, also sees the output live, chunk by chunk."""
        ...


# What a fed command's result keeps of each stream (its caller reads the output as it comes, through
# on_output): enough for an error message, not a node's worth of container outputs held twice.
FED_RESULT_OUTPUT = 64 * 1024


class StdinFeed:
    """A command's stdin given over time instead of all at once: `put()` chunks from any thread, `close()`
    for EOF. The transport's writer iterates it, blocking until the next chunk (guests/pctbatch.py feeds a
    node the ids of the containers to run as the controller starts them), or takes each chunk in the
    feeding thread (`send_directly`)."""

    def __init__(self) -> None:
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._send: Callable[[bytes | None], bool] | None = None
        self.closed = False

    def put(self, data: bytes) -> bool:
        """Queue data to be written; False (and nothing queued) once closed."""
        with self._lock:
            if self.closed:
                return False
            self._hand_on(data)
            return True

    def close(self) -> None:
        """EOF after what is queued. Idempotent; the transport also closes it when the command ends."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._hand_on(None)

    def send_directly(self, send: Callable[[bytes | None], bool]) -> None:
        """From now on each chunk (None: EOF) goes to send(chunk) in the thread that puts it, what is queued
        first; send returns False when it cannot take a chunk without blocking: that chunk and every later
        one are queued, in order, for `__iter__` (the transport starts its writer then).

        What is queued goes as one chunk: a node's batch queues the ids of its first containers while its
        channel opens, one SSH packet each when sent one by one: several packets per node more, each
        costing the controller CPU in paramiko."""
        with self._lock:
            queued: list[bytes | None] = []
            while not self._chunks.empty():
                queued.append(self._chunks.get_nowait())
            self._send = send
            data = b"".join(chunk for chunk in queued if chunk is not None)
            if data:
                self._hand_on(data)
            if None in queued:  # closed: EOF is the last thing queued
                self._hand_on(None)

    def _hand_on(self, chunk: bytes | None) -> None:  # with the lock held
        if self._send is not None and self._send(chunk):
            return
        self._send = None
        self._chunks.put(chunk)

    def __iter__(self) -> Iterator[bytes]:
        while (chunk := self._chunks.get()) is not None:
            yield chunk


@runtime_checkable
class FeedableTransport(Protocol):
    """A transport whose commands can take their stdin over time (SSH, this machine)."""

    label: str

    def execute_fed(self, argv: Sequence[str], feed: StdinFeed, *, timeout: float | None = None,
                    on_output: OutputSink | None = None) -> CommandResult:
        """Run argv with feed as its stdin: it ends when the command does (after the feed's EOF, for a
        command that reads to the end), or is killed at timeout as `execute`'s are. The feed is closed when
        the command has ended. The output is for on_output: the result keeps at most FED_RESULT_OUTPUT
        bytes of each stream."""
        ...


def feedable(transport: Transport) -> FeedableTransport | None:
    """The transport as one whose commands take stdin over time, or None where it cannot. A transport
    that wraps another (a node's shared connection, a container's `pct exec`) says so through its own
    `feedable()`: whether it can depends on what it wraps."""
    unwrap = getattr(transport, "feedable", None)
    if callable(unwrap):
        return cast("FeedableTransport | None", unwrap())
    return transport if isinstance(transport, FeedableTransport) else None


def replay_output(result: CommandResult, on_output: OutputSink | None) -> CommandResult:
    """Hand a finished result's output to on_output (stdout, then stderr, each as one chunk), for
    transports that only get the output at the end; returns the result."""
    if on_output is not None:
        if result.stdout:
            on_output("stdout", result.stdout.encode())
        if result.stderr:
            on_output("stderr", result.stderr.encode())
    return result
@dataclass(frozen=True)
class Transferred:
    """What crossed the link: the byte count and the sha256 of exactly those bytes (hashed as they went)."""

    size: int
    sha256: str


@runtime_checkable
class FileTransport(Protocol):
    """A machine that can take and give files as byte streams (the node: SFTP on its SSH connection, or
    this machine). Only node-level transports have it; a guest's files go through its `Guest` (push/pull),
    which stages them on the node."""

    label: str

    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        """Create path (it must not exist: callers pick a unique temp name), set mode before the first byte,
        then stream source into it. More than max_bytes, or any failure: the partial file is removed and
        TransferError (or a TransportError for a lost link) is raised."""
        ...

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        """Stream path into sink; TransferError when it is missing, unreadable or over max_bytes."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file; one that is already gone is fine."""
        ...


class NodeTransport:
    """A node's shared connection under one target's name: commands, and files when the connection carries
    them. The connection stays its pool's (the Fleet's, or a test's): this never closes it, so any number
    of targets can hold one over the same node."""

    def __init__(self, connection: Transport, label: str | None = None) -> None:
        self.connection = connection
        self.label = label or connection.label

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        return self.connection.execute(argv, stdin=stdin, timeout=timeout, on_output=on_output)

    def feedable(self) -> FeedableTransport | None:
        return feedable(self.connection)

    # Guests stage their transfers on the node, so files go to the connection when it can carry them (SSH:
    # SFTP); one that cannot (a test's fake) says so by name rather than with an AttributeError.
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


_COPY_CHUNK = 256 * 1024


def copy_stream(read: Callable[[int], bytes], write: Callable[[bytes], object], *, max_bytes: int,
                what: str) -> Transferred:
    """Copy chunk by chunk, hashing what is copied; TransferError as soon as more than max_bytes came."""
    digest = hashlib.sha256()
    size = 0
    while chunk := read(_COPY_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise TransferError(f"{what}: larger than the limit of {max_bytes} bytes")
        digest.update(chunk)
        write(chunk)
    return Transferred(size, digest.hexdigest())


def run_script(
    transport: Transport, script: str, *, timeout: float | None = None, on_output: OutputSink | None = None
) -> CommandResult:
    """Run a POSIX sh script on the target, sent on stdin (its output also streamed to on_output)."""
    return transport.execute(SHELL_STDIN, stdin=script.encode(), timeout=timeout, on_output=on_output)


def put_file(
    transport: Transport, data: bytes, path: str, *, mode: int = 0o644,
    timeout: float | None = None,
) -> CommandResult:
    """Write data to path on the target, atomically (temp file + rename)."""
    script = (
        'umask 077 && cat > "$1.fleetfix-tmp" && chmod "$2" "$1.fleetfix-tmp"'
        ' && mv -f "$1.fleetfix-tmp" "$1"'
    )
    argv = ("/bin/sh", "-c", script, "sh", path, format(mode, "o"))
    return transport.execute(argv, stdin=data, timeout=timeout)


def command_line(argv: Sequence[str]) -> str:
    """The one place argv becomes a remote shell command line: every word quoted once."""
    return " ".join(_quoted_long(word) if len(word) >= _LONG_WORD else shlex.quote(word) for word in argv)


# Words this long are scripts: the probe's (~44 KB) and the batch driver go to every node, and quoting one
# is a pass over it replacing its quotes, twice per node (benchmarks/instructions.py counts it). The
# same few words, quoted once.
_LONG_WORD = 4096


@functools.lru_cache(maxsize=16)
def _quoted_long(word: str) -> str:
    return shlex.quote(word)
