"""Two scripts in one command: the second chosen from what the first printed.

Why: `fleetfix apply` needs a target's facts to render its checks, and every command on a container is
a `pct exec` on its node (a start of pct and lxc-attach) and an SSH channel. Sent as one command, the
facts and the checks cost one of each instead of two (docs/performance.md).

How: the command is `/bin/sh -s` with its stdin fed over time (transport.base.StdinFeed). The controller
sends the first script as the here-document of a nested `/bin/sh -s`, so the first runs as `run_script`
would run it (a shell of its own, its stdin its own text, its `exit` its own), then two lines that print
a marker line with the first's exit status on stdout and a marker line on stderr, and keeps stdin open:

    /bin/sh -s <<'FLEETFIX_FIRST_<nonce>'
    <first>
    FLEETFIX_FIRST_<nonce>
    printf '\\nfleetfix-then <nonce> %s\\n' "$?"
    printf '\\nfleetfix-then <nonce>\\n' >&2

The shell runs what it has read, then waits for more. When the stdout marker arrives, `then` gets the
first's output and returns the second script (or None); the controller sends it and closes stdin, and
the same shell runs it to its end or its `exit`. What the first printed is everything before its marker,
on each stream; what the second printed, everything after.

The command as a whole has the first's timeout: a second script still running then is killed with it,
and its result says so (timed_out), as any second script that did not end well.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetfix.transport.base import (
    DEFAULT_MAX_OUTPUT,
    SHELL_STDIN,
    CappedOutput,
    CommandResult,
    StdinFeed,
    Stream,
    Transport,
    feedable,
)

_MARK = "fleetfix-then"


@dataclass(frozen=True)
class ThenResult:
    """first: what `run_script` of the first script would have returned (its exit status and output).
    second: the second script's result, its exit status the session's, its output decoded with
    surrogateescape (bytes that are not UTF-8 come back exactly); None when none was sent."""

    first: CommandResult
    second: CommandResult | None


def new_nonce() -> str:
    return secrets.token_hex(8)


def head_script(first: str, nonce: str) -> str:
    """The session's start: the first script in its own shell, then the markers (see the module doc)."""
    delimiter = f"FLEETFIX_FIRST_{nonce}"
    body = first if first.endswith("\n") else first + "\n"
    if delimiter in body:
        raise ValueError("the first script holds the session's delimiter")
    return (f"/bin/sh -s <<'{delimiter}'\n{body}{delimiter}\n"
            f"printf '\\n{_MARK} {nonce} %s\\n' \"$?\"\n"
            f"printf '\\n{_MARK} {nonce}\\n' >&2\n")


def run_then(transport: Transport, first: str, then: Callable[[str], str | None], *, timeout: float | None,
             max_output: int = DEFAULT_MAX_OUTPUT) -> ThenResult | None:
    """Run first, then the script then(first's stdout) returns, in one command on the target; None (and
    nothing run) where the transport cannot feed a command's stdin over time. Each stream of each script
    keeps at most max_output bytes. An exception from then is raised here once the command has ended."""
    fed = feedable(transport)
    if fed is None:
        return None
    nonce = new_nonce()
    session = _Session(nonce, then, max_output)
    session.feed.put(head_script(first, nonce).encode())
    result = fed.execute_fed(SHELL_STDIN, session.feed, timeout=timeout, on_output=session.sink)
    if session.error is not None:
        raise session.error
    return session.results(result)


class _Split:
    """One stream of the session: the first's bytes up to its marker, then the second's."""

    def __init__(self, marker: re.Pattern[bytes], cap: int) -> None:
        self.marker = marker
        self.first, self.second = CappedOutput(cap), CappedOutput(cap)
        self.pending = bytearray()  # bytes that may still be the start of the marker
        self.found = False
        self.status: int | None = None  # the stdout marker's exit status

    def add(self, chunk: bytes) -> bool:
        """Take a chunk; True when this chunk completed the marker."""
        if self.found:
            self.second.add(chunk)
            return False
        self.pending += chunk
        found = self.marker.search(self.pending)
        if found is None:
            keep = 96  # longer than any marker line
            if len(self.pending) > keep:
                self.first.add(bytes(self.pending[:-keep]))
                del self.pending[:-keep]
            return False
        self.found = True
        self.status = int(found[1]) if found.groups() else None
        self.first.add(bytes(self.pending[:found.start()]))
        self.second.add(bytes(self.pending[found.end():]))
        self.pending.clear()
        return True

    def first_bytes(self) -> CappedOutput:
        if not self.found and self.pending:  # no marker: all of it was the first's
            self.first.add(bytes(self.pending))
            self.pending.clear()
        return self.first


class _Session:
    def __init__(self, nonce: str, then: Callable[[str], str | None], cap: int) -> None:
        self.feed = StdinFeed()
        self.then = then
        self.error: Exception | None = None
        self.started = time.monotonic()
        self.first_ended: float | None = None
        self.sent = False
        token = nonce.encode()
        self.out = _Split(re.compile(rb"\n" + _MARK.encode() + rb" " + token + rb" ([0-9]+)\n"), cap)
        self.err = _Split(re.compile(rb"\n" + _MARK.encode() + rb" " + token + rb"\n"), cap)
        self._lock = threading.Lock()  # a local command's streams come from two reader threads

    def sink(self, stream: Stream, chunk: bytes) -> None:
        with self._lock:
            if stream == "stderr":
                self.err.add(chunk)
                return
            if not self.out.add(chunk):
                return
            self.first_ended = time.monotonic()
            first_output = self.out.first.getvalue().decode(errors="replace")
        script: str | None = None
        try:
            script = self.then(first_output)
        except Exception as error:  # raised by run_then once the command has ended
            self.error = error
        if script:
            self.sent = True
            self.feed.put(script.encode())
        self.feed.close()

    def results(self, session: CommandResult) -> ThenResult:
        ended = time.monotonic()
        out, err = self.out.first_bytes(), self.err.first_bytes()
        if not self.out.found:  # the first did not end (timed out, killed, pct refused): the session's result
            first = CommandResult(session.exit_code, _text(out), _text(err), ended - self.started,
                                  timed_out=session.timed_out, dropped=out.dropped + err.dropped)
            return ThenResult(first, None)
        first_ended = self.first_ended or ended
        first = CommandResult(self.out.status or 0, _text(out), _text(err), first_ended - self.started,
                              dropped=out.dropped + err.dropped)
        if not self.sent:
            return ThenResult(first, None)
        second_out, second_err = self.out.second, self.err.second
        second = CommandResult(session.exit_code, _raw(second_out), _raw(second_err), ended - first_ended,
                               timed_out=session.timed_out, dropped=second_out.dropped + second_err.dropped)
        return ThenResult(first, second)


def _text(output: CappedOutput) -> str:
    return output.getvalue().decode(errors="replace")


def _raw(output: CappedOutput) -> str:
    """Every byte kept: `.encode(errors="surrogateescape")` gives them back exactly (a second script's
    output may be a frame whose sizes count bytes, playbook/checkbatch.py)."""
    return output.getvalue().decode(errors="surrogateescape")
