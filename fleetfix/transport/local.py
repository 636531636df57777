"""This machine as a target (`--local`, and nodes without SSH settings): subprocess, same result semantics.

The command runs in a new session (its own process group), so a timeout kills it and everything it
started with one `killpg`, as the remote watchdog does over SSH.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from fleetfix.transport.base import CommandResult

TIMEOUT_EXIT_CODE = 124


class LocalTransport:
    def __init__(self, label: str = "local", *, env: dict[str, str] | None = None) -> None:
        self.label = label
        self.env = env  # None: inherit this process's environment

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None
    ) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, env=self.env,
            )
        except FileNotFoundError:  # what a shell would say and return, so callers see one behaviour
            return CommandResult(127, "", f"{argv[0]}: command not found\n", time.monotonic() - started)
        except PermissionError:
            return CommandResult(126, "", f"{argv[0]}: permission denied\n", time.monotonic() - started)
        timed_out = False
        try:
            out, err = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process.pid)
            # Children that left the group may still hold the pipes: do not wait for them forever.
            try:
                out, err = process.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = b"", b""
        finally:
            if process.poll() is None:  # an exception (e.g. KeyboardInterrupt) interrupted communicate
                _kill_group(process.pid)
                process.wait()
        code = process.returncode
        if code < 0:  # killed by signal N: report 128+N, as a shell (and sshd's login shell) would
            code = 128 - code
        if timed_out:
            code = TIMEOUT_EXIT_CODE
        return CommandResult(
            code, out.decode(errors="replace"), err.decode(errors="replace"),
            time.monotonic() - started, timed_out=timed_out,
        )


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, signal.SIGKILL)
