"""The seam to the remote side: run an argv with bytes on stdin, get a CommandResult back.

A non-zero exit is data, not an exception (`CommandResult.check()` raises when a caller wants it to).
Only failures to reach or drive the target raise, as `fleetfix.errors.TransportError` subclasses,
mapped from library errors at the seam.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Literal, Protocol, runtime_checkable

from fleetfix.errors import CommandFailedError, TransferError

# POSIX sh reads the script from stdin: no quoting layers, no argument-length limit.
SHELL_STDIN: tuple[str, ...] = ("/bin/sh", "-s")

Stream = Literal["stdout", "stderr"]
# Called with ("stdout" | "stderr", chunk) as output arrives, from the thread running the command (or a
# reader thread of it). Chunks are raw bytes, cut anywhere (even inside a line or a UTF-8 sequence); the
# CommandResult still carries the whole output.
OutputSink = Callable[[Stream, bytes], None]


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False

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
    return shlex.join(argv)
