"""Drift: against the previous complete run, through real audits over a fake fleet and on hand-made runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from audit_testkit import FakeWorld, edited, finding, interrupt_dpkg, make_target

from fleetfix.audit import DEFAULT_POLICY, AuditRun, AuditStore, RunInfo, StoredRun, TargetResult, run_audit
from fleetfix.audit.dashboard import drift_view
from fleetfix.audit.drift import compute_drift
from fleetfix.audit.policy import Match, Policy, Rule, load_policy, policy_args, policy_digest
from fleetfix.audit.report import drift_lines, html_report, text_report


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


# ---------------------------------------------------------------- a policy change


def test_the_policy_digest_is_what_the_policy_says_not_how_it_is_written(tmp_path: Path) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("severity: {DISK_LOW: ignore, APT_OLD_NVIDIA_KEY: info}\nrequired_extensions: [fla]\n")
    two.write_text("# same, reordered\nrequired_extensions: [fla]\nseverity:\n  APT_OLD_NVIDIA_KEY: info\n"
                   "  DISK_LOW: ignore\n")
    assert policy_digest(load_policy(one)) == policy_digest(load_policy(two))
    assert policy_digest(load_policy(one)) != policy_digest(DEFAULT_POLICY)
    args = policy_args(load_policy(one))
    assert args["policy"] == str(one) and len(args["policy_sha256"]) == 64
    assert args["policy_document"]["severity"] == {"DISK_LOW": "ignore", "APT_OLD_NVIDIA_KEY": "info"}
    # The document is the policy, less its source.
    assert policy_digest(Policy.model_validate(args["policy_document"])) == args["policy_sha256"]


def test_a_policy_change_is_the_policys_and_not_the_targets(tmp_path: Path) -> None:
    """Nothing changes on the targets; only the policy does. Every finding change is the policy's: a code
    it stopped ignoring, an extension it no longer requires, a severity it no longer overrides."""
    world = FakeWorld({200: "problem_case", 201: "problem_case"})
    targets = [make_target("pve1", 200, tags=["training"]), make_target("pve1", 201)]
    strict = Policy(severity={"NVIDIA_REPO_NOT_CONFIGURED": "ignore"}, required_extensions=["flash_attn"],
                    rules=[Rule(match=Match(tags=["training"]), severity={"EXTENSION_MISSING": "error"})],
                    source="strict.yaml")
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        first = run_audit(fleet, targets, policy=strict, store=store)
        second = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        diffed = compute_drift(store.load(first.info.id, facts=False),
                               store.load(second.info.id, facts=False), facts_of=store.facts_of)
    for drift in (second.drift, diffed):
        assert drift.empty and drift.new_findings == drift.resolved_findings == drift.severity_changed == []
        change = drift.policy_change
        assert change is not None and change.known
        assert [ref.source for ref in change.before] == ["strict.yaml"]
        assert change.after.source == "built-in default"
        assert change.after.sha256 == policy_digest(DEFAULT_POLICY)
        assert sorted((c.target, c.finding.code) for c in change.new_findings) == [
            ("pve1/200", "NVIDIA_REPO_NOT_CONFIGURED"), ("pve1/201", "NVIDIA_REPO_NOT_CONFIGURED")]
        assert sorted((c.target, c.finding.evidence["extension"]) for c in change.resolved_findings) == [
            ("pve1/200", "flash_attn"), ("pve1/201", "flash_attn")]
        assert [(c.target, c.finding.code, c.previous_severity) for c in change.severity_changed] == [
            ("pve1/200", "EXTENSION_MISSING", "error")]
    lines = drift_lines(second.drift)
    assert lines[0] == f"drift since run {first.info.id}: none on the targets"
    assert lines[1].startswith(f"policy changed since run {first.info.id}: strict.yaml (sha256 "
                               f"{policy_digest(strict)[:12]}…) -> built-in default (sha256 ")
    assert lines[1].endswith("; 5 finding change(s) by the policy alone, not the targets:")
    assert "  ~ SEVERITY  pve1/200: EXTENSION_MISSING error -> warning" in lines
    json = second.drift.to_json()
    assert json["new_findings"] == [] and len(json["policy_change"]["new_findings"]) == 2
    assert json["policy_change"]["from"] == [{"source": "strict.yaml", "sha256": policy_digest(strict)}]


def test_what_changed_on_a_target_stays_the_targets_when_the_policy_changed_too(tmp_path: Path) -> None:
    """Under a new policy, a target that really broke, and an extension that was really installed, are
    still the targets' changes."""
    world = FakeWorld({200: "problem_case", 201: "problem_case"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    wants_flash = Policy(required_extensions=["flash_attn"], source="a.yaml")

    def install_flash_attn(data: dict[str, Any]) -> None:
        data["pythons"][0]["extensions"]["flash_attn"]["present"] = True

    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=wants_flash, store=store)
        world.cts[200] = edited("problem_case", interrupt_dpkg)
        world.cts[201] = edited("problem_case", install_flash_attn)  # and the policy dropped it too
        second = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
    drift = second.drift
    assert [(c.target, c.finding.code) for c in drift.new_findings] == [("pve1/200", "DPKG_INTERRUPTED")]
    # 200's flash_attn went with the policy alone; 201's was installed as well: not explained by it.
    assert [c.target for c in drift.resolved_findings] == ["pve1/201"]
    assert drift.policy_change is not None
    assert [c.target for c in drift.policy_change.resolved_findings] == ["pve1/200"]


def _with_policy(run: StoredRun, args: dict[str, Any]) -> StoredRun:
    return StoredRun(RunInfo(run.info.id, 0.0, 1.0, "complete", args=args), run.targets)


def test_a_severity_change_is_the_policys_only_if_the_finding_is_otherwise_the_same() -> None:
    lowered = policy_args(Policy(severity={"DISK_LOW": "warning"}, source="p.yaml"))
    default = policy_args(DEFAULT_POLICY)
    old = stored(1, ok("a", finding("DISK_LOW", "warning", path="/", free_mb=900)),
                 ok("b", finding("DISK_LOW", "warning", path="/", free_mb=900)))
    new = stored(2, ok("a", finding("DISK_LOW", "error", path="/", free_mb=900)),
                 ok("b", finding("DISK_LOW", "error", path="/", free_mb=100)))  # also less space now
    drift = compute_drift(_with_policy(old, lowered), _with_policy(new, default))
    assert [c.target for c in drift.severity_changed] == ["b"]
    assert drift.policy_change is not None
    assert [c.target for c in drift.policy_change.severity_changed] == ["a"]


def test_a_run_recorded_without_its_policy_is_unknown_and_nothing_is_attributed() -> None:
    """Runs of an older fleetfix recorded the policy's source only: their policy is unknown."""
    old = stored(1, ok("a"))
    new = stored(2, ok("a", finding("GPU_NOT_VISIBLE", "info")))
    ignored_before = StoredRun(RunInfo(1, 0.0, 1.0, "complete", args={"policy": "policy.yaml"}),
                               (dataclasses.replace(old.targets[0], ignored=("GPU_NOT_VISIBLE",)),))
    drift = compute_drift(ignored_before, _with_policy(new, policy_args(DEFAULT_POLICY)))
    assert [c.finding.code for c in drift.new_findings] == ["GPU_NOT_VISIBLE"]  # stays the target's
    assert drift.policy_change is not None and not drift.policy_change.known
    assert drift.policy_change.before[0].label == "policy.yaml (digest not recorded)"
    assert drift_lines(drift)[-1] == (
        "policy since run 1 unknown: policy.yaml (digest not recorded) -> built-in default (sha256 "
        f"{policy_digest(DEFAULT_POLICY)[:12]}…); a run's policy was not recorded (an older fleetfix), so no "
        "change is attributed to it")
    view = drift_view(AuditRun(_with_policy(new, policy_args(DEFAULT_POLICY)), drift)).policy
    assert view is not None and not view.known and view.items == ()
    assert "policy unknown:</strong>" in html_report(AuditRun(_with_policy(new, policy_args(DEFAULT_POLICY)),
                                                              drift))
    # Two such runs: nothing known, nothing said; the report is as it always was.
    assert compute_drift(old, new).policy_change is None
    assert "policy" not in "\n".join(drift_lines(compute_drift(old, new)))


def test_the_same_policy_changes_nothing_in_drift(tmp_path: Path) -> None:
    world = FakeWorld({200: "problem_case"})
    policy = Policy(severity={"NVIDIA_REPO_NOT_CONFIGURED": "ignore"}, source="p.yaml")
    renamed = policy.model_copy(update={"source": "/etc/fleetfix/policy.yaml"})  # moved, not changed
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, [make_target("pve1", 200)], policy=policy, store=store)
        world.cts[200] = edited("problem_case", interrupt_dpkg)
        second = run_audit(fleet, [make_target("pve1", 200)], policy=renamed, store=store)
    assert second.drift.policy_change is None and second.drift.to_json()["policy_change"] is None
    assert [c.finding.code for c in second.drift.new_findings] == ["DPKG_INTERRUPTED"]


def test_each_target_is_judged_by_the_policy_of_its_own_baseline(tmp_path: Path) -> None:
    """A narrower audit (--limit) with a new policy in between: the target it left out keeps its baseline
    from the run before, judged by the old policy; its changes are that policy change's."""
    world = FakeWorld({200: "problem_case", 201: "problem_case"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    old = Policy(severity={"NVIDIA_REPO_NOT_CONFIGURED": "ignore"}, source="old.yaml")
    full, narrow = {"inventory": "inv.yaml", "limit": None}, {"inventory": "inv.yaml", "limit": "pve1/200"}
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=old, store=store, args=full)
        run_audit(fleet, targets[:1], policy=DEFAULT_POLICY, store=store, args=narrow)
        third = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, args=full)
    drift = third.drift
    assert drift.new_findings == []
    assert drift.policy_change is not None
    assert [ref.source for ref in drift.policy_change.before] == ["old.yaml"]
    assert [(c.target, c.finding.code) for c in drift.policy_change.new_findings] == [
        ("pve1/201", "NVIDIA_REPO_NOT_CONFIGURED")]
