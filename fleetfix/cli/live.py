"""What a command shows while it runs: live output of scripts, each step as it ends (the probe's progress
bar: cli/progress.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from fleetfix.reports.console import STATUS_STYLE, console
from fleetfix.target import Target
from fleetfix.terminal import safe
from fleetfix.transport.base import OutputSink, Stream

MAX_LINE = 64 * 1024  # an unfinished line longer than this is printed as it is


class LiveOutput:
    """Scripts' output as it arrives, `target | line` (stderr: `target ! line`), from many targets at once.

    Chunks are cut anywhere, so each (target, stream) keeps its unfinished line until its newline comes:
    lines of different targets never interleave mid-line. `flush` prints what is left. Thread-safe.
    labelled=False prints the lines as the command wrote them (one target: nothing to tell apart).
    """

    def __init__(
        self, out: Console | None = None, *, redact: Callable[[str], str] | None = None, labelled: bool = True
    ) -> None:
        self._labelled = labelled
        self._console = out or console
        self._redact = redact or (lambda text: text)  # secret vars never reach the terminal
        self._lock = threading.Lock()  # one lock for buffers and printing: lines come out whole, in order
        self._partial: dict[tuple[str, Stream], bytes] = {}

    def feed(self, name: str, stream: Stream, chunk: bytes) -> None:
        with self._lock:
            *lines, rest = (self._partial.pop((name, stream), b"") + chunk).split(b"\n")
            if len(rest) > MAX_LINE:  # a target printing without newlines must not grow this buffer
                lines.append(rest)
                rest = b""
            if rest:
                self._partial[(name, stream)] = rest
            for line in lines:
                self._print(name, stream, line)

    def sink_for(self, name: str, *, streams: Sequence[Stream] = ("stdout", "stderr")) -> OutputSink:
        """A transport-level sink (`execute(..., on_output=)`) for the target called name, printing the
        given streams only (`exec` streams stderr and keeps stdout for the end)."""

        def sink(stream: Stream, chunk: bytes) -> None:
            if stream in streams:
                self.feed(name, stream, chunk)

        return sink

    def on_output(self, target: Target, step: str, stream: Stream, chunk: bytes) -> None:
        """The `run_playbook(on_output=)` handler."""
        self.feed(target.name, stream, chunk)

    def flush(self, name: str | None = None) -> None:
        """Print the unfinished lines (of one target, or of all) as if their newline had come."""
        with self._lock:
            for key in [key for key in self._partial if name is None or key[0] == name]:
                self._print(*key, self._partial.pop(key))

    def _print(self, name: str, stream: Stream, line: bytes) -> None:
        # Text, not markup: nothing a script prints can style (or break) the terminal output.
        # Whole lines (no cut UTF-8); control sequences escaped: the terminal is the operator's.
        text = safe(self._redact(line.rstrip(b"\r").decode(errors="replace")))
        if not self._labelled:
            self._console.print(Text(text))
        elif stream == "stdout":
            self._console.print(Text.assemble((name, "bold"), " | ", text))
        else:
            self._console.print(Text.assemble((name, "bold"), " ! ", (text, "dim")))


class Transcripts:
    """What each target printed, both streams in the order the lines came, kept for its report.

    `exec` on a terminal prints a target's output under its `== NAME exit N` header, which is only known
    when the target is done; streaming stderr live would put it above the header it belongs to. Thread-
    safe: targets run concurrently."""

    def __init__(self, *, redact: Callable[[str], str] | None = None) -> None:
        # stderr is masked as it is when streamed; stdout is the command's data, passed on as it came
        self._redact = redact or (lambda text: text)
        self._lock = threading.Lock()
        self._lines: dict[str, list[tuple[Stream, str]]] = {}
        self._partial: dict[tuple[str, Stream], bytes] = {}

    def sink_for(self, name: str) -> OutputSink:
        def sink(stream: Stream, chunk: bytes) -> None:
            with self._lock:
                *lines, rest = (self._partial.pop((name, stream), b"") + chunk).split(b"\n")
                if rest:
                    self._partial[(name, stream)] = rest
                for line in lines:
                    self._add(name, stream, line)

        return sink

    def lines(self) -> dict[str, list[tuple[Stream, str]]]:
        """Every target's lines (unfinished last lines included), by target name."""
        with self._lock:
            for (name, stream), rest in list(self._partial.items()):
                self._add(name, stream, rest)
            self._partial.clear()
            return {name: list(lines) for name, lines in self._lines.items()}

    def _add(self, name: str, stream: Stream, line: bytes) -> None:
        text = line.rstrip(b"\r").decode(errors="replace")  # whole lines: no cut UTF-8
        self._lines.setdefault(name, []).append((stream, self._redact(text) if stream == "stderr" else text))


def step_printer(*, verbose: bool, live: LiveOutput | None = None) -> Any:
    """A callback printing each step as it finishes (from worker threads: rich's print is locked).
    With live output, the step's output was already streamed: its unfinished line is flushed first."""

    def on_step(target: Target, step: Any) -> None:
        if live is not None:
            live.flush(target.name)
            verbose_replay = False
        else:
            verbose_replay = verbose
        style = STATUS_STYLE.get(step.status, "")
        console.print(f"[{style}]{step.status:<12}[/] {escape(safe(target.name))}: {escape(safe(step.name))}"
                      + (f" — {escape(safe(step.reason))}" if step.reason else ""))
        if verbose_replay and step.status in ("failed", "changed") and (step.stdout or step.stderr):
            for line in (step.stdout + step.stderr).rstrip().splitlines()[-40:]:
                console.print(f"    {escape(safe(line))}")

    return on_step
