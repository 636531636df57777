"""The dedicated builder in `wheels` steps (playbook/clonebuild.py): a clone of the template builds each key,
is always destroyed, and the consumers install its wheel only where their key equals the clone's. Run through
run_playbook on this machine (local targets, real files, real sh, as test_wheel_trust_steps.py); the node's
`pct` is a recorder that answers as pve-container does (its semantics are the test bed's, tests/e2e/
test_lab.py and test_wheel_builder.py), and the clone runs the playbook locally."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetfix.guests.node import NodeGuest
from fleetfix.playbook.clonebuild import difference
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.target import NodeRef, Target, WheelBuilder
from fleetfix.transport.base import CommandResult, OutputSink
from fleetfix.transport.local import LocalTransport
from fleetfix.wheels.cache import WheelCache
from tests.unit.playbook.conftest import StandInFleet, playbook_from
from tests.unit.playbook.test_transfer_and_wheel_steps import ListRecorder
from tests.unit.playbook.test_wheel_trust_steps import BOOK, builds, built_on, hosts

SPEC = WheelBuilder(NodeRef("pve1", None), 9000, first_id=9900, ids=3)
# The key's torch comes from the facts: the clone's probe may report another torch than the consumers'.
FACT_BOOK = BOOK.replace('torch: "2.14.1+cu130"', "torch: \"{{ facts.get('torch', '2.14.1+cu130') }}\"")


class PctNode:
    """The node's `pct`: records each call; ids in `taken` exist already ("CT N already exists on node"),
    `fail` maps a subcommand to the error it dies with (exit 255, as PVE's CLI)."""

    def __init__(self, taken: Sequence[int] = (), fail: dict[str, str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.taken, self.fail = set(taken), fail or {}

    def execute(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
                on_output: OutputSink | None = None) -> CommandResult:
        assert argv[0] == "pct"
        self.calls.append(list(argv[1:]))
        if argv[1] == "clone" and int(argv[3]) in self.taken:
            return CommandResult(255, "", f"CT {argv[3]} already exists on node 'pve1'\n", 0.0)
        if argv[1] in self.fail:
            return CommandResult(255, "", self.fail[argv[1]] + "\n", 0.0)
        return CommandResult(0, "", "", 0.0)


def run(tmp_path: Path, targets: list[Target], cache: WheelCache, pct: PctNode, *, check: bool = False,
        recorder: ListRecorder | None = None, clone_facts: dict[str, Any] | None = None,
        book: str = FACT_BOOK, shown: list[str] | None = None) -> PlaybookRun:
    def guest_for(target: Target) -> NodeGuest:
        if target.name == SPEC.node.name:  # the builder's node, where pct runs
            return NodeGuest(target, pct)  # type: ignore[arg-type]
        return NodeGuest(target, LocalTransport(target.name))  # consumers and the clone: this machine

    def facts_for(target: Target, transport: object) -> dict[str, Any]:
        return dict(clone_facts or {}) if target.name.startswith("fleetfix-build-") else {}

    fleet = StandInFleet({target.name: LocalTransport(target.name) for target in targets})
    return run_playbook(
        playbook_from(book, tmp_path), targets,
        FleetAccess(fleet.map, facts_for, guest_for),
        RunOptions(check_mode=check, wheels=WheelOptions(cache)),
        RunHooks(recorder=recorder, on_step=lambda target, step: (shown if shown is not None else []).append(
            f"{target.name}: {step.name}")))


def consumers(tmp_path: Path, *names: str) -> list[Target]:
    return [dataclasses.replace(host, wheel_builder=SPEC) for host in hosts(tmp_path, *names)]


def test_a_clone_builds_once_and_both_consumers_install_its_wheel(tmp_path: Path) -> None:
    pct, recorder, shown = PctNode(taken=[9900]), ListRecorder(), []
    one, two = consumers(tmp_path, "one", "two")
    result = run(tmp_path, [one, two], WheelCache(tmp_path / "cache"), pct, recorder=recorder, shown=shown)
    # The clone's steps are shown as they end, like the targets' (a long build does not look like a hang).
    assert sorted(shown) == ["fleetfix-build-9901: wheels installed", "one: wheels installed",
                             "two: wheels installed"]
    assert {target.status for target in result.targets} == {"changed"}
    assert builds(tmp_path) == ["fleetfix-build-9901"]  # the consumers built nothing
    assert pct.calls == [
        ["clone", "9000", "9900", "--hostname", "fleetfix-build-9900"],  # taken: the next free id
        ["clone", "9000", "9901", "--hostname", "fleetfix-build-9901"],
        ["start", "9901"], ["stop", "9901"], ["destroy", "9901", "--force", "1"]]
    events = {event["target"]: event for event in recorder.of("wheel")}
    assert events["fleetfix-build-9901"]["action"] == "built"
    for host in (one, two):
        assert events[host.name]["action"] == "installed-from-cache"
        assert events[host.name]["built_on"] == "clone:pve1/9000"
        assert built_on(host) == "fleetfix-build-9901"
    for target in result.targets:
        assert "built on clone:pve1/9000" in target.steps[0].reason
    assert [entry.built_on for entry in WheelCache(tmp_path / "cache").entries()] == ["clone:pve1/9000"]
    assert [e["action"] for e in recorder.of("wheel-clone")] == ["cloned", "destroyed"]

    again = run(tmp_path, [one, two], WheelCache(tmp_path / "cache"), pct)
    assert {target.status for target in again.targets} == {"ok"} and len(pct.calls) == 5


def test_check_mode_clones_nothing(tmp_path: Path) -> None:
    pct = PctNode()
    result = run(tmp_path, consumers(tmp_path, "one"), WheelCache(tmp_path / "cache"), pct, check=True)
    assert result.targets[0].status == "would-change" and pct.calls == []


def test_a_clone_of_another_key_is_not_installed_the_consumer_builds_saying_why(tmp_path: Path) -> None:
    pct = PctNode()
    (one,) = consumers(tmp_path, "one")
    result = run(tmp_path, [one], WheelCache(tmp_path / "cache"), pct, clone_facts={"torch": "2.13.0+cu128"})
    reason = result.targets[0].steps[0].reason
    assert result.targets[0].status == "changed", reason
    assert builds(tmp_path) == ["fleetfix-build-9900", "one"] and built_on(one) == "one"
    assert ("dedicated builder clone:pve1/9000: the clone's key differs: torch '2.13.0+cu128' in the clone, "
            "'2.14.1+cu130' here; built here") in reason
    assert pct.calls[-2:] == [["stop", "9900"], ["destroy", "9900", "--force", "1"]]


def test_a_failing_clone_is_destroyed_and_the_consumer_builds_for_itself(tmp_path: Path) -> None:
    pct = PctNode()
    (one,) = consumers(tmp_path, "one")
    # Only the clone's build fails (its target name says it is the clone).
    broken = FACT_BOOK.replace("      build: |\n", "      build: |\n"
                               "        case {{ target.name }} in fleetfix-build-*) exit 7;; esac\n", 1)
    result = run(tmp_path, [one], WheelCache(tmp_path / "cache"), pct, book=broken)
    reason = result.targets[0].steps[0].reason
    assert result.targets[0].status == "changed" and built_on(one) == "one", reason
    assert "dedicated builder clone:pve1/9000: the playbook failed in clone CT 9900" in reason
    assert pct.calls[-2:] == [["stop", "9900"], ["destroy", "9900", "--force", "1"]]


def test_a_clone_that_cannot_be_destroyed_is_reported_with_its_id(tmp_path: Path) -> None:
    # PVE::AbstractConfig check_protection, as destroy_vm calls it: "can't remove CT 9900 - protection mode
    # enabled" (pve-guest-common; the wording is not checked here, only that it reaches the recap).
    pct = PctNode(fail={"destroy": "can't remove CT 9900 - protection mode enabled"})
    recorder = ListRecorder()
    (one,) = consumers(tmp_path, "one")
    result = run(tmp_path, [one], WheelCache(tmp_path / "cache"), pct, recorder=recorder)
    reason = result.targets[0].steps[0].reason
    assert "installed from the wheel cache" in reason  # the wheel it built is still good
    assert "clone CT 9900 left on pve1: can't remove CT 9900 - protection mode enabled" in reason
    assert [(e["action"], e["ctid"]) for e in recorder.of("wheel-clone")] == [("cloned", 9900),
                                                                             ("left-behind", 9900)]


def test_no_free_id_or_a_failing_clone_leaves_the_consumer_to_build(tmp_path: Path) -> None:
    pct = PctNode(taken=[9900, 9901, 9902])
    (one,) = consumers(tmp_path, "one")
    reason = run(tmp_path, [one], WheelCache(tmp_path / "cache"), pct).targets[0].steps[0].reason
    assert "cloning template 9000 on pve1 failed: no free id in 9900..9902; built here" in reason
    assert [call[0] for call in pct.calls] == ["clone"] * 3 and builds(tmp_path) == ["one"]


def test_full_clones_onto_a_storage(tmp_path: Path) -> None:
    pct = PctNode()
    spec = dataclasses.replace(SPEC, storage="local-zfs")
    (one,) = [dataclasses.replace(host, wheel_builder=spec) for host in hosts(tmp_path, "one")]
    run(tmp_path, [one], WheelCache(tmp_path / "cache"), pct)
    assert pct.calls[0] == ["clone", "9000", "9900", "--hostname", "fleetfix-build-9900", "--full", "1",
                            "--storage", "local-zfs"]


def test_difference_names_the_fields() -> None:
    wanted = {"name": "x", "torch": "2.14.1", "arch_list": "9.0"}
    assert difference(wanted, []) == "the clone built no x wheel"
    assert difference(wanted, [{"name": "x", "torch": "2.14.1", "arch_list": "8.0"}]) == (
        "the clone's key differs: arch_list '8.0' in the clone, '9.0' here")
