"""A Fleet's connections over a run: a node's connection is closed once its targets are done and not before,
and however many nodes a run has, at most forks + spare (dial-ahead and idle) connections are open at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from fleetfix.fleet import Fleet, Pending, RunOnThread
from fleetfix.playbook.runner import FleetAccess, RunOptions, run_playbook
from fleetfix.playbook.snapshots import SnapshotPolicy
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult, Transport
from fleetfix.transport.fake import ANY, FakeCall, FakeTransport
from tests.unit.playbook.conftest import playbook_from


class Wire:
    """The connector: every connection it opened, how many are open now and at most, and one timeline of
    each node's commands and its connection's close."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.open = 0
        self.peak = 0
        self.connects: Counter[str] = Counter()
        self.timeline: list[tuple[str, str, str]] = []  # (node, "call" or "close", what)
        self.on_closed: list[str] = []  # commands sent over a closed connection

    def __call__(self, settings: SSHSettings) -> WireNode:
        time.sleep(0.002)  # a connect takes a while: dial-ahead and the map overlap
        with self.lock:
            self.connects[settings.address] += 1
            self.open += 1
            self.peak = max(self.peak, self.open)
        return WireNode(self, settings.address)

    def events(self, node: str) -> list[tuple[str, str]]:
        with self.lock:
            return [(kind, what) for name, kind, what in self.timeline if name == node]


class WireNode(FakeTransport):
    """A node: `pct exec` runs the script on stdin as a shell would for `exit 1`, the other pct commands
    (status, snapshot, listsnapshot, rollback) succeed."""

    def __init__(self, wire: Wire, name: str) -> None:
        super().__init__(name)
        self.wire, self.name = wire, name
        self.on(ANY, self.respond)

    def respond(self, call: FakeCall) -> CommandResult:
        with self.wire.lock:
            self.wire.timeline.append((self.name, "call", call.text))
            if self.closed:
                self.wire.on_closed.append(f"{self.name}: {call.text}")
        time.sleep(self.wire.delay)
        if call.argv[:2] == ("pct", "exec"):
            return CommandResult(1 if b"exit 1" in call.stdin else 0, "out\n", "", self.wire.delay)
        if call.argv[:2] == ("pct", "status"):
            return CommandResult(0, "status: running\n", "", 0.0)
        return CommandResult(0, "", "", 0.0)

    def close(self) -> None:
        with self.wire.lock:
            if not self.closed:
                self.wire.open -= 1
                self.wire.timeline.append((self.name, "close", ""))
        super().close()


