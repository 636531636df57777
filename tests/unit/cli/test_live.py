"""Live output (`apply -v`): transports hand chunks to a sink as they come; LiveOutput prints whole lines."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from fleetfix.cli.live import LiveOutput
from fleetfix.playbook.runner import FleetAccess, RunHooks, RunOptions, run_playbook
from fleetfix.target import Target
from fleetfix.transport.base import run_script
from fleetfix.transport.fake import FakeTransport
from fleetfix.transport.local import LocalTransport
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from, problem_facts

# Prints a line, then waits for a file that the test creates only once the sink has seen that line.
HANDSHAKE = 'echo first; echo warn >&2; while [ ! -f "{go}" ]; do sleep 0.02; done; echo second\n'


class Recorder:
    """A sink that records chunks and, on seeing `trigger` on stdout, creates `go`."""

    def __init__(self, go: Path | None = None, trigger: bytes = b"first\n") -> None:
        self.chunks: list[tuple[str, bytes]] = []
        self.go, self.trigger = go, trigger
        self.seen_at: float | None = None

    def __call__(self, stream: str, chunk: bytes) -> None:
        self.chunks.append((stream, chunk))
        if self.go is not None and self.trigger in self.joined("stdout") and self.seen_at is None:
            self.seen_at = time.monotonic()
            self.go.touch()

    def joined(self, stream: str) -> bytes:
        return b"".join(chunk for name, chunk in self.chunks if name == stream)


def test_local_sink_sees_output_before_the_command_ends(tmp_path: Path) -> None:
    go = tmp_path / "go"
    sink = Recorder(go)
    result = run_script(LocalTransport(), HANDSHAKE.format(go=go), timeout=20, on_output=sink)
    # Had the first line reached the sink only at the end, the script would have waited for `go` until
    # the timeout killed it.
    assert not result.timed_out and result.exit_code == 0
    assert sink.seen_at is not None
    assert result.stdout == "first\nsecond\n" and result.stderr == "warn\n"
    assert sink.joined("stdout") == b"first\nsecond\n" and sink.joined("stderr") == b"warn\n"


def test_local_sink_keeps_timeout_kill_and_big_stdin() -> None:
    sink = Recorder()
    started = time.monotonic()
    result = LocalTransport().execute(["/bin/sh", "-c", "echo before; sleep 30"], timeout=0.5, on_output=sink)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 10
    assert result.stdout == "before\n" and sink.joined("stdout") == b"before\n"

    data = bytes(range(256)) * 4096  # 1 MiB: more than a pipe holds, so stdin must be written concurrently
    sink = Recorder()
    result = LocalTransport().execute(["cat"], stdin=data, timeout=20, on_output=sink)
    assert result.exit_code == 0 and sink.joined("stdout") == data


def test_fake_calls_the_sink_with_its_scripted_output() -> None:
    sink = Recorder()
    fake = FakeTransport().on("hello", stdout="out\n", stderr="err\n")
    result = run_script(fake, "echo hello", on_output=sink)
    assert result.stdout == "out\n"
    assert sink.chunks == [("stdout", b"out\n"), ("stderr", b"err\n")]


def console_into(buffer: io.StringIO) -> Console:
    return Console(file=buffer, color_system=None, highlight=False, soft_wrap=True, width=200)


def test_live_output_prints_whole_lines_per_target_and_flushes_the_rest() -> None:
    buffer = io.StringIO()
    live = LiveOutput(console_into(buffer))
    a, b = live.sink_for("pve1/200"), live.sink_for("pve1/201")
    a("stdout", b"hel")
    b("stdout", b"other [bold]x[/] ")  # markup in output is printed as text
    a("stderr", b"oops\n")
    assert buffer.getvalue() == "pve1/200 ! oops\n"  # no partial line printed yet
    a("stdout", b"lo\nwor")
    b("stdout", b"line\n")
    live.flush("pve1/200")
    a("stdout", b"next\n")  # after a flush, the buffer starts afresh
    b("stdout", "tail \u00e9".encode()[:-1])  # cut inside a UTF-8 sequence ...
    b("stdout", "tail \u00e9".encode()[-1:])  # ... and completed by the next chunk
    live.flush()
    assert buffer.getvalue().splitlines() == [
        "pve1/200 ! oops", "pve1/200 | hello", "pve1/201 | other [bold]x[/] line", "pve1/200 | wor",
        "pve1/200 | next", "pve1/201 | tail \u00e9",
    ]


def test_live_output_is_thread_safe() -> None:
    buffer = io.StringIO()
    live = LiveOutput(console_into(buffer))

    def writer(name: str) -> None:
        sink = live.sink_for(name)
        for number in range(200):
            line = f"{name}-line-{number}\n".encode()
            sink("stdout", line[:3])
            sink("stdout", line[3:])

    threads = [threading.Thread(target=writer, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 800
    for name in ("t0", "t1", "t2", "t3"):  # whole lines, each target's in order
        assert [line for line in lines if line.startswith(name + " ")] == [
            f"{name} | {name}-line-{n}" for n in range(200)]


def test_runner_passes_chunks_with_target_and_step(tmp_path: Path) -> None:
    book = playbook_from("name: s\nsteps:\n  - name: first step\n    check: CHECK\n    apply: APPLY\n"
                         "  - name: second step\n    apply: SECOND\n", tmp_path)
    transports = {
        name: FakeTransport(name).on("CHECK", rc=1, stdout=f"{name} missing\n")
        .on("APPLY", stdout=f"{name} applied\n", stderr="note\n").on("SECOND", stdout=f"{name} again\n")
        for name in ("a", "b")
    }
    targets = [make_target("a"), make_target("b")]
    seen: list[tuple[str, str, str, bytes]] = []
    lock = threading.Lock()

    def on_output(target: Target, step: str, stream: str, chunk: bytes) -> None:
        with lock:
            seen.append((target.name, step, stream, chunk))

    facts: dict[str, Any] = problem_facts()
    run = run_playbook(
        book, targets,
        FleetAccess(StandInFleet(transports).map, lambda t, tr: facts),
        RunOptions(),
        RunHooks(on_output=on_output))
    assert run.status == "changed"
    for name in ("a", "b"):
        assert [entry[1:] for entry in seen if entry[0] == name] == [
            ("first step", "stdout", f"{name} missing\n".encode()),
            ("first step", "stdout", f"{name} applied\n".encode()),
            ("first step", "stderr", b"note\n"),
            ("second step", "stdout", f"{name} again\n".encode()),
        ]


def test_a_target_printing_without_newlines_is_shown_in_bounded_pieces_not_buffered_forever() -> None:
    from fleetfix.cli.live import MAX_LINE

    out = io.StringIO()
    live = LiveOutput(Console(file=out, width=10**7, color_system=None), labelled=False)
    piece = b"x" * (MAX_LINE // 4)
    for _ in range(5):  # more than MAX_LINE in all, no newline
        live.feed("t", "stdout", piece)
    shown = out.getvalue()
    assert shown.strip("\n") and set(shown.strip("\n")) == {"x"}  # printed before any newline came
    assert len(live._partial.get(("t", "stdout"), b"")) <= MAX_LINE  # what is held stays bounded
    live.flush()
    assert out.getvalue().count("x") == len(piece) * 5  # nothing lost
