"""The nightly audit: probe the fleet, judge it by a policy, record it, compare it with the last run.

    policy = load_policy("policy.yaml")            # or DEFAULT_POLICY
    with AuditStore(default_db_path()) as store, Fleet() as fleet:
        run = run_audit(fleet, targets, policy=policy, store=store)
    run.drift.new_findings, run.exit_code           # reports: fleetfix.audit.report

Exit codes (for cron and systemd): 0 every target probed and no error-severity finding; 3 at least
one error-severity finding; 4 at least one target unreachable or not probed (wins over 3, as for
`probe`: a fleet that could not be looked at is not known to be healthy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetfix.audit.drift import Drift, compute_drift
from fleetfix.audit.model import RunInfo, StoredRun, TargetResult
from fleetfix.audit.policy import DEFAULT_POLICY, Policy, evaluate, load_policy, with_required_extensions
from fleetfix.audit.store import AuditStore, default_db_path
from fleetfix.fleet import Fleet
from fleetfix.probing import TargetReport, probe_targets
from fleetfix.target import Target

EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNREACHABLE = 0, 3, 4

__all__ = [
    "DEFAULT_POLICY",
    "AuditRun",
    "AuditStore",
    "Drift",
    "Policy",
    "RunInfo",
    "StoredRun",
    "TargetResult",
    "default_db_path",
    "load_audit",
    "load_policy",
    "run_audit",
]


@dataclass(frozen=True)
class AuditRun:
    """A recorded run and its drift against the baseline."""

    run: StoredRun
    drift: Drift

    @property
    def info(self) -> RunInfo:
        return self.run.info

    @property
    def targets(self) -> tuple[TargetResult, ...]:
        return self.run.targets

    @property
    def exit_code(self) -> int:
        if any(not result.reachable for result in self.targets):
            return EXIT_UNREACHABLE
        if any(result.health == "error" for result in self.targets):
            return EXIT_FINDINGS
        return EXIT_HEALTHY


def load_audit(store: AuditStore, run_id: int, *, baseline: int | None = None) -> AuditRun:
    """A stored run with its drift against `baseline` (default: the previous complete run)."""
    run = store.load(run_id)
    base_id = store.previous_complete(run_id) if baseline is None else baseline
    previous = store.load(base_id) if base_id is not None else None
    return AuditRun(run, compute_drift(previous, run))


def run_audit(
    fleet: Fleet, targets: Sequence[Target], *, policy: Policy, store: AuditStore, deep: bool = False,
    on_progress: Callable[[TargetReport], None] | None = None, args: Mapping[str, Any] | None = None,
) -> AuditRun:
    """Probe targets, judge each result by the policy and commit it as it arrives; then mark the run
    complete. An exception (or a kill) before the end leaves the run incomplete, its finished targets kept."""
    run_id = store.start_run({**(args or {}), "policy": policy.source, "deep": deep})
    prepared = [with_required_extensions(policy, target) for target in targets]

    def on_done(report: TargetReport) -> None:  # from worker threads; the store serialises writes
        store.record_target(run_id, evaluate(policy, report))
        if on_progress:
            on_progress(report)

    probe_targets(fleet, prepared, deep=deep, on_done=on_done)
    store.finish_run(run_id, finished=time.time())
    return load_audit(store, run_id)
