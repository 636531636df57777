"""A target's check batch sent in its facts' own command (runner.run_playbook with FleetAccess.facts_then,
transport/session.py): the same steps and results as with a command of its own, one command fewer per
target, and only where nothing can happen between the checks and their steps. Scripts run for real in
/bin/sh on this machine."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetfix.playbook.model import Playbook
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult, OutputSink, StdinFeed, Transport, run_script
from fleetfix.transport.local import LocalTransport
from fleetfix.transport.session import run_then
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from
from tests.unit.playbook.test_check_batch import Events

BOOK = """\
name: files
steps:
  - name: one
    check: test -f {{ dir }}/one && echo one is there
    apply: touch {{ dir }}/one
  - name: two
    check: test -f {{ dir }}/two
    apply: touch {{ dir }}/two
  - name: three needs two
    check: test -f {{ dir }}/two && echo two is there >&2
    apply: echo never
  - name: assertion
    check: echo facts say {{ facts.word }}
"""

FACTS = {"word": "hello"}


class CountingTransport:
    """This machine's shell, counting the commands sent (each would be one `pct exec` on a node)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.local = LocalTransport(label)
        self.commands = 0

    def execute(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
                on_output: OutputSink | None = None) -> CommandResult:
        self.commands += 1
        return self.local.execute(argv, stdin=stdin, timeout=timeout, on_output=on_output)

    def feedable(self) -> CountingTransport:
        return self

    def execute_fed(self, argv: Sequence[str], feed: StdinFeed, *, timeout: float | None = None,
                    on_output: OutputSink | None = None) -> CommandResult:
        self.commands += 1
        return self.local.execute_fed(argv, feed, timeout=timeout, on_output=on_output)


FACTS_SCRIPT = f"printf '%s' '{json.dumps(FACTS)}'\n"


def facts_for(target: Target, transport: Transport) -> Mapping[str, Any]:
    return dict(json.loads(run_script(transport, FACTS_SCRIPT).stdout))


def facts_then(target: Target, transport: Transport, then: Callable[[Mapping[str, Any]], str | None]
               ) -> tuple[Mapping[str, Any], CommandResult | None] | None:
    """As `fleetfix apply`'s (probe.run.gather_facts_then), with a facts script of the test's own."""
    parsed: list[Mapping[str, Any]] = []

    def next_script(stdout: str) -> str | None:
        parsed.append(json.loads(stdout))
        return then(parsed[0])

    session = run_then(transport, FACTS_SCRIPT, next_script, timeout=60)
    return None if session is None else (parsed[0], session.second)


def apply(book: Playbook, tmp_path: Path, *, with_facts: bool, names: Sequence[str] = ("a", "b"),
          **options: Any) -> tuple[PlaybookRun, Events, dict[str, CountingTransport]]:
    targets = []
    for name in names:
        (tmp_path / name).mkdir(exist_ok=True)
        targets.append(make_target(name, dir=str(tmp_path / name)))
    transports = {target.name: CountingTransport(target.name) for target in targets}
    events = Events()
    fleet = FleetAccess(StandInFleet(transports).map, facts_for,  # type: ignore[arg-type]
                        facts_then=facts_then if with_facts else None)
    run = run_playbook(book, targets, fleet, RunOptions(batch_checks=True, **options),
                       RunHooks(recorder=events))
    return run, events, transports


def results(run: PlaybookRun) -> list[tuple[Any, ...]]:
    return [(target.target, target.status, [(s.name, s.status, s.reason, s.rc, s.stdout, s.stderr)
                                          for s in target.steps]) for target in run.targets]


def batches(events: Events) -> list[dict[str, Any]]:
    return [fields for kind, fields in events.events if kind == "check-batch"]


