"""Drift: against the previous complete run, through real audits over a fake fleet and on hand-made runs."""

from __future__ import annotations

from pathlib import Path

from audit_testkit import FakeWorld, edited, finding, interrupt_dpkg, make_target

from fleetfix.audit import DEFAULT_POLICY, AuditStore, RunInfo, StoredRun, TargetResult, run_audit
from fleetfix.audit.drift import compute_drift
from fleetfix.audit.report import text_report


def stored(run_id: int, *results: TargetResult) -> StoredRun:
    return StoredRun(RunInfo(run_id, 0.0, 1.0, "complete"), results)


def ok(name: str, *findings: object) -> TargetResult:
    return TargetResult(name, "pve1", None, "ok", findings=tuple(findings))  # type: ignore[arg-type]


def test_break_then_fix_is_reported_new_then_resolved(tmp_path: Path) -> None:
    world = FakeWorld({200: "healthy", 201: "healthy"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        first = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        world.cts[201] = edited("healthy", interrupt_dpkg)  # someone's apt-get upgrade was killed
        second = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        world.cts[201] = "healthy"  # dpkg --configure -a
        third = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        history = store.runs()
    assert first.drift.baseline is None and first.exit_code == 0
    assert second.drift.baseline == first.info.id
    new = [(c.target, c.finding.code) for c in second.drift.new_findings]
    assert new == [("pve1/201", "DPKG_INTERRUPTED")]
    assert second.drift.resolved_findings == [] and second.exit_code == 3
    assert third.drift.baseline == second.info.id and third.drift.new_findings == []
    assert [(c.target, c.finding.code) for c in third.drift.resolved_findings] == [
        ("pve1/201", "DPKG_INTERRUPTED")]
    assert [run.id for run in history] == [third.info.id, second.info.id, first.info.id]
    assert all(run.status == "complete" for run in history)
    # Drift comes first in the terminal report.
    text = text_report(second)
    assert text.index("NEW") < text.index("pve1/200  ")


def test_reachability_and_membership_changes(tmp_path: Path) -> None:
    world = FakeWorld({200: "healthy", 201: "healthy", 202: "stopped"})
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, [make_target("pve1", n) for n in (200, 201, 202)], policy=DEFAULT_POLICY,
                  store=store)
        world.cts.update({201: "stopped", 202: "healthy", 203: "healthy"})
        second = run_audit(fleet, [make_target("pve1", n) for n in (201, 202, 203)], policy=DEFAULT_POLICY,
                           store=store)
    drift = second.drift
    assert drift.became_unreachable == ["pve1/201"]
    assert drift.recovered == ["pve1/202"]
    assert drift.appeared == ["pve1/203"] and drift.vanished == ["pve1/200"]
    assert drift.new_findings == [] and drift.resolved_findings == []  # not probed: nothing "resolved"
    assert second.exit_code == 4


def test_an_incomplete_run_is_never_the_baseline(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "a.db") as store:
        complete = store.start_run()
        store.record_target(complete, ok("a"))
        store.finish_run(complete)
        killed = store.start_run()
        store.record_target(killed, ok("a", finding("DPKG_INTERRUPTED")))
        world = FakeWorld({200: "healthy"})
        with world.fleet() as fleet:
            run = run_audit(fleet, [make_target("pve1", 200)], policy=DEFAULT_POLICY, store=store)
    assert killed != run.drift.baseline == complete


def test_findings_match_on_identity_not_on_their_changing_numbers() -> None:
    old = stored(1, ok("a", finding("DISK_LOW", "warning", path="/"),
                       finding("EXTENSION_MISSING", "warning", interpreter="py", extension="fla")))
    disk_still_low = finding("DISK_LOW", "error", path="/")  # fewer MiB now: severity changed, not new
    new = stored(2, ok("a", disk_still_low,
                       finding("EXTENSION_MISSING", "warning", interpreter="py", extension="flash_attn")))
    drift = compute_drift(old, new)
    changed = [(c.finding.code, c.previous_severity) for c in drift.severity_changed]
    assert changed == [("DISK_LOW", "warning")]
    assert [c.finding.evidence["extension"] for c in drift.new_findings] == ["flash_attn"]
    assert [c.finding.evidence["extension"] for c in drift.resolved_findings] == ["fla"]
    assert compute_drift(new, new).empty


def test_a_narrower_audit_is_not_the_baseline_of_the_targets_it_left_out(tmp_path: Path) -> None:
    """Issue 18: an audit with --limit became the drift baseline for the whole fleet, so a regression on a
    target outside it disappeared from the next report. Each target is compared with its own last result,
    and the scope of each run (inventory, host, limit) is recorded and decides what vanished."""
    world = FakeWorld({200: "healthy", 201: "healthy"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    full, narrow = {"inventory": "inv.yaml", "limit": None}, {"inventory": "inv.yaml", "limit": "pve1/200"}
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, args=full)
        world.cts[201] = edited("healthy", interrupt_dpkg)
        limited = run_audit(fleet, targets[:1], policy=DEFAULT_POLICY, store=store, args=narrow)
        after = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, args=full)
        assert store.load(limited.info.id).info.args["limit"] == "pve1/200"  # the scope is recorded
    assert limited.drift.vanished == []  # it did not look at 201: nothing vanished
    new = [(c.target, c.finding.code) for c in after.drift.new_findings]
    assert new == [("pve1/201", "DPKG_INTERRUPTED")]
    assert after.drift.appeared == []
