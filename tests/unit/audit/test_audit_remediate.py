"""`audit --remediate`: only failing targets are remediated, the re-probe is a linked run, the exit code
is the state afterwards; check mode, nothing failing and a refused apply change and re-probe nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from audit_testkit import FakeWorld, make_target

from fleetfix.audit import (
    DEFAULT_POLICY,
    Auditor,
    AuditRun,
    AuditStore,
    Remedy,
    load_audit,
    remediate_audit,
    run_audit,
)
from fleetfix.audit.remediate import NOT_RUN, NOTHING_TO_DO
from fleetfix.audit.report import json_report, remediation_report, text_report
from fleetfix.errors import TemplateError
from fleetfix.playbook.snapshots import SnapshotOutcome
from fleetfix.target import Target

TOOLKIT = "CUDA_RUNTIME_WITHOUT_TOOLKIT"


@dataclass
class FakeTargetRun:
    target: str
    status: str
    reason: str = ""
    snapshot: SnapshotOutcome | None = None


@dataclass
class FakePlaybookRun:
    targets: list[FakeTargetRun]
    status: str
    run_id: str | None = "20261202T000000Z-fake"
    error: Exception | None = None


@dataclass
class FakeApply:
    """Stands in for run_playbook: records whom it was given and 'fixes' them in the fake world."""

    world: FakeWorld
    fixes: bool = True
    status: str = "changed"
    error: Exception | None = None
    skip: set[str] = field(default_factory=set)  # targets the run never reached (max-fail)
    snapshot: str | None = None  # the snapshot each target got (apply --snapshot)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, targets: Sequence[Target]) -> FakePlaybookRun:
        self.calls.append([t.name for t in targets])
        runs = []
        for target in targets:
            if target.name in self.skip:
                continue
            if self.fixes and self.error is None:
                assert target.guest.id is not None
                self.world.cts[target.guest.id] = "healthy"
            outcome = SnapshotOutcome(name=self.snapshot) if self.snapshot else None
            runs.append(FakeTargetRun(target.name, self.status, "because", outcome))
        return FakePlaybookRun(runs, "aborted" if self.error else self.status, error=self.error)


@pytest.fixture
def store(tmp_path: Path) -> AuditStore:
    return AuditStore(tmp_path / "audit.db")


def audit_then_remediate(store: AuditStore, world: FakeWorld, targets: list[Target], apply: FakeApply,
                         *, check: bool = False) -> tuple[AuditRun, AuditRun]:
    with world.fleet() as fleet:
        first = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        remedy = Remedy("playbooks/cuda-toolkit.yaml", apply, check,
                        {"cuda_repo_base": "http://127.0.0.1:1/repo", "api_token": "s3cret"})
        after = remediate_audit(first, targets, remedy, Auditor(fleet, DEFAULT_POLICY, store))
    return first, after


def test_only_failing_targets_are_remediated_and_reprobed_into_a_linked_run(store: AuditStore) -> None:
    world = FakeWorld({200: "healthy", 201: "problem_case", 202: "healthy"})
    targets = [make_target("pve1", ctid) for ctid in (200, 201, 202)]
    apply = FakeApply(world)
    first, after = audit_then_remediate(store, world, targets, apply)

    assert first.exit_code == 3 and after.exit_code == 0
    assert apply.calls == [["pve1/201"]]
    assert after.info.parent == first.info.id and after.info.id != first.info.id
    assert after.info.status == "complete"
    # The whole fleet after: the remediated target re-probed, the others carried over unchanged.
    assert [r.target for r in after.targets] == ["pve1/200", "pve1/201", "pve1/202"]
    assert after.run.target("pve1/200") == first.run.target("pve1/200")
    assert after.run.target("pve1/201").health == "healthy"  # type: ignore[union-attr]
    # Its drift is against the audit run: what the remediation changed.
    assert after.drift.baseline == first.info.id
    assert {c.finding.code for c in after.drift.resolved_findings} >= {TOOLKIT}
    assert all(c.target == "pve1/201" for c in after.drift.resolved_findings)

    remediation = after.remediation
    assert remediation is not None and remediation.reprobed and remediation.source_run == first.info.id
    assert [(t.target, t.apply_status) for t in remediation.targets] == [("pve1/201", "changed")]
    assert TOOLKIT in remediation.targets[0].codes_before
    assert remediation.vars["api_token"] != "s3cret"  # masked like apply's own records
    text = remediation_report(after)
    assert f"re-probed as run {after.info.id}" in text and "error -> healthy" in text
    assert json_report(after)["remediation"]["apply_run"] == "20261202T000000Z-fake"


def test_remediation_is_stored_and_the_next_audit_uses_the_reprobe_as_baseline(store: AuditStore) -> None:
    world = FakeWorld({200: "problem_case"})
    targets = [make_target("pve1", 200)]
    _, after = audit_then_remediate(store, world, targets, FakeApply(world))
    shown = load_audit(store, after.info.id)
    assert shown.remediation == after.remediation and "remediation of run" in text_report(shown)
    with world.fleet() as fleet:
        nightly = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
    assert nightly.drift.baseline == after.info.id and nightly.drift.empty


def test_the_snapshot_taken_before_remediating_is_in_the_report_and_the_history(store: AuditStore) -> None:
    """docs/audit.md: the remediation's report says which snapshot each target got (the way back)."""
    world = FakeWorld({200: "problem_case"})
    _, after = audit_then_remediate(store, world, [make_target("pve1", 200)],
                                    FakeApply(world, snapshot="fleetfix-20261202-114613"))
    assert after.remediation is not None
    assert after.remediation.targets[0].snapshot == "snapshot fleetfix-20261202-114613"
    [line] = [line for line in remediation_report(after).splitlines() if line.startswith("  pve1/200")]
    assert line.endswith("(was: CUDA_RUNTIME_WITHOUT_TOOLKIT, NVIDIA_REPO_NOT_CONFIGURED); "
                         "snapshot fleetfix-20261202-114613"), line
    shown = load_audit(store, after.info.id)  # `audit show` reads it back from the history
    assert "snapshot fleetfix-20261202-114613" in text_report(shown)
    assert json_report(shown)["remediation"]["targets"][0]["snapshot"] == "snapshot fleetfix-20261202-114613"


