"""The seam to the remote side: run an argv with bytes on stdin, get a CommandResult back.

A non-zero exit is data, not an exception (`CommandResult.check()` raises when a caller wants it to).
Only failures to reach or drive the target raise, as `fleetfix.errors.TransportError` subclasses,
mapped from library errors at the seam.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from fleetfix.errors import CommandFailedError

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


def replay_output(result: CommandResult, on_output: OutputSink | None) -> CommandResult:
    """Hand a finished result's output to on_output (stdout, then stderr, each as one chunk), for
    transports that only get the output at the end; returns the result."""
    if on_output is not None:
        if result.stdout:
            on_output("stdout", result.stdout.encode())
        if result.stderr:
            on_output("stderr", result.stderr.encode())
    return result


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
