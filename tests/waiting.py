"""Waiting in tests for something observable, never for a length of time.

    wait_for(lambda: pids_running("sleep 42"), 30, "the step to start")   # its truthy value, or fails
    watcher = LineWatcher(process.stderr)                                 # a child's stream, as it comes
    wait_for(lambda: "interrupted" in watcher.text(), 10, "the first Ctrl-C")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

T = TypeVar("T")
POLL_SECONDS = 0.02


def wait_for(condition: Callable[[], T], timeout: float, what: str) -> T:
    """condition()'s first truthy value, polled until timeout; AssertionError naming `what` after it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_SECONDS)


class LineWatcher:
    """Reads a text stream (a child's stdout or stderr pipe) in a thread, so a test can wait for a line
    while the child runs, and still have all of it at the end (`text()` after `join()`)."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "the child's stream must be a pipe"
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._lines.append(line)

    def text(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def join(self, timeout: float = 30) -> str:
        """Everything, once the stream has closed (the child exited)."""
        self._thread.join(timeout)
        return self.text()
