"""The seam to the remote side: run an argv with bytes on stdin, get a CommandResult back.

A non-zero exit is data, not an exception (`CommandResult.check()` raises when a caller wants it to).
Only failures to reach or drive the target raise, as `fleetfix.errors.TransportError` subclasses,
mapped from library errors at the seam.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fleetfix.errors import CommandFailedError

# POSIX sh reads the script from stdin: no quoting layers, no argument-length limit.
SHELL_STDIN: tuple[str, ...] = ("/bin/sh", "-s")


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
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None
    ) -> CommandResult:
        """Run argv (no shell on our side) with stdin; return its exit code and output."""
        ...


def run_script(transport: Transport, script: str, *, timeout: float | None = None) -> CommandResult:
    """Run a POSIX sh script on the target, sent on stdin."""
    return transport.execute(SHELL_STDIN, stdin=script.encode(), timeout=timeout)


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
