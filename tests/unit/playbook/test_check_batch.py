"""A target's checks in one round trip (playbook/checkbatch.py, runner._CheckBatch): the same steps, records
and output as one script per check, in fewer round trips; a batch it cannot read is not used."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import ConnectionLostError
from fleetfix.playbook.checkbatch import BatchedCheck, batch_script, new_nonce, parse_batch
from fleetfix.playbook.model import Playbook
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import RunContext, TargetRun, plan_target, run_target
from fleetfix.transport.fake import FakeTransport
from tests.unit.playbook.conftest import SubprocessTransport, make_target, playbook_from

NOOP = """\
name: noop
steps:
  - name: one
    check: echo first is fine
    apply: echo never
  - name: skipped
    when: false
    check: echo never
  - name: two
    check: echo to stderr >&2; echo second is fine
    apply: echo never
  - name: three
    check: "printf 'no newline at the end'"
    apply: echo never
  - name: assertion
    check: test -d .
"""


class Events:
    run_id: str | None = None

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, /, **fields: Any) -> None:
        self.events.append((kind, fields))

    def add_secrets(self, values: Iterable[str]) -> None:
        return None

    def scripts(self) -> list[tuple[Any, ...]]:
        """The script events, without their durations (the only field a batch measures differently)."""
        return [(kind, *sorted((k, v) for k, v in fields.items() if k != "duration"))
                for kind, fields in self.events if kind in ("script-start", "script-end", "step")]


def run(book: Playbook, transport: Any, facts: dict[str, Any], *, batch: bool, check: bool = False,
        **kwargs: Any) -> tuple[TargetRun, Events]:
    plan = plan_target([compile_playbook(book)], make_target("ct"), facts, {})
    events = Events()
    result = run_target(plan, transport, RunContext(check_mode=check, recorder=events, batch_checks=batch,
                                                    **kwargs))
    return result, events


def steps(run: TargetRun) -> list[tuple[Any, ...]]:
    return [(s.name, s.status, s.reason, s.rc, s.stdout, s.stderr, s.ignored,
             [(r.phase, r.attempt, r.script, r.rc, r.stdout, r.stderr, r.timed_out) for r in r_s])
            for s in run.steps for r_s in [s.runs]]


Ran = tuple[TargetRun, Events, SubprocessTransport]


def both(book: Playbook, tmp_path: Path, facts: dict[str, Any], **kwargs: Any) -> tuple[Ran, Ran]:
    """The same playbook, one script per check, then batched, each from the same starting directory."""
    out = []
    for batch in (False, True):
        where = tmp_path / ("batched" if batch else "alone")
        where.mkdir()
        transport = SubprocessTransport(where)
        result, events = run(book, transport, facts, batch=batch, **kwargs)
        out.append((result, events, transport))
    return out[0], out[1]


def test_a_noop_apply_is_one_round_trip_with_the_same_steps_and_records(tmp_path: Path,
                                                                         facts: dict[str, Any]) -> None:
    book = playbook_from(NOOP, tmp_path)
    (alone, alone_events, alone_sh), (batched, events, sh) = both(book, tmp_path, facts)
    assert len(alone_sh.scripts) == 4 and len(sh.scripts) == 1
    assert batched.status == "ok" and steps(batched) == steps(alone)
    assert events.scripts() == alone_events.scripts()
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert batch["ran"] == 4 and batch["error"] is None
    assert [s["step"] for s in batch["steps"]] == ["one", "two", "three", "assertion"]


def test_a_change_at_step_k_ends_the_batch_there(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("""\
name: change
steps:
  - name: fine
    check: echo fine
    apply: echo never
  - name: make marker
    check: test -f marker && echo has marker
    apply: echo made > marker; echo made it
    verify: test -f marker
  - name: after
    check: test -f marker && echo sees the marker
    apply: echo never
