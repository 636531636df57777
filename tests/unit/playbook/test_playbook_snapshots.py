"""Snapshots around changes: names, listsnapshot parsing, pruning, and the runner's use of SnapshotGuard."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import ConnectError
from fleetfix.guests import open_guest
from fleetfix.guests.base import Guest, parse_snapshot_tree
from fleetfix.guests.lxc import LxcGuest
from fleetfix.playbook.records import RunRecorder, load_run
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.snapshots import (
    PVE_SNAPSHOT_NAME,
    SnapshotPolicy,
    own_snapshot_key,
    snapshot_name,
    to_prune,
)
from fleetfix.target import GuestRef, Target
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import FakeCall, FakeTransport
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from

BOOK = """\
name: demo
steps:
  - name: fine already
    check: echo FINE-CHECK
    apply: echo never
  - name: first change
    check: echo ONE-CHECK; exit 1
    apply: echo ONE-APPLY
  - name: second change
    check: echo TWO-CHECK; exit 1
    apply: echo TWO-APPLY
    verify: echo TWO-VERIFY
"""

LISTING = """\
`-> before-upgrade              2026-11-01 10:00:00     by hand
 `-> fleetfix-20261101-100000   2026-11-01 10:00:00     fleetfix apply demo
  `-> fleetfix-manual           2026-11-02 10:00:00     someone else's
   `-> fleetfix-20261102-100000 2026-11-02 10:00:00     fleetfix apply demo
    `-> fleetfix-20261103-120000 2026-11-03 12:00:00    fleetfix apply demo
"""


# --- names and parsing ---------------------------------------------------------------------------------

def test_snapshot_names_are_valid_pve_names_in_utc() -> None:
    local = datetime(2026, 12, 2, 13, 46, 13, tzinfo=timezone(timedelta(hours=2)))
    name = snapshot_name(local)
    assert name == "fleetfix-20261202-114613"  # converted to UTC
    for attempt in (0, 1, 99):
        candidate = snapshot_name(local, attempt)
        assert PVE_SNAPSHOT_NAME.match(candidate) and len(candidate) <= 40
        assert own_snapshot_key(candidate) is not None
    assert snapshot_name(local, 2) == name + "-2"


def test_listsnapshot_tree_is_parsed_without_current() -> None:
    assert parse_snapshot_tree(LISTING) == [
        "before-upgrade", "fleetfix-20261101-100000", "fleetfix-manual", "fleetfix-20261102-100000",
        "fleetfix-20261103-120000"]
    assert parse_snapshot_tree(LISTING + "     `-> current          You are here!\n")[-1] != "current"
    assert parse_snapshot_tree("`-> current                You are here!\n") == []


def test_pruning_keeps_the_newest_and_never_touches_other_names() -> None:
    names = [*parse_snapshot_tree(LISTING), "fleetfix-20261103-120000-1"]
    assert to_prune(names, 1) == ["fleetfix-20261101-100000", "fleetfix-20261102-100000",
                                  "fleetfix-20261103-120000"]
    assert to_prune(names, 3) == ["fleetfix-20261101-100000"]
    assert to_prune(names, 10) == []
    assert own_snapshot_key("fleetfix-manual") is None and own_snapshot_key("before-upgrade") is None