def test_a_noop_sends_its_checks_with_the_facts_and_reports_what_a_batch_of_its_own_reports(tmp_path: Path
                                                                                           ) -> None:
    book = playbook_from(BOOK, tmp_path)
    for where in ("alone", "with"):
        for name in ("a", "b"):
            (tmp_path / where / name).mkdir(parents=True)
            (tmp_path / where / name / "one").touch()
            (tmp_path / where / name / "two").touch()
    alone, alone_events, alone_transports = apply(book, tmp_path / "alone", with_facts=False)
    together, events, transports = apply(book, tmp_path / "with", with_facts=True)
    assert [r[:2] for r in results(together)] == [("a", "ok"), ("b", "ok")]
    assert [(n, s, [step[:2] + step[3:] for step in st]) for n, s, st in results(together)] == \
        [(n, s, [step[:2] + step[3:] for step in st]) for n, s, st in results(alone)]
    assert results(together)[0][2][0][4] == "one is there\n"
    assert results(together)[0][2][3][4] == "facts say hello\n"
    # one command per target for facts and checks, where a batch of its own takes two
    assert [t.commands for t in transports.values()] == [1, 1]
    assert [t.commands for t in alone_transports.values()] == [2, 2]
    assert [(b["with_facts"], b["ran"], b["error"]) for b in batches(events)] == [(True, 4, None)] * 2
    assert [(b["with_facts"], b["ran"]) for b in batches(alone_events)] == [(False, 4)] * 2
    # recorded after the target's start, as the runner records a target's facts before anything it runs
    kinds = [kind for kind, fields in events.events if fields.get("target") == "a"]
    assert kinds.index("target-start") < kinds.index("check-batch") < kinds.index("step")


def test_a_change_ends_the_batch_and_later_checks_run_afresh(tmp_path: Path) -> None:
    """Step two's check fails, so the batch stops there; step three's check, which only passes once
    two's apply ran, runs after it on its own and passes."""
    book = playbook_from(BOOK, tmp_path)
    run, events, _ = apply(book, tmp_path, with_facts=True, names=("a",))
    [(_, status, steps)] = results(run)
    assert status == "changed"
    assert [(name, step_status) for name, step_status, *_ in steps] == [
        ("one", "changed"), ("two", "changed"), ("three needs two", "ok"), ("assertion", "ok")]
    assert steps[2][5] == "two is there\n"
    [batch] = batches(events)
    assert (batch["with_facts"], batch["ran"]) == (True, 1)  # one's check failed: the batch ended there
    assert (tmp_path / "a" / "one").exists() and (tmp_path / "a" / "two").exists()


def test_check_mode_sends_every_check_with_the_facts_and_changes_nothing(tmp_path: Path) -> None:
    book = playbook_from(BOOK, tmp_path)
    run, events, transports = apply(book, tmp_path, with_facts=True, names=("a",), check_mode=True)
    assert [step[1] for step in results(run)[0][2]] == ["would-change", "would-change", "would-change", "ok"]
    assert [(b["with_facts"], b["ran"]) for b in batches(events)] == [(True, 4)]
    assert transports["a"].commands == 1
    assert list((tmp_path / "a").iterdir()) == []


def test_targets_in_later_serial_batches_check_when_their_batch_starts(tmp_path: Path) -> None:
    """With `serial`, a target's steps may wait behind other batches: its checks run when they start, in
    a command of their own, not minutes earlier with the facts."""
    book = playbook_from(BOOK, tmp_path)
    run, events, transports = apply(book, tmp_path, with_facts=True, serial=1)
    assert [b["with_facts"] for b in batches(events)] == [False, False]
    # the facts; the batch (ending at one's failing check); one's apply; two's check and apply; then
    # three's and the assertion's checks
    assert [t.commands for t in transports.values()] == [7, 7]
    assert run.status == "changed"


def test_a_template_error_on_one_target_runs_no_step_anywhere(tmp_path: Path) -> None:
    """The other target's checks went with its facts (they are read-only); no step ran, nothing changed."""
    book = playbook_from(BOOK.replace("facts.word", "facts.word if target.name == 'a' else facts.no.such"),
                         tmp_path)
    run, events, _ = apply(book, tmp_path, with_facts=True)
    assert run.aborted == "template error on 1 target(s); nothing was run"
    assert [target.steps for target in run.targets] == [[], []]
    assert [kind for kind, _ in events.events if kind in ("script-start", "step")] == []
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []
