"""Fleet.map with a fake connector: order, one connection per node, failure isolation, concurrency bounds."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from fleetfix.errors import CommandFailedError, ConnectError, FleetfixError, GuestError
from fleetfix.fleet import Fleet, Outcome, Pending, RunOnThread
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


# -- staged targets: started from the node's thread, finished as their results come in ------------------


class Batch:
    """A stand-in for a node's batch (guests/pctbatch.py): `start` feeds a target and returns its Pending;
    one thread of its own answers each fed target after `delay`, in the order fed, unless its CT id is in
    `silent` (never answered) or `refused` (answered "could not run it": run on a thread instead)."""

    def __init__(self, *, delay: float = 0.01, silent: Sequence[int] = (),
                 refused: Sequence[int] = ()) -> None:
        self.delay, self.silent, self.refused = delay, set(silent), set(refused)
        self.fed: list[int] = []
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._answers: list[tuple[float, int, Callable[[], None]]] = []
        self._wake = threading.Condition(self._lock)
        threading.Thread(target=self._answer, daemon=True).start()

    def start(self, target: Target, _transport: Transport, notify: Callable[[], None]) -> Pending[str] | None:
        ctid = target.guest.id
        assert ctid is not None
        if ctid < 0:
            return None  # not batched: the target function runs for it
        with self._lock:
            self.fed.append(ctid)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if ctid not in self.silent:
                self._answers.append((time.monotonic() + self.delay, ctid, notify))
                self._wake.notify()

        def finish() -> str:
            with self._lock:
                self.in_flight -= 1
            if ctid in self.silent:
                raise FleetfixError(f"no result for {ctid}")
            if ctid in self.refused:
                raise RunOnThread
            return f"batched {ctid}"

        return Pending(time.monotonic() + (0.2 if ctid in self.silent else 30.0), finish)

    def _answer(self) -> None:
        while True:
            with self._lock:
                while not self._answers:
                    self._wake.wait()
                due, _ctid, notify = self._answers.pop(0)
            time.sleep(max(0.0, due - time.monotonic()))
            notify()


def on_own_channel(target: Target, _transport: Transport) -> str:
    return f"own channel {target.guest.id}"


class ThreadsStarted:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = threading.Thread.start

        def counted(thread: threading.Thread) -> None:
            self.count += 1
            original(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)


def test_staged_targets_finish_on_their_nodes_thread_without_a_thread_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    batches = {name: Batch() for name in ("a", "b")}
    targets = [*targets_on("a", range(100, 120)), *targets_on("b", range(200, 220))]
    events: list[tuple[str, str]] = []

    def start(target: Target, transport: Transport, notify: Callable[[], None]) -> Pending[str] | None:
        return batches[target.node.name].start(target, transport, notify)

    threads = ThreadsStarted(monkeypatch)
    outcomes = Fleet(connect=FakeConnector(), channels_per_node=4).map(
        targets, on_own_channel, start=start, on_event=lambda kind, t, _d: events.append((kind, t.name)))
    assert [o.value for o in outcomes] == [f"batched {t.guest.id}" for t in targets]
    assert all(o.ok and o.duration > 0 for o in outcomes)
    assert threads.count <= 2  # the two nodes' threads; 40 targets, 4 in flight per node: none per target
    assert [b.peak for b in batches.values()] == [4, 4]  # channels_per_node still bounds what is in flight
    for target in targets:
        assert events.index(("start", target.name)) < events.index(("ok", target.name))


def test_a_staged_target_past_its_deadline_fails_alone() -> None:
    batch = Batch(silent=[102])
    outcomes = Fleet(connect=FakeConnector(), channels_per_node=2).map(
        targets_on("a", range(100, 106)), on_own_channel, start=batch.start)
    assert [o.status for o in outcomes] == ["ok", "ok", "failed", "ok", "ok", "ok"]
    assert str(outcomes[2].error) == "no result for 102"
    assert outcomes[2].duration >= 0.2


def test_targets_a_start_declines_or_hands_back_run_the_target_function() -> None:
    batch = Batch(refused=[101])
    targets = targets_on("a", [100, 101, -5, 103])
    outcomes = Fleet(connect=FakeConnector(), channels_per_node=2).map(targets, on_own_channel,
                                                                      start=batch.start)
    assert [o.value for o in outcomes] == ["batched 100", "own channel 101", "own channel -5", "batched 103"]


def test_a_staged_start_that_raises_fails_that_target_only() -> None:
    batch = Batch()

    def start(target: Target, transport: Transport, notify: Callable[[], None]) -> Pending[str] | None:
        if target.guest.id == 101:
            raise KeyError("surprise")
        return batch.start(target, transport, notify)

    outcomes = Fleet(connect=FakeConnector()).map(targets_on("a", [100, 101, 102]), on_own_channel,
                                                  start=start)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok"]
    assert str(outcomes[1].error) == "unexpected error: KeyError: 'surprise'"


def test_an_interrupt_starts_no_more_staged_targets_and_lets_the_started_finish() -> None:
    batch = Batch(delay=0.05)
    fleet = Fleet(connect=FakeConnector(), channels_per_node=2)

    def start(target: Target, transport: Transport, notify: Callable[[], None]) -> Pending[str] | None:
        if target.guest.id == 101:
            fleet.interrupt()
        return batch.start(target, transport, notify)

    outcomes = fleet.map(targets_on("a", range(100, 106)), on_own_channel, start=start)
    assert [o.status for o in outcomes] == ["ok", "ok", "failed", "failed", "failed", "failed"]
    assert batch.fed == [100, 101]
    assert str(outcomes[2].error) == "interrupted: not started"


def test_a_run_raises_the_soft_descriptor_limit_to_what_its_connections_need() -> None:
    """A run holds at most forks + spare (forks) connections open: 200 nodes at forks 200 under a soft limit
    of 300 would fail nodes midway with EMFILE, so the run raises the soft limit (up to the hard one) before
    dialling; at forks 32 the same nodes need room for 64 connections only."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1000:
        pytest.skip(f"the hard RLIMIT_NOFILE here is {hard}")
    targets = [target for index in range(200) for target in targets_on(f"n{index}", [100])]
    try:
        for forks, need in ((200, 2 * 200 + 256), (32, 2 * 64 + 256)):
            resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
            with Fleet(connect=FakeConnector(), forks=forks) as fleet:
                outcomes = fleet.map(targets, echo)
            assert all(outcome.ok for outcome in outcomes)
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (need, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_hard_descriptor_limit_too_low_is_refused_before_any_node_is_dialled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    from fleetfix.errors import ConfigError

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (300, 500))
    connector = FakeConnector()
    fleet = Fleet(connect=connector, forks=200)
    targets = [target for index in range(200) for target in targets_on(f"n{index}", [100])]
    for start in (lambda: fleet.start_connecting(targets), lambda: fleet.map(targets, echo)):
        with pytest.raises(ConfigError) as refused:
            start()
        assert str(refused.value) == (
            "200 nodes at --forks 200 hold up to 200 connections at once, which need about 656 open files, "
            "and this process may open at most 500 (RLIMIT_NOFILE, hard limit): raise it (`ulimit -n 656` "
            "as root, or LimitNOFILE=656 in the service's systemd unit), or lower --forks")
    assert not connector.attempts
    monkeypatch.setattr(resource, "setrlimit", lambda _which, _limits: None)
    assert all(o.ok for o in Fleet(connect=connector, forks=32).map(targets, echo))  # 64 at once: 384