def test_guest_commands_are_argv_with_an_int_id() -> None:
    node = FakeTransport("pve1").on("pct rollback", rc=0)
    LxcGuest(make_target("ct101"), node).rollback("fleetfix-x", start=True)
    assert node.calls[0].argv == ("pct", "rollback", "101", "fleetfix-x", "--start", "1")
    hostile = dataclasses.replace(make_target("ct101"), guest=GuestRef("lxc", "101; reboot"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LxcGuest(hostile, node)
    with pytest.raises(ValueError):
        SnapshotPolicy(take=True, keep=0)


# --- the runner ------------------------------------------------------------------------------------------

class Node(FakeTransport):
    """A node's pct, scripted: status, snapshot (remembered, so listsnapshot shows it), rollback,
    listsnapshot, delsnapshot. Shares an ordered log with the container, to see what ran before what."""

    def __init__(self, log: list[str], *, status: str = "running", snapshot_stderr: str = "",
                 collisions: int = 0, listing: str = "", rollback_rc: int = 0) -> None:
        super().__init__("pve1")
        self.log, self.listing, self.collisions = log, listing, collisions
        self.on(re.compile("^pct "), self.respond)
        self.status, self.snapshot_stderr, self.rollback_rc = status, snapshot_stderr, rollback_rc

    def respond(self, call: FakeCall) -> CommandResult:
        self.log.append(call.text)
        command, name = call.argv[1], call.argv[3] if len(call.argv) > 3 else ""
        if command == "status":
            return CommandResult(0, f"status: {self.status}\n", "", 0.0)
        if command == "snapshot" and self.collisions:
            self.collisions -= 1
            return CommandResult(255, "", f"snapshot name '{name}' already used\n", 0.0)
        if command == "snapshot" and self.snapshot_stderr:
            return CommandResult(255, "", self.snapshot_stderr, 0.0)
        if command == "snapshot":
            self.listing += f"`-> {name}  2026-12-02 11:46:13  fleetfix\n"
            return CommandResult(0, "", "", 0.0)
        if command == "listsnapshot":
            return CommandResult(0, self.listing + "`-> current  You are here!\n", "", 0.0)
        if command == "rollback" and self.rollback_rc:
            return CommandResult(self.rollback_rc, "", "rollback broke\n", 0.0)
        return CommandResult(0, "", "", 0.0)

    @property
    def pct(self) -> list[str]:
        return [text for text in self.log if text.startswith("pct ")]


def container(log: list[str], *, fail: str | None = None) -> FakeTransport:
    fake = FakeTransport("ct")

    def respond(call: FakeCall) -> CommandResult:
        marker = re.search(r"echo ([A-Z]+-[A-Z]+)", call.text)
        assert marker is not None
        log.append(marker.group(1))
        failing = fail is not None and fail in call.text
        return CommandResult(1 if failing or "exit 1" in call.text else 0, "", "boom\n" * failing, 0.0)

    return fake.on(re.compile("."), respond)


def run(book_text: str, tmp_path: Path, target: Target, ct: FakeTransport, node: FakeTransport,
        policy: SnapshotPolicy | None, *, check: bool = False) -> tuple[PlaybookRun, list[dict[str, Any]]]:
    with RunRecorder(tmp_path / "state") as recorder:
        result = run_playbook(
            playbook_from(book_text, tmp_path), [target],
            FleetAccess(StandInFleet({target.name: ct}).map, lambda _t, _tr: {},
                        lambda target: open_guest(target, node)),
            RunOptions(check_mode=check, snapshots=policy),
            RunHooks(recorder=recorder))
    events = load_run(tmp_path / "state", result.run_id or "").events
    return result, events


def test_snapshot_is_taken_once_right_before_the_first_change(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log)
    result, events = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                         SnapshotPolicy(take=True))
    target = result.targets[0]
    assert target.status == "changed"
    snapshot = log[3]
    assert log[:3] == ["FINE-CHECK", "ONE-CHECK", "pct status 101"]
    assert re.fullmatch(
        r"pct snapshot 101 fleetfix-\d{8}-\d{6} --description 'fleetfix apply demo \(run .*\)'", snapshot)
    assert log[4:] == ["ONE-APPLY", "TWO-CHECK", "TWO-APPLY", "TWO-VERIFY"]
    assert target.snapshot is not None and target.snapshot.name == snapshot.split()[3]
    assert f"snapshot {target.snapshot.name}" in result.recap_lines()[0]
    assert [e["snapshot"] for e in events if e["kind"] == "snapshot"] == [target.snapshot.name]
    assert target.to_dict()["snapshot"]["name"] == target.snapshot.name


def test_runs_show_shows_the_snapshot_and_the_rollback(tmp_path: Path) -> None:
    """`fleetfix runs show` (and `audit --remediate --snapshot`'s apply run, which is one) says which
    snapshot each target got and whether it was rolled back: the way back is what a reader looks for."""
    from fleetfix.reports.text import render_text

    log: list[str] = []
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log, fail="TWO-VERIFY"), Node(log),
                    SnapshotPolicy(take=True, rollback_on_failure=True))
    detail = load_run(tmp_path / "state", result.run_id or "")
    snapshot = detail.targets["ct101"].snapshot
    assert snapshot is not None and snapshot == result.targets[0].snapshot
    text = render_text(detail)
    assert "\n== ct101 failed" in text and f"\n  rolled back to {snapshot.name}\n" in text
    assert detail.to_json()["targets"]["ct101"]["snapshot"]["name"] == snapshot.name
    # A run killed before the target ended still shows the snapshot it took.
    events_path = tmp_path / "state" / "runs" / (result.run_id or "") / "events.jsonl"
    lines = events_path.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if '"kind": "snapshot"' in line)
    events_path.write_text("\n".join(lines[:cut + 1]) + "\n")
    killed = load_run(tmp_path / "state", result.run_id or "")
    assert killed.summary.status == "incomplete"
    assert f"\n  snapshot {snapshot.name}\n" in render_text(killed)


