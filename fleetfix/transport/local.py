"""This machine as a target (`--local`, and nodes without SSH settings): subprocess, same result semantics.

The command runs in a new session (its own process group), so a timeout kills it and everything it
started with one `killpg`, as the remote watchdog does over SSH.

stdout and stderr are read by two threads (and stdin written by a third) instead of `communicate()`, so
each chunk reaches the sink as the command writes it, and each stream is kept within the output cap
(`transport.base.CappedOutput`) however much the command prints.

Files (`upload`/`download`, the `FileTransport` of `--local`): plain file I/O with the same contract as
SFTP on a node: exclusive create, the mode set before the first byte, a byte cap, the partial file removed
on failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO, BinaryIO

from fleetfix.errors import TransferError
from fleetfix.transport.base import (
    DEFAULT_MAX_OUTPUT,
    FED_RESULT_OUTPUT,
    TIMEOUT_EXIT_CODE,
    CappedOutput,
    CommandResult,
    OutputSink,
    StdinFeed,
    Stream,
    Transferred,
    copy_stream,
)

# After a kill, how long to wait for the pipes to close: children that left the group may hold them.
DRAIN_SECONDS = 5.0
_CHUNK = 65536


class LocalTransport:
    def __init__(self, label: str = "local", *, env: dict[str, str] | None = None,
                 max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        self.label = label
        self.env = env  # None: inherit this process's environment
        self.max_output = max_output

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        return self._execute(argv, stdin, timeout, on_output, self.max_output)

    def execute_fed(self, argv: Sequence[str], feed: StdinFeed, *, timeout: float | None = None,
                    on_output: OutputSink | None = None) -> CommandResult:
        """Run argv with stdin written as it is fed (`transport.base.FeedableTransport`)."""
        try:
            return self._execute(argv, feed, timeout, on_output, FED_RESULT_OUTPUT)
        finally:
            feed.close()  # the command ended (or never started): its writer stops waiting for more

    def _execute(self, argv: Sequence[str], stdin: bytes | StdinFeed, timeout: float | None,
                 on_output: OutputSink | None, max_output: int) -> CommandResult:
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
        out, err = CappedOutput(max_output), CappedOutput(max_output)
        try:
            timed_out = _run_streaming(process, stdin, timeout, on_output or _ignore, out, err)
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
            code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace"),
            time.monotonic() - started, timed_out=timed_out, dropped=out.dropped + err.dropped,
        )


    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            raise TransferError(f"{self.label}: cannot create {path}: {error.strerror}") from None
        try:
            os.fchmod(fd, mode)  # exact, whatever the umask
            with os.fdopen(fd, "wb", closefd=False) as sink:
                moved = copy_stream(source.read, sink.write, max_bytes=max_bytes, what=path)
                sink.flush()
                os.fsync(fd)
        except BaseException as error:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if isinstance(error, OSError):
                raise TransferError(f"{self.label}: writing {path}: {error.strerror or error}") from None
            raise
        os.close(fd)
        return moved

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        try:
            with open(path, "rb") as source:
                return copy_stream(source.read, sink.write, max_bytes=max_bytes, what=path)
        except OSError as error:
            raise TransferError(f"{self.label}: cannot read {path}: {error.strerror or error}") from None

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _ignore(stream: Stream, chunk: bytes) -> None:
    return None


def _run_streaming(
    process: subprocess.Popen[bytes], stdin: bytes | StdinFeed, timeout: float | None, on_output: OutputSink,
    out: CappedOutput, err: CappedOutput,
) -> bool:
    """communicate() with live output into out and err; returns timed_out. On timeout the group is
    killed here."""
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    collected: dict[Stream, CappedOutput] = {"stdout": out, "stderr": err}
    abandoned: list[bool] = []  # non-empty once this function returns
    lock = threading.Lock()  # a reader may still append while an abandoned pipe is snapshotted below

    def pump(stream: Stream, pipe: IO[bytes]) -> None:
        # os.read returns what is there as soon as anything is: no waiting for a full buffer.
        while chunk := os.read(pipe.fileno(), _CHUNK):
            with lock:
                if not abandoned:
                    collected[stream].add(chunk)
            on_output(stream, chunk)

    threads = [
        threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True),
        threading.Thread(target=pump, args=("stdout", process.stdout), daemon=True),
        threading.Thread(target=pump, args=("stderr", process.stderr), daemon=True),
    ]
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid)
        process.wait()
    # Like communicate(): read to EOF. After a kill, do not wait forever for children that left the group.
    drain_until = time.monotonic() + DRAIN_SECONDS if timed_out else None
    for thread, pipe in ((threads[1], process.stdout), (threads[2], process.stderr)):
        thread.join(None if drain_until is None else max(0.0, drain_until - time.monotonic()))
        if not thread.is_alive():  # a reader still blocked keeps its pipe (closing it under it is unsafe)
            pipe.close()
    with lock:  # a reader abandoned above adds nothing more: the caller reads out and err unlocked
        abandoned.append(True)
    return timed_out


def _feed(pipe: IO[bytes], data: bytes | StdinFeed) -> None:
    """Write stdin then close it (EOF); a command that exits without reading it all is not an error."""
    with contextlib.suppress(OSError):
        for chunk in (data,) if isinstance(data, bytes) else data:
            if chunk:
                pipe.write(chunk)
                pipe.flush()  # a fed chunk is for now, not for when the buffer fills
    with contextlib.suppress(OSError):
        pipe.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, signal.SIGKILL)
