"""Fleet.map with a fake connector: order, one connection per node, failure isolation, concurrency bounds."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from fleetfix.errors import CommandFailedError, ConnectError, GuestError
from fleetfix.fleet import Fleet, Outcome
from fleetfix.guests.lxc import PctTransport
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult, Transport
from fleetfix.transport.fake import ANY, FakeCall, FakeTransport
from fleetfix.transport.local import LocalTransport


class FakeNode:
    """A node connection (a FakeTransport) answering with the CT id (or "node") and the last word of argv,
    each call taking `delay` so that concurrent calls overlap; tracks the most calls in flight at once."""

    def __init__(self, settings: SSHSettings, delay: float, stopped: set[int]) -> None:
        self.label, self.delay, self.stopped = settings.address, delay, stopped
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()
        self.transport = FakeTransport(settings.address).on(ANY, self.respond)

    def respond(self, call: FakeCall) -> CommandResult:
        argv = call.argv
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(self.delay)  # overlap, not synchronisation: the test checks peaks, not timings
            if argv[:2] == ("pct", "exec") and int(argv[2]) in self.stopped:
                return CommandResult(255, "", f"container '{argv[2]}' not running!\n", self.delay)
            where = argv[2] if argv[:2] == ("pct", "exec") else "node"
            return CommandResult(0, f"{self.label} {where} {argv[-1]}", "", self.delay)
        finally:
            with self._lock:
                self.running -= 1


class FakeConnector:
    def __init__(self, *, delay: float = 0.0, down: Sequence[str] = (), stopped: Sequence[int] = ()) -> None:
        self.delay = delay
        self.down = set(down)
        self.stopped = set(stopped)
        self.attempts: Counter[str] = Counter()
        self.connections: dict[str, FakeNode] = {}
        self._lock = threading.Lock()

    def __call__(self, settings: SSHSettings) -> FakeTransport:
        with self._lock:
            self.attempts[settings.address] += 1
        time.sleep(0.02)  # widen the window in which a second connect would sneak in
        if settings.address in self.down:
            raise ConnectError(f"{settings.address}:{settings.port}: connection refused")
        node = FakeNode(settings, self.delay, self.stopped)
        self.connections[settings.address] = node
        return node.transport


def node(name: str) -> NodeRef:
    return NodeRef(name, SSHSettings(address=name))


def targets_on(node_name: str, ctids: Sequence[int]) -> list[Target]:
    ref = node(node_name)
    return [Target(f"{node_name}/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in ctids]


def echo(_target: Target, transport: Transport) -> str:
    return transport.execute(["echo", "hi"]).check().stdout


def test_results_come_back_in_input_order_with_one_connection_per_node() -> None:
    connector = FakeConnector(delay=0.01)
    a, b = targets_on("a", range(100, 106)), targets_on("b", range(200, 204))
    mixed = [a[0], b[0], a[1], Target("b", node("b")), *b[1:], *a[2:]]
    with Fleet(connect=connector, forks=4, channels_per_node=3) as fleet:
        outcomes = fleet.map(mixed, echo)
    assert [o.target for o in outcomes] == mixed
    assert all(o.ok and o.error is None for o in outcomes)
    expected = [
        f"{t.node.name} {t.guest.id if t.guest.id is not None else 'node'} hi" for t in mixed
    ]
    assert [o.value for o in outcomes] == expected
    assert connector.attempts == Counter({"a": 1, "b": 1})
    assert all(c.transport.closed for c in connector.connections.values())  # closed by the context manager


def test_concurrent_first_use_opens_one_connection() -> None:
    connector = FakeConnector()
    fleet = Fleet(connect=connector)
    target = targets_on("a", [1])[0]
    threads = [threading.Thread(target=fleet.node_transport, args=(target,)) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert connector.attempts["a"] == 1


def test_a_node_that_cannot_connect_marks_all_its_targets_unreachable_once() -> None:
    connector = FakeConnector(down=["down"])
    down = targets_on("down", range(1, 8))
    up = targets_on("up", [1, 2])
    events: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def record(kind: str, target: Target, detail: str) -> None:
        with lock:
            events.append((kind, target.name, detail))

    outcomes = Fleet(connect=connector, channels_per_node=2).map([*down, *up], echo, on_event=record)
    assert connector.attempts["down"] == 1
    reasons = {str(o.error) for o in outcomes[:7]}
    assert reasons == {"down:22: connection refused"}
    assert [o.status for o in outcomes] == ["unreachable"] * 7 + ["ok", "ok"]
    assert all(isinstance(o.error, ConnectError) for o in outcomes[:7])
    assert sorted(kind for kind, *_ in events) == ["ok"] * 2 + ["start"] * 9 + ["unreachable"] * 7
    assert ("unreachable", "down/3", "down:22: connection refused") in events


def test_one_targets_exception_never_stops_the_others() -> None:
    def flaky(target: Target, transport: Transport) -> str:
        if target.guest.id == 2:
            raise CommandFailedError("command failed (exit 3): boom")
        if target.guest.id == 3:
            raise KeyError("surprise")
        return echo(target, transport)

    outcomes = Fleet(connect=FakeConnector(stopped=[4])).map(targets_on("a", [1, 2, 3, 4, 5]), flaky)
    assert [o.status for o in outcomes] == ["ok", "failed", "failed", "unreachable", "ok"]
    assert str(outcomes[1].error) == "command failed (exit 3): boom"
    assert str(outcomes[2].error) == "unexpected error: KeyError: 'surprise'"
    assert isinstance(outcomes[2].error.__cause__ if outcomes[2].error else None, KeyError)
    assert isinstance(outcomes[3].error, GuestError)
    assert str(outcomes[3].error) == "CT 4 on a is stopped"


def test_channels_per_node_and_forks_bound_concurrency() -> None:
    connector = FakeConnector(delay=0.05)
    nodes = [f"n{i}" for i in range(6)]
    targets = [t for name in nodes for t in targets_on(name, range(10))]
    active_nodes: Counter[str] = Counter()
    peak_nodes = 0
    lock = threading.Lock()

    def tracked(target: Target, transport: Transport) -> str:
        nonlocal peak_nodes
        with lock:
            active_nodes[target.node.name] += 1
            peak_nodes = max(peak_nodes, sum(1 for n in active_nodes.values() if n))
        try:
            return echo(target, transport)
        finally:
            with lock:
                active_nodes[target.node.name] -= 1

    outcomes = Fleet(connect=connector, forks=2, channels_per_node=3).map(targets, tracked)
    assert all(o.ok for o in outcomes)
    assert max(c.peak for c in connector.connections.values()) == 3  # reached, never exceeded
    assert peak_nodes == 2


def test_transports_are_pct_for_containers_and_local_without_ssh() -> None:
    fleet = Fleet(connect=FakeConnector())
    ct = fleet.transport(targets_on("a", [101])[0])
    assert isinstance(ct, PctTransport) and ct.ctid == 101 and ct.label == "a/101"
    here = Target("here", NodeRef("here", None))
    assert isinstance(fleet.transport(here), LocalTransport)
    outcomes = fleet.map([here], lambda _t, tr: tr.execute(["echo", "local"]).stdout)
    assert outcomes == [Outcome(here, "ok", "local\n", None, outcomes[0].duration)]


def test_invalid_bounds_are_rejected() -> None:
    with pytest.raises(ValueError):
        Fleet(forks=0)


def test_start_connecting_opens_each_node_once_in_the_background_and_map_uses_it() -> None:
    connector = FakeConnector(down=["down"])
    targets = [*targets_on("a", [100, 101]), *targets_on("down", [200]), *targets_on("b", [300])]
    with Fleet(connect=connector, forks=2) as fleet:
        fleet.start_connecting(targets)
        fleet.start_connecting(targets)  # again: connections are per node, opened once
        outcomes = fleet.map(targets, echo)
    assert connector.attempts == Counter({"a": 1, "b": 1, "down": 1})
    assert [o.status for o in outcomes] == ["ok", "ok", "unreachable", "ok"]
    assert "connection refused" in str(outcomes[2].error)
    assert all(c.transport.closed for c in connector.connections.values())


def test_close_waits_for_connections_still_being_opened() -> None:
    connector = FakeConnector()
    fleet = Fleet(connect=connector)
    fleet.start_connecting(targets_on("a", [100]))
    fleet.close()  # while the connector is still in its 20 ms: the connection is closed, never leaked
    assert connector.attempts["a"] == 1 and connector.connections["a"].transport.closed