def test_nothing_to_change_or_check_mode_takes_no_snapshot(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log)
    fine = "name: fine\nsteps:\n  - name: ok\n    check: echo FINE-CHECK\n    apply: echo NEVER-RUNS\n"
    result, _ = run(fine, tmp_path, make_target("ct101"), container(log), node, SnapshotPolicy(take=True))
    assert result.targets[0].status == "ok" and result.targets[0].snapshot is None
    checked, _ = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                     SnapshotPolicy(take=True, rollback_on_failure=True), check=True)
    assert checked.targets[0].status == "would-change"
    assert node.pct == [] and node.calls == []


def test_playbook_level_snapshot_setting(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log)
    result, _ = run("snapshot: true\n" + BOOK, tmp_path, make_target("ct101"), container(log), node, None)
    assert result.targets[0].snapshot is not None and result.targets[0].snapshot.name
    assert sum(text.startswith("pct snapshot") for text in node.pct) == 1


@pytest.mark.parametrize(("status", "start"), [("running", " --start 1"), ("stopped", "")])
def test_failed_target_is_rolled_back_restarting_only_a_running_ct(tmp_path: Path, status: str,
                                                                  start: str) -> None:
    log: list[str] = []
    node = Node(log, status=status)
    result, events = run(BOOK, tmp_path, make_target("ct101"), container(log, fail="TWO-VERIFY"), node,
                         SnapshotPolicy(take=True, rollback_on_failure=True))
    target = result.targets[0]
    assert target.status == "failed"
    assert target.snapshot is not None and target.snapshot.rolled_back
    name = target.snapshot.name
    assert node.pct[-1] == f"pct rollback 101 {name}{start}"
    assert log[-2:] == ["TWO-VERIFY", node.pct[-1]]  # after the failure, nothing after the rollback
    assert result.recap_lines()[0].endswith(f"rolled back to {name}")
    rollback = [e for e in events if e["kind"] == "rollback"]
    assert len(rollback) == 1 and rollback[0]["ok"] is True and rollback[0]["snapshot"] == name
    assert result.exit_code == 1


def test_failure_without_rollback_flag_keeps_the_change(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log)
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log, fail="TWO-VERIFY"), node,
                    SnapshotPolicy(take=True))
    assert not any(text.startswith("pct rollback") for text in node.pct)
    assert result.targets[0].snapshot is not None and not result.targets[0].snapshot.rolled_back


def test_a_failed_rollback_is_reported(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, rollback_rc=255)
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log, fail="ONE-APPLY"), node,
                    SnapshotPolicy(take=True, rollback_on_failure=True))
    snapshot = result.targets[0].snapshot
    assert snapshot is not None and not snapshot.rolled_back and snapshot.rollback_error == "rollback broke"
    assert "ROLLBACK FAILED (rollback broke)" in result.recap_lines()[0]


