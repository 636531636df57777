"""A step known from the facts (`facts_check`, docs/playbooks.md "Known from the facts"): ok without its
check while nothing on the target has changed, its check again from the first change on; the rules that
keep it honest. Scripts run for real in /bin/sh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import PlaybookError, TemplateError
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import (
    FleetAccess,
    RunContext,
    RunOptions,
    TargetRun,
    plan_target,
    run_playbook,
    run_target,
)
from tests.unit.playbook.conftest import StandInFleet, SubprocessTransport, make_target, playbook_from
from tests.unit.playbook.test_check_batch import Events

BOOK = """\
name: known
steps:
  - name: first
    facts_check: "{{ 'first is there' if facts.first else '' }}"
    check: test -f first && echo first checked
    apply: touch first
  - name: second
    facts_check: "{% if facts.second %}second is there{% endif %}"
    check: echo second checked live; test -f second
    apply: touch second
"""


def run(tmp_path: Path, facts: dict[str, Any], *, check: bool = False, batch: bool = True
        ) -> tuple[TargetRun, Events, SubprocessTransport]:
    book = playbook_from(BOOK, tmp_path)
    plan = plan_target([compile_playbook(book)], make_target("ct"), facts, {})
    (tmp_path / "ct").mkdir(exist_ok=True)
    transport, events = SubprocessTransport(tmp_path / "ct"), Events()
    result = run_target(plan, transport, RunContext(check_mode=check, recorder=events, batch_checks=batch))
    return result, events, transport


def steps(run: TargetRun) -> list[tuple[str, str, str]]:
    return [(step.name, step.status, step.reason) for step in run.steps]


def test_steps_the_facts_know_are_ok_and_run_nothing(tmp_path: Path) -> None:
    result, events, transport = run(tmp_path, {"first": True, "second": True})
    assert steps(result) == [("first", "ok", "first is there (from the facts)"),
                             ("second", "ok", "second is there (from the facts)")]
    assert transport.scripts == []
    assert [kind for kind, _ in events.events] == ["step", "step", "target-end"]
    assert [step.runs for step in result.steps] == [[], []]


def test_after_a_change_the_facts_no_longer_hold_and_the_check_runs(tmp_path: Path) -> None:
    """first is not known and changes the target: second's facts said it was there, but the facts are
    from before the change, so its check runs (and here finds it missing: the facts alone were wrong)."""
    result, _, transport = run(tmp_path, {"first": False, "second": True})
    assert steps(result) == [("first", "changed", "applied"), ("second", "changed", "applied")]
    assert result.steps[1].runs[0].phase == "check"
    assert result.steps[1].runs[0].stdout == "second checked live\n"
    assert (tmp_path / "ct" / "second").exists()
    assert len(transport.scripts) == 4  # first's check and apply, second's check and apply


def test_an_empty_rendering_runs_the_check_in_the_batch(tmp_path: Path) -> None:
    (tmp_path / "ct").mkdir()
    (tmp_path / "ct" / "first").touch()
    (tmp_path / "ct" / "second").touch()
    result, events, transport = run(tmp_path, {"first": False, "second": True})
    assert steps(result) == [("first", "ok", "first checked"),
                             ("second", "ok", "second is there (from the facts)")]
    assert len(transport.scripts) == 1  # first's check alone: a batch of one is sent on its own
    assert [kind for kind, _ in events.events if kind == "check-batch"] == []


def test_in_check_mode_nothing_changes_so_the_facts_hold_throughout(tmp_path: Path) -> None:
    result, _, transport = run(tmp_path, {"first": False, "second": True}, check=True)
    assert steps(result)[1] == ("second", "ok", "second is there (from the facts)")
    assert steps(result)[0][1] == "would-change"
    assert len(transport.scripts) == 1


REGISTERED = """\
  - name: r
    check: 'true'
    register: r
  - name: s
    facts_check: "{{ registered.r.rc }}"
    check: 'true'
"""


@pytest.mark.parametrize(("step", "message"), [
    ("  - name: s\n    facts_check: known\n    apply: 'true'\n", "steps.0.facts_check: needs check"),
    ("  - name: s\n    facts_check: known\n    check: 'true'\n    register: r\n",
     "steps.0.facts_check: not with register"),
    (REGISTERED, "steps.1.facts_check: step 's': facts_check is rendered when the target is planned"),
    ("  - name: s\n    facts_check: \"{{ facts.x\"\n    check: 'true'\n",
     "steps.0.facts_check: template syntax error"),
])
def test_what_a_facts_check_may_not_be_is_refused_at_load(tmp_path: Path, step: str, message: str) -> None:
    with pytest.raises(PlaybookError, match=message):
        compile_playbook(playbook_from(f"name: bad\nsteps:\n{step}", tmp_path))


def test_a_fact_that_is_not_there_is_a_template_error_naming_the_field(tmp_path: Path) -> None:
    book = playbook_from(BOOK, tmp_path)
    undefined = r"steps\.0\.facts_check: step 'first': facts\.first is undefined"
    with pytest.raises(TemplateError, match=undefined):
        plan_target([compile_playbook(book)], make_target("ct"), {}, {})


def test_a_later_serial_batch_runs_its_checks_the_facts_being_older_than_its_start(tmp_path: Path) -> None:
    """Every target's facts are gathered before the first batch: with --serial, the first batch takes
    their word, the later ones check (their steps may start long after)."""
    book = playbook_from(BOOK, tmp_path)
    targets = [make_target("a"), make_target("b")]
    transports = {}
    for target in targets:
        (tmp_path / target.name).mkdir()
        transports[target.name] = SubprocessTransport(tmp_path / target.name)
    run = run_playbook(book, targets, FleetAccess(StandInFleet(transports).map,  # type: ignore[arg-type]
                                                  lambda target, transport: {"first": True, "second": True}),
                       RunOptions(serial=1, batch_checks=True))
    first, second = run.targets
    assert [s.reason for s in first.steps] == ["first is there (from the facts)",
                                               "second is there (from the facts)"]
    assert [s.status for s in second.steps] == ["changed", "changed"]  # checked: neither file was there
    assert (transports["a"].scripts, len(transports["b"].scripts)) == ([], 4)
