"""The runner: statuses, check mode, retries, failure isolation, the fleet phases."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import CommandTimeoutError, ConnectionLostError, TemplateError
from fleetfix.playbook.model import Playbook
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import (
    FleetAccess,
    PlaybookRun,
    RunContext,
    RunOptions,
    TargetRun,
    plan_target,
    run_playbook,
    run_target,
)
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import FakeCall, FakeTransport
from tests.unit.playbook.conftest import StandInFleet, SubprocessTransport, make_target, playbook_from

BOOK = """\
name: demo
steps:
  - name: skip me
    when: facts.os.id == "ubuntu"
    apply: echo never
  - name: already fine
    check: echo FINE-CHECK; echo all good
    apply: echo never
  - name: make marker
    check: test -f MARKER-CHECK
    apply: echo MAKE-APPLY; echo made it
    verify: echo MARKER-VERIFY
"""


def run_one(book: Playbook, transport: Any, facts: dict[str, Any], *, check: bool = False,
            cli_vars: dict[str, Any] | None = None, **kwargs: Any) -> TargetRun:
    plan = plan_target([compile_playbook(book)], make_target("ct"), facts, cli_vars or {})
    return run_target(plan, transport, RunContext(check_mode=check, **kwargs))


def test_statuses_and_reasons(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = FakeTransport().on("FINE-CHECK", stdout="FINE\nall good\n").on("MARKER-CHECK", rc=1)
    fake.on("MAKE-APPLY", stdout="made it\n").on("MARKER-VERIFY")
    run = run_one(playbook_from(BOOK, tmp_path), fake, facts)
    assert [(s.name, s.status, s.reason) for s in run.steps] == [
        ("skip me", "skipped", 'when is false: facts.os.id == "ubuntu"'),
        ("already fine", "ok", "all good"),
        ("make marker", "changed", "made it"),
    ]
    assert run.status == "changed"
    assert run.counts() == {"ok": 1, "changed": 1, "would-change": 0, "failed": 0, "skipped": 1, "ignored": 0}
    assert [phase for phase in (r.phase for r in run.steps[2].runs)] == ["check", "apply", "verify"]
    # Nothing ran for the skipped step; the scripts went through /bin/sh -s.
    assert len(fake.calls) == 4 and all(call.is_script for call in fake.calls)


def test_check_mode_runs_only_when_and_check(tmp_path: Path, facts: dict[str, Any]) -> None:
    # apply and verify are not scripted: running either would raise NotImplementedError.
    fake = FakeTransport().on("FINE-CHECK").on("MARKER-CHECK", rc=1, stdout="no marker\n")
    run = run_one(playbook_from(BOOK, tmp_path), fake, facts, check=True)
    assert [s.status for s in run.steps] == ["skipped", "ok", "would-change"]
    assert run.steps[2].reason == "check: exit 1: no marker"
    assert run.status == "would-change"
    assert not any("APPLY" in text or "VERIFY" in text for text in fake.scripts)


def test_no_check_always_applies_and_is_would_change_in_check_mode(tmp_path: Path,
                                                                     facts: dict[str, Any]) -> None:
    book = playbook_from("name: n\nsteps:\n  - name: s\n    apply: echo DO\n", tmp_path)
    assert run_one(book, FakeTransport().on("DO"), facts).steps[0].status == "changed"
    checked = run_one(book, FakeTransport(), facts, check=True)
    assert checked.steps[0].status == "would-change"
    assert checked.steps[0].reason == "no check: apply always runs"


def test_verify_failure_fails_the_step_and_stops_the_target(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(BOOK + "  - name: after\n    apply: echo AFTER\n", tmp_path)
    fake = FakeTransport().on("FINE-CHECK").on("MARKER-CHECK", rc=1).on("MAKE-APPLY")
    fake.on("MARKER-VERIFY", rc=3, stderr="E: still broken\n")
    run = run_one(book, fake, facts)
    assert run.status == "failed"
    assert run.steps[-1].name == "make marker"  # "after" never ran
    assert run.steps[-1].reason == "verify failed: exit 3: E: still broken"
    assert run.steps[-1].stderr == "E: still broken\n" and run.steps[-1].rc == 3
    assert run.reason == "step 'make marker': verify failed: exit 3: E: still broken"


def test_assertion_step(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: a\nsteps:\n  - name: assert\n    check: ASSERT\n", tmp_path)
    failed = run_one(book, FakeTransport().on("ASSERT", rc=1, stderr="unsupported distro\n"), facts)
    assert failed.status == "failed"
    assert failed.steps[0].reason == "assertion failed: exit 1: unsupported distro"
    passed = run_one(book, FakeTransport().on("ASSERT", stdout="debian12\n"), facts)
    assert passed.status == "ok" and passed.steps[0].reason == "debian12"


def test_assertion_after_would_change_is_would_change_in_check_mode(tmp_path: Path,
                                                                      facts: dict[str, Any]) -> None:
    book = playbook_from("name: a\nsteps:\n  - name: fix\n    check: FIXED\n    apply: FIX\n"
                         "  - name: assert\n    check: ASSERT\n", tmp_path)
    fake = FakeTransport().on("FIXED", rc=1).on("ASSERT", rc=1, stdout="nvcc missing\n")
    run = run_one(book, fake, facts, check=True)
    assert [s.status for s in run.steps] == ["would-change", "would-change"]
    assert run.steps[1].reason == "not met before the changes above: exit 1: nvcc missing"


def test_retries_until_and_delay(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(
        "name: r\nsteps:\n  - name: flaky\n    apply: FLAKY\n    retries: 3\n    delay: 7\n"
        "    until: result.rc == 0 or 'lock' not in result.stderr\n", tmp_path)
    fake = FakeTransport().on("FLAKY", rc=100, stderr="E: Could not get lock /var/lib/dpkg/lock-frontend\n",
                              times=2).on("FLAKY", stdout="done\n")
    sleeps: list[float] = []
    run = run_one(book, fake, facts, sleep=sleeps.append)
    assert run.steps[0].status == "changed"
    assert [r.attempt for r in run.steps[0].runs] == [1, 2, 3]
    assert sleeps == [7, 7]


def test_until_stops_retrying_on_a_non_lock_error(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(
        "name: r\nsteps:\n  - name: flaky\n    apply: FLAKY\n    retries: 5\n"
        "    until: result.rc == 0 or 'lock' not in result.stderr\n", tmp_path)
    fake = FakeTransport().on("FLAKY", rc=100, stderr="E: Unable to locate package cuda-nvcc-12-8\n")
    run = run_one(book, fake, facts, sleep=lambda _: None)
    assert len(fake.calls) == 1
    assert run.steps[0].status == "failed"
    assert run.steps[0].reason == "apply failed: exit 100: E: Unable to locate package cuda-nvcc-12-8"


def test_retries_exhausted(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: r\nsteps:\n  - name: s\n    apply: NOPE\n    retries: 2\n", tmp_path)
    fake = FakeTransport().on("NOPE", rc=1)
    run = run_one(book, fake, facts, sleep=lambda _: None)
    assert len(fake.calls) == 3 and run.status == "failed"
    assert run.steps[0].reason == "apply failed (after 3 attempts): exit 1"


def test_changed_when_false_is_ok(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: c\nsteps:\n  - name: s\n    apply: MAYBE\n"
                         "    changed_when: \"'updated' in result.stdout\"\n", tmp_path)
    quiet = run_one(book, FakeTransport().on("MAYBE", stdout="nothing to do\n"), facts)
    busy = run_one(book, FakeTransport().on("MAYBE", stdout="updated 3\n"), facts)
    assert (quiet.steps[0].status, busy.steps[0].status) == ("ok", "changed")
    assert quiet.steps[0].reason == "apply made no change (changed_when)"


def test_yaml_booleans_are_accepted_where_a_boolean_expression_is(tmp_path: Path,
                                                                  facts: dict[str, Any]) -> None:
    """`changed_when: false` (YAML's boolean, not a string) means what it says, like `when` and `until`."""
    book = playbook_from("name: b\nsteps:\n"
                         "  - name: never\n    when: false\n    apply: NEVER\n"
                         "  - name: quiet\n    when: true\n    apply: QUIET\n    changed_when: false\n"
                         "  - name: once\n    apply: ONCE\n    retries: 3\n    until: true\n", tmp_path)
    assert [(s.when, s.changed_when, s.until) for s in book.steps] == [
        ("false", None, None), ("true", "false", None), (None, None, "true")]
    run = run_one(book, FakeTransport().on("QUIET").on("ONCE", rc=1), facts, sleep=lambda _: None)
    assert [(s.name, s.status) for s in run.steps] == [
        ("never", "skipped"), ("quiet", "ok"), ("once", "failed")]
    assert len(run.steps[2].runs) == 1  # until: true stops after the first attempt (its rc still counts)


def test_ignore_errors_goes_on(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: i\nsteps:\n  - name: bad\n    apply: BAD\n    ignore_errors: true\n"
                         "  - name: good\n    apply: GOOD\n", tmp_path)
    run = run_one(book, FakeTransport().on("BAD", rc=1).on("GOOD"), facts)
    assert [(s.status, s.ignored) for s in run.steps] == [("failed", True), ("changed", False)]
    assert run.status == "changed" and run.counts()["ignored"] == 1


def test_registered_results_feed_later_steps(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(
        "name: reg\nsteps:\n  - name: ask\n    apply: ASK\n    register: answer\n"
        "  - name: use\n    when: registered.answer.rc == 0\n"
        "    apply: echo got {{ registered.answer.stdout }}\n",
        tmp_path)
    fake = FakeTransport().on("ASK", stdout="42; rm -rf /").on("echo got")
    run = run_one(book, fake, facts)
    assert run.status == "changed"
    assert fake.scripts[-1] == "echo got '42; rm -rf /'"


def test_timeout_is_a_failed_step_not_a_lost_target(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: t\nsteps:\n  - name: slow\n    apply: SLOW\n    timeout: 5\n", tmp_path)
    fake = FakeTransport().on("SLOW", CommandTimeoutError("command timed out after 5s"))
    run = run_one(book, fake, facts)
    assert run.status == "failed" and run.steps[0].reason == "apply failed: timed out"
    assert fake.calls[0].timeout == 5


def test_transport_error_makes_the_target_unreachable(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = FakeTransport().on("FINE-CHECK").on("MARKER-CHECK", ConnectionLostError("ssh link dropped"))
    run = run_one(playbook_from(BOOK, tmp_path), fake, facts)
    assert run.status == "unreachable"
    assert run.reason == "step 'make marker': ssh link dropped"


def test_scripts_really_run(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(
        "name: real\nsteps:\n  - name: marker\n    check: test -f marker && echo marker exists\n"
        "    apply: echo {{ content }} > marker\n    verify: grep -q hello marker\n", tmp_path)
    transport = SubprocessTransport(tmp_path)
    first = run_one(book, transport, facts, cli_vars={"content": "hello"})
    second = run_one(book, transport, facts, cli_vars={"content": "hello"})
    assert (first.status, second.status) == ("changed", "ok")
    assert second.steps[0].reason == "marker exists"


# --- the fleet ----------------------------------------------------------------------------------

def fleet_of(*names: str, **transports: FakeTransport) -> tuple[list[Any], StandInFleet]:
    targets = [make_target(name) for name in names]
    return targets, StandInFleet({name: transports[name] for name in names})


def test_a_failing_target_does_not_stop_the_others(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: f\nsteps:\n  - name: s\n    check: CHECK\n    apply: APPLY\n", tmp_path)
    good = FakeTransport("a").on("CHECK", rc=1).on("APPLY")
    bad = FakeTransport("b").on("CHECK", rc=1).on("APPLY", rc=100, stderr="E: 404  Not Found\n")
    lost = FakeTransport("c").on("CHECK", ConnectionLostError("gone"))
    targets, fleet = fleet_of("a", "b", "c", a=good, b=bad, c=lost)
    run = run_playbook(book, targets, FleetAccess(fleet.map, lambda t, tr: facts), RunOptions())
    assert [(t.target, t.status) for t in run.targets] == [("a", "changed"), ("b", "failed"),
                                                           ("c", "unreachable")]
    assert run.targets[1].steps[0].stderr == "E: 404  Not Found\n"
    assert run.exit_code == 1 and run.status == "failed"


def test_undefined_var_stops_everything_before_any_command(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: u\nsteps:\n  - name: fine\n    apply: echo ok\n"
                         "  - name: typo\n    apply: echo {{ cuda_repo_bse }}\n", tmp_path)
    fakes = {"a": FakeTransport("a"), "b": FakeTransport("b")}
    targets, fleet = fleet_of("a", "b", **fakes)
    run = run_playbook(book, targets, FleetAccess(fleet.map, lambda t, tr: facts), RunOptions())
    assert all(fake.calls == [] for fake in fakes.values())
    assert isinstance(run.error, TemplateError) and run.exit_code == 2
    assert "steps.1.apply: step 'typo': 'cuda_repo_bse' is undefined" in str(run.error)
    assert {t.status for t in run.targets} == {"failed"}
    assert fleet.batches == [["a", "b"]]  # the run phase never started


def test_facts_failure_is_per_target(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: f\nsteps:\n  - name: s\n    apply: APPLY\n", tmp_path)
    targets, fleet = fleet_of("a", "b", a=FakeTransport().on("APPLY"), b=FakeTransport())

    def facts_for(target: Any, transport: Any) -> dict[str, Any]:
        if target.name == "b":
            raise ConnectionLostError("connection refused")
        return facts

    run = run_playbook(book, targets, FleetAccess(fleet.map, facts_for), RunOptions())
    assert [(t.target, t.status) for t in run.targets] == [("a", "changed"), ("b", "unreachable")]
    assert run.targets[1].reason == "gathering facts: connection refused"
    assert run.exit_code == 4  # unreachable only


def test_serial_batches_and_max_fail(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: f\nsteps:\n  - name: s\n    apply: APPLY\n", tmp_path)
    names = ["t1", "t2", "t3", "t4", "t5"]
    fakes = {name: FakeTransport(name).on("APPLY", rc=1 if name == "t2" else 0) for name in names}
    targets, fleet = fleet_of(*names, **fakes)
    run = run_playbook(
        book, targets,
        FleetAccess(fleet.map, lambda t, tr: facts),
        RunOptions(serial=2, max_fail_pct=10))
    assert fleet.batches == [names, ["t1", "t2"]]  # plan all, then the first batch, then stop
    assert [t.status for t in run.targets] == ["changed", "failed", "skipped", "skipped", "skipped"]
    assert run.aborted == "1 of 5 targets failed, over --max-fail 10%"
    assert all(fakes[name].calls == [] for name in ("t3", "t4", "t5"))


def test_serial_without_failures_runs_every_batch(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from("name: f\nsteps:\n  - name: s\n    apply: APPLY\n", tmp_path)
    names = ["t1", "t2", "t3"]
    targets, fleet = fleet_of(*names, **{n: FakeTransport(n).on("APPLY") for n in names})
    run = run_playbook(
        book, targets,
        FleetAccess(fleet.map, lambda t, tr: facts),
        RunOptions(serial=2, max_fail_pct=0))
    assert fleet.batches[1:] == [["t1", "t2"], ["t3"]]
    assert run.status == "changed" and run.exit_code == 0 and run.aborted is None


def test_recap(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = FakeTransport().on("FINE-CHECK").on("MARKER-CHECK", rc=1)
    targets, fleet = fleet_of("pve1/101", **{"pve1/101": fake})
    run: PlaybookRun = run_playbook(
        playbook_from(BOOK, tmp_path), targets,
        FleetAccess(fleet.map, lambda t, tr: facts),
        RunOptions(check_mode=True))
    assert run.recap() == [("pve1/101", "would-change", {"ok": 1, "changed": 0, "would-change": 1,
                                                         "failed": 0, "skipped": 1, "ignored": 0})]
    assert re.match(r"pve1/101\s+would-change\s+ok=1\s+changed=0\s+would-change=1", run.recap_lines()[0])
    assert run.to_dict()["targets"][0]["steps"][2]["status"] == "would-change"


def test_requires_chain_runs_in_order(tmp_path: Path, facts: dict[str, Any]) -> None:
    (tmp_path / "base.yaml").write_text("name: base\nvars:\n  who: base\nsteps:\n  - name: s\n"
                                        "    apply: echo BASE {{ who }}\n")
    book = playbook_from("name: top\nrequires: [base.yaml]\nvars:\n  who: top\nsteps:\n  - name: s\n"
                         "    apply: echo TOP {{ who }}\n", tmp_path, "top.yaml")
    fake = FakeTransport().on("BASE").on("TOP")
    targets, fleet = fleet_of("a", a=fake)
    run = run_playbook(book, targets, FleetAccess(fleet.map, lambda t, tr: facts), RunOptions())
    assert fake.scripts == ["echo BASE base", "echo TOP top"]
    assert [(s.playbook, s.name) for s in run.targets[0].steps] == [("base", "s"), ("top", "s")]


def test_fake_transport_refuses_unscripted_commands() -> None:
    fake = FakeTransport().on("known", exact=True)
    with pytest.raises(NotImplementedError, match="unknown"):
        fake.execute(["/bin/sh", "-s"], stdin=b"unknown")
    assert fake.execute(["/bin/sh", "-s"], stdin=b"known").ok
    fake.on(re.compile(r"^uname -m$"), lambda call: CommandResult(0, call.text, "", 0.0))
    assert fake.execute(["uname", "-m"]).stdout == "uname -m"
    assert [c.text for c in fake.calls] == ["unknown", "known", "uname -m"]
    assert isinstance(fake.calls[0], FakeCall)