def test_storage_without_snapshots_refuses_the_change(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, snapshot_stderr="snapshot feature is not available\n")
    result, events = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                         SnapshotPolicy(take=True, rollback_on_failure=True))
    target = result.targets[0]
    assert target.status == "failed"
    assert "ONE-APPLY" not in log and "TWO-CHECK" not in log
    failed = target.steps[1]
    assert failed.name == "first change" and failed.status == "failed"
    assert failed.reason == ("not changed: no snapshot: pct snapshot: snapshot feature is not available "
                             "(--allow-no-snapshot changes it anyway)")
    assert result.recap_lines()[0].endswith(
        "not changed, no snapshot: pct snapshot: snapshot feature is not available")
    assert not any(text.startswith("pct rollback") for text in node.pct)
    assert [e["refused"] for e in events if e["kind"] == "snapshot"] == [True]


def test_allow_no_snapshot_changes_it_anyway(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, snapshot_stderr="snapshot feature is not available\n")
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                    SnapshotPolicy(take=True, allow_no_snapshot=True))
    assert result.targets[0].status == "changed" and "TWO-APPLY" in log
    assert "no snapshot: pct snapshot: snapshot feature is not available" in result.recap_lines()[0]


def test_other_snapshot_errors_always_refuse(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, snapshot_stderr="CT is locked (backup)\n")
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                    SnapshotPolicy(take=True, allow_no_snapshot=True))
    assert result.targets[0].status == "failed" and "ONE-APPLY" not in log
    assert "CT is locked (backup)" in result.targets[0].steps[1].reason


def test_unreachable_node_refuses(tmp_path: Path) -> None:
    log: list[str] = []

    def guest_for(_target: Target) -> Guest:
        raise ConnectError("127.0.0.1:1: connection refused")

    with RunRecorder(tmp_path / "state") as recorder:
        target = make_target("ct101")
        result = run_playbook(
            playbook_from(BOOK, tmp_path), [target],
            FleetAccess(StandInFleet({target.name: container(log)}).map, lambda _t, _tr: {}, guest_for),
            RunOptions(snapshots=SnapshotPolicy(take=True, allow_no_snapshot=True)),
            RunHooks(recorder=recorder))
    assert result.targets[0].status == "failed" and "ONE-APPLY" not in log
    assert "connection refused" in result.targets[0].steps[1].reason


@pytest.mark.parametrize("allow", [False, True])
def test_a_node_cannot_be_snapshotted(tmp_path: Path, allow: bool) -> None:
    log: list[str] = []
    node = Node(log)
    result, _ = run(BOOK, tmp_path, make_target("pve1", ctid=None), container(log), node,
                    SnapshotPolicy(take=True, allow_no_snapshot=allow))
    assert node.calls == []
    assert ("ONE-APPLY" in log) is allow
    assert result.targets[0].status == ("changed" if allow else "failed")
    assert "a node is not a guest and cannot be snapshotted" in result.recap_lines()[0]


def test_keep_prunes_only_older_fleetfix_snapshots(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, listing=LISTING)
    result, events = run(BOOK, tmp_path, make_target("ct101"), container(log), node,
                         SnapshotPolicy(take=True, keep=2))
    deleted = [text.split()[3] for text in node.pct if text.startswith("pct delsnapshot")]
    # Kept: the one just taken and fleetfix-20261103-120000; never before-upgrade or fleetfix-manual.
    assert deleted == ["fleetfix-20261101-100000", "fleetfix-20261102-100000"]
    snapshot = result.targets[0].snapshot
    assert snapshot is not None and snapshot.pruned == deleted
    assert node.pct.index("pct listsnapshot 101") > next(
        i for i, text in enumerate(node.pct) if text.startswith("pct snapshot"))
    assert [e["deleted"] for e in events if e["kind"] == "snapshot-prune"] == [deleted]


def test_a_name_collision_retries_with_a_suffix(tmp_path: Path) -> None:
    log: list[str] = []
    node = Node(log, collisions=1)
    result, _ = run(BOOK, tmp_path, make_target("ct101"), container(log), node, SnapshotPolicy(take=True))
    snapshot = result.targets[0].snapshot
    assert snapshot is not None and snapshot.name is not None and snapshot.name.endswith("-1")
    attempts = [text.split()[3] for text in node.pct if text.startswith("pct snapshot")]
    assert attempts == [snapshot.name[:-2], snapshot.name]