def test_check_mode_changes_nothing_and_records_the_plan_on_the_audit_run(store: AuditStore) -> None:
    world = FakeWorld({200: "problem_case"})
    apply = FakeApply(world, fixes=False, status="would-change")
    first, after = audit_then_remediate(store, world, [make_target("pve1", 200)], apply, check=True)
    assert apply.calls == [["pve1/200"]]
    assert after.info.id == first.info.id and len(store.runs()) == 1
    assert after.exit_code == 3
    assert after.remediation is not None and after.remediation.check and not after.remediation.reprobed
    assert "--check" in text_report(after) and "not re-probed" in text_report(after)


def test_nothing_failing_applies_nothing(store: AuditStore) -> None:
    world = FakeWorld({200: "healthy"})
    apply = FakeApply(world)
    _, after = audit_then_remediate(store, world, [make_target("pve1", 200)], apply)
    assert apply.calls == []
    assert after.remediation is not None and after.remediation.status == NOTHING_TO_DO
    assert after.exit_code == 0 and len(store.runs()) == 1


def test_unreachable_targets_are_not_remediated_and_keep_the_exit_code(store: AuditStore) -> None:
    world = FakeWorld({200: "problem_case", 201: "stopped"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    apply = FakeApply(world)
    _, after = audit_then_remediate(store, world, targets, apply)
    assert apply.calls == [["pve1/200"]]
    assert after.run.target("pve1/201").status == "unreachable"  # type: ignore[union-attr]
    assert after.exit_code == 4  # still not known healthy


def test_a_failed_apply_leaves_the_exit_code_at_findings(store: AuditStore) -> None:
    world = FakeWorld({200: "problem_case", 201: "problem_case"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    apply = FakeApply(world, fixes=False, status="failed", skip={"pve1/201"})
    _, after = audit_then_remediate(store, world, targets, apply)
    assert after.exit_code == 3 and after.remediation is not None and after.remediation.reprobed
    statuses = {t.target: t.apply_status for t in after.remediation.targets}
    assert statuses == {"pve1/200": "failed", "pve1/201": NOT_RUN}
    assert "error -> error" in remediation_report(after)


def test_a_refused_apply_is_reported_and_nothing_reprobed(store: AuditStore) -> None:
    world = FakeWorld({200: "problem_case"})
    apply = FakeApply(world, error=TemplateError("vars.cuda_repo_base: undefined"))
    first, after = audit_then_remediate(store, world, [make_target("pve1", 200)], apply)
    assert after.info.id == first.info.id and after.exit_code == 3
    assert after.remediation is not None and not after.remediation.reprobed
    assert "refused: vars.cuda_repo_base: undefined" in text_report(after)
