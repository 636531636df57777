"""Run records: written as things happen, readable after a crash, secrets masked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import ConfigError
from fleetfix.paths import default_state_dir
from fleetfix.playbook.records import RunRecorder, list_runs, load_run
from fleetfix.playbook.runner import FleetAccess, RunHooks, RunOptions, run_playbook
from fleetfix.secrets import MASK
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import FakeCall, FakeTransport
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from

BOOK = """\
name: recorded
steps:
  - name: first
    check: FIRST-CHECK
    apply: echo FIRST-APPLY {{ api_token }}
  - name: second
    apply: SECOND
"""


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_state_dir_resolution() -> None:
    assert default_state_dir({"FLEETFIX_STATE_DIR": "/s", "XDG_STATE_HOME": "/x"}) == Path("/s")
    assert default_state_dir({"XDG_STATE_HOME": "/x", "HOME": "/h"}) == Path("/x/fleetfix")
    assert default_state_dir({"HOME": "/h"}) == Path("/h/.local/state/fleetfix")


def test_events_are_on_disk_while_the_run_goes_on(tmp_path: Path, facts: dict[str, Any]) -> None:
    recorder = RunRecorder(tmp_path)
    seen_mid_run: list[dict[str, Any]] = []

    def second(call: FakeCall) -> CommandResult:
        # Read the log from outside, as a crash would leave it, while step two is running.
        seen_mid_run.extend(events(recorder.path))
        return CommandResult(0, "two\n", "", 0.0)

    fake = FakeTransport().on("FIRST-CHECK", rc=1, stdout="missing\n").on("FIRST-APPLY", stdout="one\n")
    fake.on("SECOND", second)
    book = playbook_from(BOOK, tmp_path)
    target = make_target("pve1/101", api_token="s3cr3t-value")
    run = run_playbook(
        book, [target],
        FleetAccess(StandInFleet({"pve1/101": fake}).map, lambda t, tr: facts),
        RunOptions(vars={"db_password": "hunter22", "x": 1}),
        RunHooks(recorder=recorder))
    recorder.close()
    kinds = [event["kind"] for event in seen_mid_run]
    assert kinds == ["run-start", "target-start", "script-start", "script-end", "script-start",
                     "script-end", "step", "script-start"]
    assert seen_mid_run[-1]["script"] == "SECOND"
    first_apply = seen_mid_run[4]
    assert first_apply["phase"] == "apply" and first_apply["script"] == f"echo FIRST-APPLY {MASK}"
    assert seen_mid_run[5]["stdout"] == "one\n" and seen_mid_run[5]["rc"] == 0
    assert seen_mid_run[0]["vars"] == {"db_password": MASK, "x": 1}

    text = recorder.path.read_text()
    assert "hunter22" not in text and "s3cr3t-value" not in text
    assert events(recorder.path)[-1]["kind"] == "run-end"
    assert run.run_id == recorder.run_id
    assert oct(os.stat(recorder.directory).st_mode & 0o777) == "0o700"


def test_list_and_load(tmp_path: Path, facts: dict[str, Any]) -> None:
    fake = FakeTransport().on("FIRST-CHECK", rc=1).on("FIRST-APPLY", stdout="one\n")
    fake.on("SECOND", rc=2, stderr="E: boom\n")
    with RunRecorder(tmp_path) as recorder:
        run_playbook(
            playbook_from(BOOK, tmp_path), [make_target("ct", api_token="tok")],
            FleetAccess(StandInFleet({"ct": fake}).map, lambda t, tr: facts),
            RunOptions(),
            RunHooks(recorder=recorder))
    [summary] = list_runs(tmp_path)
    assert (summary.playbook, summary.status, summary.targets) == ("recorded", "failed", ["ct"])
    assert summary.target_statuses == {"ct": "failed"}
    detail = load_run(tmp_path, summary.run_id)
    target = detail.targets["ct"]
    assert target.status == "failed" and target.facts == facts
    assert [(s.name, s.status) for s in target.steps] == [("first", "changed"), ("second", "failed")]
    assert [(r.phase, r.rc) for r in target.steps[0].scripts] == [("check", 1), ("apply", 0)]
    assert target.steps[1].scripts[0].stderr == "E: boom\n"


def test_a_crashed_run_reads_as_incomplete(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path)
    recorder.event("run-start", playbook="p", targets=["ct"], check=False)
    recorder.event("script-start", target="ct", playbook="p", step="s", phase="apply", attempt=1,
                   script="apt-get install x")
    recorder.close()
    with recorder.path.open("a") as handle:
        handle.write('{"kind": "script-en')  # the line a crash cut short
    [summary] = list_runs(tmp_path)
    assert summary.status == "incomplete"
    step = load_run(tmp_path, summary.run_id).targets["ct"].steps[0]
    assert step.status == "incomplete" and step.scripts[0].finished is False
    assert step.scripts[0].script == "apt-get install x"


def test_unknown_run_id(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such run"):
        load_run(tmp_path, "20260101T000000Z-abcdef")
    with pytest.raises(ConfigError, match="not a run id"):
        load_run(tmp_path, "../../etc")
    assert list_runs(tmp_path) == []