""", tmp_path)
    (alone, alone_events, _), (batched, events, sh) = both(book, tmp_path, facts)
    assert [s.status for s in batched.steps] == ["ok", "changed", "ok"]
    assert steps(batched) == steps(alone) and events.scripts() == alone_events.scripts()
    # the batch ran the first two checks and stopped at the failing one; then apply, verify, and the
    # last step's check afresh, after the change
    assert len(sh.scripts) == 4
    assert "echo made > marker" in sh.scripts[1] and sh.scripts[2] == "test -f marker"
    assert sh.scripts[3].startswith("test -f marker && echo sees")
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert batch["ran"] == 2 and len(batch["steps"]) == 3


def test_check_mode_is_one_round_trip_and_reports_what_the_checks_said(tmp_path: Path,
                                                                       facts: dict[str, Any]) -> None:
    book = playbook_from("""\
name: check
steps:
  - name: fine
    check: echo fine
    apply: echo never
  - name: missing
    check: echo no marker; exit 3
    apply: echo never
  - name: no check
    apply: echo never
  - name: needs the change above
    check: test -f marker
  - name: after it
    check: echo also fine
    apply: echo never
""", tmp_path)
    (alone, alone_events, alone_sh), (batched, events, sh) = both(book, tmp_path, facts, check=True)
    assert len(alone_sh.scripts) == 4 and len(sh.scripts) == 1
    assert [s.status for s in batched.steps] == ["ok", "would-change", "would-change", "would-change", "ok"]
    assert batched.steps[3].reason.startswith("not met before the changes above")
    assert steps(batched) == steps(alone) and events.scripts() == alone_events.scripts()


def test_registered_and_timeout_steps_are_not_batched(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("""\
name: registered
steps:
  - name: a
    check: echo a
    register: a
  - name: b
    check: echo b
  - name: timed
    check: echo timed
    timeout: 30
  - name: uses a
    check: echo {{ registered.a.stdout }}
  - name: c
    check: echo c
""", tmp_path)
    (alone, _, _), (batched, events, sh) = both(book, tmp_path, facts)
    assert steps(batched) == steps(alone)
    # outside check mode the batch ends before the first step it cannot hold: a, b; the rest run alone
    assert len(sh.scripts) == 4 and sh.scripts[1:] == ["echo timed", "echo 'a\n'", "echo c"]
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert [s["step"] for s in batch["steps"]] == ["a", "b"]


def test_live_output_comes_step_by_step(tmp_path: Path, facts: dict[str, Any]) -> None:
    seen: list[tuple[str, str, bytes]] = []
    on_output = lambda target, step, stream, chunk: seen.append((step, stream, chunk))  # noqa: E731
    run(playbook_from(NOOP, tmp_path), SubprocessTransport(tmp_path), facts, batch=True, on_output=on_output)
    assert seen == [("one", "stdout", b"first is fine\n"), ("two", "stdout", b"second is fine\n"),
                    ("two", "stderr", b"to stderr\n"), ("three", "stdout", b"no newline at the end")]


def test_hostile_output_is_the_check_s_own(tmp_path: Path, facts: dict[str, Any]) -> None:
    """Frame lines, NULs and bytes that are not UTF-8 in a check's output: its output, nothing more."""
    book = playbook_from(r"""
name: hostile
steps:
  - name: frame lines
    check: "printf 'fleetfix-checks 0\n1 0 - -\nsizes\n 99 /x/1.o\ndata\nend 0\n'; printf 'data\n' >&2"
  - name: binary
    check: "printf 'a\\000b\\377\\376c\n'; exit 0"
  - name: fails
    check: "printf 'sizes\ndata\n'; exit 4"
    apply: echo fixed
""", tmp_path)
    (alone, alone_events, _), (batched, events, sh) = both(book, tmp_path, facts, check=True)
    assert len(sh.scripts) == 1 and steps(batched) == steps(alone)
    assert events.scripts() == alone_events.scripts()
    assert batched.steps[0].stdout.startswith("fleetfix-checks 0\n") and batched.steps[2].rc == 4