def fleet_of(nodes: int, cts: int) -> list[Target]:
    targets = []
    for index in range(nodes):
        ref = NodeRef(f"n{index:02d}", SSHSettings(address=f"n{index:02d}"))
        targets += [Target(f"n{index:02d}/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in range(100, 100 + cts)]
    return targets


def closed_after_its_last_command(wire: Wire, node: str) -> bool:
    events = wire.events(node)
    return bool(events) and events[-1][0] == "close" and [kind for kind, _ in events].count("close") == 1


def test_a_nodes_connection_closes_once_its_last_target_is_done_and_not_before() -> None:
    """12 nodes x 3 targets at forks 2: each node is connected once, its every command (the staged ones
    handed back to a thread too) goes over an open connection, and it is closed after its last one: all but
    the `spare` (forks) most recently done, which stay open for a later map until the Fleet closes."""
    wire = Wire(delay=0.005)
    targets = fleet_of(12, 3)
    ended: dict[str, float] = {}

    def echo(target: Target, transport: Transport) -> str:
        out = transport.execute(["echo", target.name]).check().stdout
        ended[target.name] = time.monotonic()
        return out

    def start(target: Target, _transport: Transport, notify: object) -> Pending[str] | None:
        if target.guest.id == 101:  # the retry path: started, then handed back to run on a thread
            def finish() -> str:
                raise RunOnThread
            assert callable(notify)
            notify()
            return Pending(time.monotonic() + 5, finish)
        return None

    with Fleet(connect=wire, forks=2, channels_per_node=2) as fleet:
        outcomes = fleet.map(targets, echo, start=start)
        assert all(outcome.ok for outcome in outcomes)
        assert wire.connects == Counter({f"n{index:02d}": 1 for index in range(12)})
        assert wire.on_closed == []
        still_open = {name for name in wire.connects if not any(
            kind == "close" for kind, _ in wire.events(name))}
        assert len(still_open) <= 2 and wire.open == len(still_open)  # spare: idle for a later map
        for name in set(wire.connects) - still_open:
            assert closed_after_its_last_command(wire, name), wire.events(name)
    assert wire.open == 0 and all(closed_after_its_last_command(wire, name) for name in wire.connects)


@pytest.mark.parametrize("forks", [1, 3])
def test_open_connections_never_exceed_forks_plus_dial_ahead(forks: int) -> None:
    """40 nodes dialled ahead, then mapped: never more than forks (worked on) + forks (spare: dialled ahead
    or idle) open at once, each node connected exactly once (dial-ahead never dials a node the map has
    reached), every target ok."""
    wire = Wire(delay=0.003)
    targets = fleet_of(40, 2)
    with Fleet(connect=wire, forks=forks, channels_per_node=2) as fleet:
        fleet.start_connecting(targets)
        outcomes = fleet.map(targets, lambda _t, tr: tr.execute(["true"]).check().stdout)
        assert all(outcome.ok for outcome in outcomes)
    assert wire.connects == Counter({f"n{index:02d}": 1 for index in range(40)})
    assert 0 < wire.peak <= 2 * forks
    assert wire.on_closed == [] and wire.open == 0


def test_a_second_map_of_the_same_nodes_reuses_their_spare_connections() -> None:
    wire = Wire()
    targets = fleet_of(3, 2)
    with Fleet(connect=wire, forks=3) as fleet:
        for _ in range(3):
            assert all(o.ok for o in fleet.map(targets, lambda _t, tr: tr.execute(["true"]).stdout))
    assert wire.connects == Counter({"n00": 1, "n01": 1, "n02": 1})


def test_a_connection_asked_for_outside_a_maps_targets_stays_open_for_its_caller() -> None:
    """A wheel builder's node, reached from another node's target: the map working on the builder's own
    targets meanwhile must not close it under that caller."""
    wire = Wire()
    targets = fleet_of(2, 1)
    builder = Target("builder", targets[1].node)  # the second node, as a playbook's clone build names it
    with Fleet(connect=wire, forks=1) as fleet:
        held: list[Transport] = []

        def on_first(target: Target, transport: Transport) -> str:
            if target is targets[0]:
                held.append(fleet.node_transport(builder))
            return transport.execute(["true"]).stdout

        assert all(o.ok for o in fleet.map(targets, on_first))
        assert all(o.ok for o in fleet.map(fleet_of(3, 1)[2:], on_first))  # a third node: evicts idle
        held[0].execute(["still", "open"])
    assert wire.on_closed == [] and wire.connects["n01"] == 1


BOOK = """\
name: demo
steps:
  - name: change
    check: echo CHECK; exit 1
    apply: echo APPLY; exit 1
    retries: 1
"""


@pytest.mark.parametrize(("nodes", "forks", "serial"), [(2, 2, None), (7, 1, 3)])
def test_apply_closes_a_node_only_after_its_snapshot_retries_and_rollback(
    tmp_path: Path, nodes: int, forks: int, serial: int | None,
) -> None:
    """apply over the real Fleet: facts (one map), then the steps in serial batches (a map each), every
    target snapshotted, its apply retried, failed, rolled back. Each node's rollbacks go over its open
    connection and the close comes after them; a node that fits the spare room is connected once for the
    whole run (plans, then runs), and however many nodes, at most forks + spare are open at once."""
    wire = Wire()
    targets = fleet_of(nodes, 2)
    with Fleet(connect=wire, forks=forks, channels_per_node=2) as fleet:
        result = run_playbook(
            playbook_from(BOOK, tmp_path), targets, FleetAccess(fleet.map, lambda _t, _tr: {}, fleet.guest),
            RunOptions(serial=serial, snapshots=SnapshotPolicy(take=True, rollback_on_failure=True)))
    assert [run.status for run in result.targets] == ["failed"] * len(targets)
    assert all(run.snapshot is not None and run.snapshot.rolled_back for run in result.targets)
    assert wire.on_closed == [] and wire.open == 0 and wire.peak <= 2 * forks
    for name in wire.connects:
        events = wire.events(name)
        scripts = [i for i, (_, what) in enumerate(events) if what.startswith("pct exec")]
        rollbacks = [i for i, (_, what) in enumerate(events) if what.startswith("pct rollback")]
        assert len(scripts) == 2 * 3 and len(rollbacks) == 2 and events[-1] == ("close", "")
        # From the node's first script to its last rollback, one connection: at forks 1 and serial 3 a node
        # whose targets straddle two batches is the last done in one and the first in the next.
        assert not any(kind == "close" for kind, _ in events[scripts[0]:rollbacks[-1]]), events
    if nodes <= forks:
        assert set(wire.connects.values()) == {1}
