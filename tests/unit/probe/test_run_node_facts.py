"""Node facts are gathered once per node without holding up that node's container probes."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from fleetfix.errors import ConnectionLostError
from fleetfix.fleet import Fleet
from fleetfix.probe.run import probe_each, probe_targets
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import ANY, FakeCall, FakeTransport

HEALTHY = (Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "healthy.json").read_text()
CTIDS = (200, 201, 202)


class SlowNodeFacts:
    """A node whose node-facts script answers only once the other containers have been probed (or after
    5 s): if container probes queued behind node facts, it would wait out the 5 s."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.node_facts_runs = 0
        self.probed: list[int] = []
        self.others_probed = threading.Event()
        self.node_facts_waited_for_nothing = False
        self.node = FakeTransport("pve1")
        self.node.on(re.compile(r"^pct exec "), self.probe)
        self.node.on(ANY, self.node_facts)  # the node-facts script, on the node itself

    def node_facts(self, call: FakeCall) -> CommandResult:
        with self.lock:
            self.node_facts_runs += 1
        self.node_facts_waited_for_nothing = self.others_probed.wait(timeout=5)
        return CommandResult(0, "fleetfix-node-facts 1\nhostname\tpve1\n", "", 0.0)

    def probe(self, call: FakeCall) -> CommandResult:
        with self.lock:
            self.probed.append(int(call.argv[2]))
            if len(self.probed) >= len(CTIDS) - 1:
                self.others_probed.set()
        return CommandResult(0, HEALTHY, "", 0.0)

    def connect(self, _settings: SSHSettings) -> FakeTransport:
        return self.node


def test_node_facts_once_per_node_while_its_containers_are_probed() -> None:
    node = SlowNodeFacts()
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    targets = [Target(f"pve1/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in CTIDS]
    with Fleet(connect=node.connect, channels_per_node=len(CTIDS)) as fleet:
        reports = probe_targets(fleet, targets)
    assert [report.status for report in reports] == ["ok"] * len(CTIDS)
    assert node.node_facts_runs == 1
    assert node.node_facts_waited_for_nothing, "container probes waited for the node facts"
    assert sorted(node.probed) == list(CTIDS)
    assert all(report.node is not None and report.node.hostname == "pve1" for report in reports)


def test_a_vm_runs_its_own_kernel_so_node_facts_are_neither_gathered_nor_applied() -> None:
    # A node with one VM: `qm guest exec` answers with the probe's JSON in qm's format; anything else
    # (node facts) is not scripted, so the fake would refuse it.
    status = {"exitcode": 0, "exited": 1, "out-data": HEALTHY}
    node = FakeTransport("pve1").on(re.compile(r"^qm guest exec "), stdout=json.dumps(status))
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    with Fleet(connect=lambda _settings: node) as fleet:
        [report] = probe_targets(fleet, [Target("gpu-vm", ref, GuestRef.vm(300))])
    assert report.status == "ok" and report.facts is not None
    assert report.node is None and all(call.argv[:3] == ("qm", "guest", "exec") for call in node.calls)


def test_probe_each_hands_every_report_to_on_done_and_keeps_none() -> None:
    """What the audit probes with (issue 21): each report, probed or not, reaches on_done with its facts;
    nothing is returned, so nothing per target outlives its on_done."""
    stopped = "container '202' not running!\n"
    node = FakeTransport("pve1").on(re.compile(r"^pct exec 202 "), rc=255, stderr=stopped)
    node.on(re.compile(r"^pct exec "), stdout=HEALTHY)
    node.on(ANY, stdout="fleetfix-node-facts 1\nhostname\tpve1\n")
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    targets = [Target(f"pve1/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in CTIDS]
    seen: dict[str, tuple[str, bool]] = {}
    with Fleet(connect=lambda _settings: node) as fleet:
        returned = probe_each(fleet, targets, on_done=lambda report: seen.update(
            {report.target.name: (report.status, report.facts is not None)}))
    assert returned is None
    assert seen == {"pve1/200": ("ok", True), "pve1/201": ("ok", True), "pve1/202": ("unreachable", False)}


class Rendezvous:
    """One container on a node whose node-facts script and container probe each answer only once the other
    has started (or after 5 s): run one after the other, as they were, each would wait out its 5 s."""

    def __init__(self) -> None:
        self.node_facts_started = threading.Event()
        self.probe_started = threading.Event()
        self.met: list[bool] = []
        self.node = FakeTransport("pve1")
        self.node.on(re.compile(r"^pct exec "), self.probe)
        self.node.on(ANY, self.node_facts)

    def node_facts(self, call: FakeCall) -> CommandResult:
        self.node_facts_started.set()
        self.met.append(self.probe_started.wait(timeout=5))
        return CommandResult(0, "fleetfix-node-facts 1\nhostname\tpve1\n", "", 0.0)

    def probe(self, call: FakeCall) -> CommandResult:
        self.probe_started.set()
        self.met.append(self.node_facts_started.wait(timeout=5))
        return CommandResult(0, HEALTHY, "", 0.0)


def test_one_container_is_probed_while_its_node_facts_are_gathered() -> None:
    """For one container the node facts used to come first: a round trip and the node script's run added
    to every single-target probe (issue 21). Now they run side by side, each on its own channel."""
    node = Rendezvous()
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    with Fleet(connect=lambda _settings: node.node) as fleet:
        [report] = probe_targets(fleet, [Target("pve1/200", ref, GuestRef.lxc(200))])
    assert node.met == [True, True], "the node facts and the container's probe ran one after the other"
    assert report.status == "ok" and report.node is not None and report.node.hostname == "pve1"


def test_node_facts_that_fail_on_their_own_thread_fail_the_container_with_that_error() -> None:
    """The node facts run on a thread of their own; a link lost there is not swallowed with it: the
    container waiting for them tries again and reports what happened."""
    node = FakeTransport("pve1").on(re.compile(r"^pct exec "), stdout=HEALTHY)
    node.on(ANY, ConnectionLostError("link dropped during node facts"))
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    with Fleet(connect=lambda _settings: node) as fleet:
        [report] = probe_targets(fleet, [Target("pve1/200", ref, GuestRef.lxc(200))])
    assert report.status != "ok"
    assert "link dropped during node facts" in str(report.error)
    node_facts_runs = [call for call in node.calls if call.argv[:2] != ("pct", "exec")]
    assert 1 <= len(node_facts_runs) <= 2  # the background try, then at most the container's own


def test_a_nodes_later_containers_start_no_node_facts_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread per node for its facts, not one per container: at 10,000 targets a thread per container
    that found the facts known would be ~10,000 thread starts for nothing."""
    started: list[str] = []

    class CountingThread(threading.Thread):
        def start(self) -> None:
            if self.name.startswith("node-script-"):
                started.append(self.name)
            super().start()

    monkeypatch.setattr(threading, "Thread", CountingThread)
    node = FakeTransport("pve1").on(re.compile(r"^pct exec "), stdout=HEALTHY).on(
        ANY, stdout="fleetfix-node-facts 1\nhostname\tpve1\n")
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    targets = [Target(f"pve1/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in range(200, 212)]
    with Fleet(connect=lambda _settings: node, forks=1, channels_per_node=1) as fleet:
        reports = probe_targets(fleet, targets)
    assert [report.status for report in reports] == ["ok"] * len(targets)
    assert started == ["node-script-pve1"]
