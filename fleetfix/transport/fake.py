"""A scripted Transport for tests: canned results, every call recorded, nothing unscripted allowed.

    fake = FakeTransport("ct101")
    fake.on("dpkg-query -W cuda-keyring", rc=1)             # substring of the script / command line
    fake.on(re.compile(r"^apt-get .* update"), stdout="Hit:1 ...")
    fake.on("uname -m", exact=True, stdout="x86_64\\n")
    fake.on("nvcc", lambda call: CommandResult(0, "release 12.8", "", 0.0))  # computed
    fake.on("apt-get install", ConnectionLostError("link dropped"))         # raised
    fake.on(ANY, stdout="...")                                              # every call

A call is matched on its text: the script for `run_script` (stdin of `/bin/sh -s`), else the command
line. The first matching rule wins (`times=N` retires a rule after N uses, so a sequence of results for
the same command is a list of rules). An unmatched call raises NotImplementedError(text), like Invoke's
MockContext, so a test cannot pass by accident.

It is also a node connection (`close()`), so a `Fleet(connect=...)` can hand one out per node, and a
node's file store: `upload`/`download`/`remove` work on `fake.files` (path -> bytes; `fake.modes` keeps the
mode each upload set), so a responder can read what was uploaded and a test can put what a download finds.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypedDict, Unpack

from fleetfix.errors import TransferError
from fleetfix.transport.base import (
    SHELL_STDIN,
    CommandResult,
    OutputSink,
    Transferred,
    command_line,
    copy_stream,
    replay_output,
)

Responder = Callable[["FakeCall"], CommandResult]
ANY = re.compile("")  # a pattern matching every call


@dataclass(frozen=True)
class FakeCall:
    argv: tuple[str, ...]
    stdin: bytes
    timeout: float | None

    @property
    def is_script(self) -> bool:
        return self.argv == SHELL_STDIN

    @property
    def text(self) -> str:
        """What rules match against: the script itself, or the command line."""
        if self.is_script:
            return self.stdin.decode("utf-8", errors="replace")
        return command_line(self.argv)


@dataclass
class _Rule:
    pattern: str | re.Pattern[str]
    exact: bool
    response: CommandResult | Responder | BaseException
    times: int | None
    used: int = 0

    def matches(self, text: str) -> bool:
        if self.times is not None and self.used >= self.times:
            return False
        if isinstance(self.pattern, re.Pattern):
            return self.pattern.search(text) is not None
        return text == self.pattern if self.exact else self.pattern in text


class ScriptedOutput(TypedDict, total=False):
    """What FakeTransport.on scripts when it is given no response."""

    rc: int
    stdout: str
    stderr: str
    timed_out: bool


class FakeTransport:
    def __init__(self, label: str = "fake") -> None:
        self.label = label
        self.closed = False
        self.calls: list[FakeCall] = []
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}

    def on(
        self,
        pattern: str | re.Pattern[str],
        response: CommandResult | Responder | BaseException | None = None,
        *,
        exact: bool = False,
        times: int | None = None,
        **output: Unpack[ScriptedOutput],
    ) -> FakeTransport:
        """Script a response for calls whose text matches pattern (substring; exact=True; or a regex): the
        response given, else a CommandResult of output (rc 0 and no output unless it says otherwise)."""
        if response is None:
            response = CommandResult(output.get("rc", 0), output.get("stdout", ""), output.get("stderr", ""),
                                     0.0, output.get("timed_out", False))
        self._rules.append(_Rule(pattern, exact, response, times))
        return self

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        """The scripted result; on_output gets its stdout, then its stderr, each as one chunk."""
        return replay_output(self._respond(argv, stdin, timeout), on_output)

    def _respond(self, argv: Sequence[str], stdin: bytes, timeout: float | None) -> CommandResult:
        call = FakeCall(tuple(argv), stdin, timeout)
        with self._lock:
            self.calls.append(call)
            rule = next((rule for rule in self._rules if rule.matches(call.text)), None)
            if rule is not None:
                rule.used += 1
        if rule is None:
            raise NotImplementedError(call.text)
        if isinstance(rule.response, BaseException):
            raise rule.response
        if isinstance(rule.response, CommandResult):
            return rule.response
        return rule.response(call)

    @property
    def scripts(self) -> list[str]:
        """The text of every call so far, in order."""
        with self._lock:
            return [call.text for call in self.calls]

    def close(self) -> None:
        self.closed = True

    # -- files ----------------------------------------------------------------------------------------

    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        with self._lock:
            if path in self.files:
                raise TransferError(f"{self.label}: {path}: File exists")
        sink = io.BytesIO()
        moved = copy_stream(source.read, sink.write, max_bytes=max_bytes, what=path)
        with self._lock:
            self.files[path], self.modes[path] = sink.getvalue(), mode
        return moved

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        with self._lock:
            data = self.files.get(path)
        if data is None:
            raise TransferError(f"{self.label}: download of {path}: No such file")
        return copy_stream(io.BytesIO(data).read, sink.write, max_bytes=max_bytes, what=path)

    def remove(self, path: str) -> None:
        with self._lock:
            self.files.pop(path, None)
            self.modes.pop(path, None)
