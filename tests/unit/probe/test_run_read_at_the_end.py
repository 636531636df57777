"""probe_targets reads and diagnoses the outputs once every probe has ended, in one pass (issue 21); a target
whose output or diagnosis fails is that target's failure alone, as it was when read on the node's thread."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fleetfix.probe.facts as facts_module
import fleetfix.probe.rules as rules_module
from fleetfix.errors import ProbeOutputError, UnexpectedError
from fleetfix.fleet import Fleet
from fleetfix.probe.facts import Facts, NodeFacts
from fleetfix.probe.rules import Finding
from fleetfix.probe.run import probe_each, probe_targets
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.fake import ANY, FakeTransport

HEALTHY = (Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "healthy.json").read_text()
STOPPED = "container '203' not running!\n"


def fleet_of(node: FakeTransport, *, channels_per_node: int = 8) -> Fleet:
    return Fleet(connect=lambda _settings: node, channels_per_node=channels_per_node)


def targets(*ctids: int) -> list[Target]:
    ref = NodeRef("pve1", SSHSettings(address="127.0.0.1", port=2222))  # never dialled: the fake answers
    return [Target(f"pve1/{ctid}", ref, GuestRef.lxc(ctid)) for ctid in ctids]


def node_answering(**outputs: str) -> FakeTransport:
    """pct exec CTID answers outputs[f"ct{CTID}"] (HEALTHY if not given); 203 is stopped."""
    node = FakeTransport("pve1").on(re.compile(r"^pct exec 203 "), rc=255, stderr=STOPPED)
    for name, output in outputs.items():
        node.on(re.compile(rf"^pct exec {name.removeprefix('ct')} "), stdout=output)
    node.on(re.compile(r"^pct exec "), stdout=HEALTHY)
    return node.on(ANY, stdout="fleetfix-node-facts 1\nhostname\tpve1\n")


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happened, in order: "read" each time a probe output is parsed, and what the test adds."""
    happened: list[str] = []
    real_parse = facts_module.parse_facts

    def parse(stdout: str) -> Facts:
        happened.append("read")
        return real_parse(stdout)

    monkeypatch.setattr(facts_module, "parse_facts", parse)
    return happened


def test_outputs_are_read_after_every_target_has_ended(events: list[str]) -> None:
    with fleet_of(node_answering()) as fleet:
        reports = probe_targets(fleet, targets(200, 201, 202, 203),
                                on_probed=lambda target: events.append(target.name))
    assert sorted(events[:4]) == ["pve1/200", "pve1/201", "pve1/202", "pve1/203"]  # the stopped one too
    assert events[4:] == ["read"] * 3
    assert [report.status for report in reports] == ["ok", "ok", "ok", "unreachable"]
    assert all(report.facts is not None and report.node is not None for report in reports[:3])
    assert all(report.duration > 0 for report in reports)


def test_output_that_is_not_the_probes_fails_that_target_alone() -> None:
    with fleet_of(node_answering(ct201='{"fleetfix_probe": 1, "os": [')) as fleet:
        reports = probe_targets(fleet, targets(200, 201, 202))
    assert [report.status for report in reports] == ["ok", "failed", "ok"]
    assert isinstance(reports[1].error, ProbeOutputError)
    assert "truncated" in str(reports[1].error)
    assert reports[1].facts is None and reports[1].findings == []


def test_a_bug_in_a_rule_fails_that_target_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real_diagnose = rules_module.diagnose

    def diagnose(facts: Facts, node: NodeFacts | None = None, **kwargs: object) -> list[Finding]:
        if facts.hostname == "broken":
            raise KeyError("cuda")
        return real_diagnose(facts, node)

    monkeypatch.setattr(rules_module, "diagnose", diagnose)
    broken = HEALTHY.replace('"hostname": "ct102-healthy"', '"hostname": "broken"')
    assert broken != HEALTHY
    with fleet_of(node_answering(ct202=broken)) as fleet:
        reports = probe_targets(fleet, targets(200, 201, 202))
    assert [report.status for report in reports] == ["ok", "ok", "failed"]
    assert isinstance(reports[2].error, UnexpectedError)
    assert "KeyError" in str(reports[2].error)


def test_probe_each_hands_over_each_report_as_its_target_ends(events: list[str]) -> None:
    # The audit commits each report as it comes: none waits for the others to be read. One target at a time,
    # so that the order of the events is the order of the work.
    with fleet_of(node_answering(), channels_per_node=1) as fleet:
        probe_each(fleet, targets(200, 201, 202), on_done=lambda report: events.append(report.status))
    assert events == ["read", "ok"] * 3