def test_output_over_the_cap_is_not_used(tmp_path: Path, facts: dict[str, Any],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleetfix.playbook.runner.MAX_BATCH_OUTPUT", 4000)
    book = playbook_from("""\
name: big
steps:
  - name: big
    check: printf '%05000d' 0
  - name: small
    check: echo small
""", tmp_path)
    (alone, _, _), (batched, events, sh) = both(book, tmp_path, facts)
    assert steps(batched) == steps(alone) and batched.steps[0].stdout == "0" * 5000
    assert len(sh.scripts) == 3  # the batch, then each check on its own
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert batch["error"] == "output over the batch's cap" and batch["ran"] is None


def test_a_batch_that_cannot_run_is_not_used(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = (FakeTransport().on("fleetfix-checks", ConnectionLostError("channel refused"), times=1)
            .on("first is fine", stdout="first is fine\n").on("second is fine", stdout="second is fine\n")
            .on("no newline", stdout="no newline at the end").on("test -d", stdout=""))
    result, events = run(playbook_from(NOOP, tmp_path), fake, facts, batch=True)
    assert result.status == "ok" and len(fake.calls) == 5
    assert [s.reason for s in result.steps] == ["first is fine", "when is false: false", "second is fine",
                                                "no newline at the end", "check passed"]
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert batch["error"] == "not run: channel refused"


def test_an_unreadable_answer_is_not_used(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = (FakeTransport().on("fleetfix-checks", stdout="fleetfix-checks 0\nend 0\n", times=1)
            .on("first is fine", stdout="first is fine\n").on("second is fine", stdout="second is fine\n")
            .on("no newline", stdout="no newline at the end").on("test -d", stdout=""))
    result, events = run(playbook_from(NOOP, tmp_path), fake, facts, batch=True)
    assert result.status == "ok" and len(fake.calls) == 5
    [(_, batch)] = [e for e in events.events if e[0] == "check-batch"]
    assert batch["error"] == "unreadable result (exit 0)"


# --- the frame ------------------------------------------------------------------------------------


def frame(checks: list[str], nonce: str, tmp_path: Path) -> bytes:
    transport = SubprocessTransport(tmp_path)
    output = bytearray()
    transport.execute(("/bin/sh", "-s"), stdin=batch_script(checks, nonce, stop_at_failure=False).encode(),
                      on_output=lambda stream, chunk: output.extend(chunk) if stream == "stdout" else None)
    return bytes(output)


def test_the_frame_parses_and_every_cut_or_addition_is_refused(tmp_path: Path) -> None:
    nonce = new_nonce()
    output = frame(["printf 'x\\ny'", "echo e >&2; exit 7"], nonce, tmp_path)
    parsed = parse_batch(output, nonce, 2)
    assert parsed is not None
    assert [(c.rc, c.stdout, c.stderr) for c in parsed] == [(0, b"x\ny", b""), (7, b"", b"e\n")]
    assert all(isinstance(c, BatchedCheck) and c.duration is not None for c in parsed)
    assert parse_batch(output, "0" * 16, 2) is None  # another batch's nonce
    assert parse_batch(output, nonce, 1) is None  # more results than checks sent
    for cut in range(len(output)):
        assert parse_batch(output[:cut], nonce, 2) is None
        assert parse_batch(output[:cut] + b"z" + output[cut:], nonce, 2) is None


@pytest.mark.parametrize("stop", [True, False])
def test_stop_at_failure(tmp_path: Path, stop: bool) -> None:
    nonce = new_nonce()
    transport = SubprocessTransport(tmp_path)
    output = bytearray()
    transport.execute(("/bin/sh", "-s"), stdin=batch_script(["exit 1", "echo two"], nonce,
                                                            stop_at_failure=stop).encode(),
                      on_output=lambda stream, chunk: output.extend(chunk) if stream == "stdout" else None)
    parsed = parse_batch(bytes(output), nonce, 2)
    assert parsed is not None and [c.rc for c in parsed] == ([1] if stop else [1, 0])
