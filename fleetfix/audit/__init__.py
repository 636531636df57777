"""The nightly audit: probe the fleet, judge it by a policy, record it, compare it with the last run.

    policy = load_policy("policy.yaml")            # or DEFAULT_POLICY
    with AuditStore(default_db_path()) as store, Fleet() as fleet:
        run = run_audit(fleet, targets, policy=policy, store=store)
    run.drift.new_findings, run.exit_code           # reports: fleetfix.audit.report
    after = remediate_audit(run, targets, Remedy("playbooks/cuda-toolkit.yaml", apply=...),
                            Auditor(fleet, policy, store))   # see fleetfix.audit.remediate

Exit codes (for cron and systemd): 0 every target probed and no error-severity finding; 3 at least
one error-severity finding; 4 at least one target unreachable or not probed (wins over 3, as for
`probe`: a fleet that could not be looked at is not known to be healthy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, Unpack

from fleetfix.audit.drift import Drift, compute_drift
from fleetfix.audit.model import FactsNeed, History, RunInfo, StoredRun, TargetResult
from fleetfix.audit.policy import (
    DEFAULT_POLICY,
    Policy,
    evaluate,
    load_policy,
    policy_args,
    with_required_extensions,
    with_staleness,
)
from fleetfix.audit.remediate import Remediation, Remedy, apply_to_failing
from fleetfix.audit.store import AuditStore, default_db_path
from fleetfix.errors import ExitCode
from fleetfix.fleet import Fleet
from fleetfix.probe.run import TargetReport, probe_each
from fleetfix.target import Target

# How many runs the HTML report's trend shows: a month of nightly runs.
TREND_RUNS = 30

__all__ = [
    "DEFAULT_POLICY",
    "AuditRun",
    "AuditStore",
    "Auditor",
    "Drift",
    "History",
    "Policy",
    "Remediation",
    "Remedy",
    "RunInfo",
    "StoredRun",
    "TargetResult",
    "default_db_path",
    "load_audit",
    "load_policy",
    "remediate_audit",
    "run_audit",
]


@dataclass(frozen=True)
class AuditRun:
    """A recorded run, its drift against the baseline, and the history the HTML dashboard shows."""

    run: StoredRun
    drift: Drift
    history: History = field(default_factory=History)
    # `audit show last` of a history of several sites: the newest run of every site, this one among them;
    # the HTML page shows them all, every other format this run only. () otherwise.
    sites: tuple[AuditRun, ...] = ()
    report_kind: ClassVar[str] = "audit"

    @property
    def info(self) -> RunInfo:
        return self.run.info

    @property
    def targets(self) -> tuple[TargetResult, ...]:
        return self.run.targets

    @property
    def remediation(self) -> Remediation | None:
        data = self.run.info.remediation
        return None if data is None else Remediation.from_json(data)

    @property
    def exit_code(self) -> ExitCode:
        if any(not result.reachable for result in self.targets):
            return ExitCode.UNREACHABLE
        if any(result.health == "error" for result in self.targets):
            return ExitCode.FINDINGS
        return ExitCode.OK


@dataclass
class RemediatedAudit:
    """An audit and the re-probe after its remediation (`audit --remediate`). Files and monitoring show
    the state afterwards (`final`); the terminal and JSON show both."""

    report_kind: ClassVar[str] = "audit"
    audit: AuditRun
    final: AuditRun

    @property
    def exit_code(self) -> ExitCode:
        return self.final.exit_code


@dataclass
class AuditHistory:
    """Recorded audit runs, newest first (`fleetfix audit history`)."""

    report_kind: ClassVar[str] = "audit-history"
    runs: list[RunInfo]

    def to_json(self) -> list[dict[str, Any]]:
        return [{**run.to_json(), "site": run.site, "controller": run.controller} for run in self.runs]


def load_audit(store: AuditStore, run_id: int, *, baseline: int | None = None,
               trend_runs: int = TREND_RUNS, facts: FactsNeed = True) -> AuditRun:
    """A stored run with its drift against `baseline` (default: the audit run it remediated, for a
    re-probe run; else each target's own last result in a complete run, `per_target_baseline`), and its
    history: the trend of the last `trend_runs` runs and since when each finding has been seen (indexed
    queries, cheap at any history size). facts=False: the results without their facts (what the text
    report needs; decoding facts is most of the cost of loading 10,000 targets); a projection: only what
    it keeps of each target's facts (the HTML report's, dashboard.matrix_facts)."""
    run = store.load(run_id, facts=facts)
    history = History(trend=tuple(store.trend(run_id, limit=trend_runs)), since=store.since(run_id))
    base_id = baseline if baseline is not None else run.info.parent
    facts_of = store.facts_of
    if base_id is not None:
        return AuditRun(run, compute_drift(store.load(base_id, facts=False), run, facts_of=facts_of), history)
    newest = store.previous_complete(run_id)
    previous = None if newest is None else per_target_baseline(store, run, newest)
    return AuditRun(run, compute_drift(previous, run, facts_of=facts_of), history)


def run_scope(args: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a run looked at, as recorded in its args: the inventory (or --host) and --limit."""
    return (args.get("inventory"), args.get("host"), args.get("limit"))


def per_target_baseline(store: AuditStore, run: StoredRun, newest: int) -> StoredRun:
    """The baseline of a run's drift: each of its targets' own last result in a complete run before it,
    so a narrower audit in between (`--limit`) is never the baseline of targets it left out (else their
    regressions would vanish from the next drift report). A target counts as vanished only when the
    newest complete run looked at the same scope and had it. Reported as a comparison with that newest
    run. Facts are not loaded: drift compares findings and reachability.

    Cost: the newest complete run is read once, and a target it does not hold is looked up on
    its own (an index walk backwards), never the whole history and never whole older runs."""
    newest_run = store.load(newest, facts=False)
    in_newest = {result.target: result for result in newest_run.targets}
    results = {result.target: in_newest[result.target]
               for result in run.targets if result.target in in_newest}
    elsewhere = store.latest_complete_runs(
        run.info.id, [result.target for result in run.targets if result.target not in in_newest])
    results.update((result.target, result) for result in store.results_at(elsewhere))
    if run_scope(newest_run.info.args) == run_scope(run.info.args):
        for result in newest_run.targets:
            results.setdefault(result.target, result)
    # Each older run's info once: its args hold the policy that judged the results taken from it.
    infos = {run_id: store.info(run_id) for run_id in set(elsewhere.values())}
    origins = {name: infos[run_id] for name, run_id in elsewhere.items()}
    return StoredRun(newest_run.info, tuple(results.values()), origins)


@dataclass(frozen=True)
class Auditor:
    """How the audit probes and records: the fleet, the policy that judges each result, the history it is
    committed to, deep probes or not, and who hears of each target as it is done (from worker threads)."""

    fleet: Fleet
    policy: Policy
    store: AuditStore
    deep: bool = False
    on_progress: Callable[[TargetReport], None] | None = None

    def probe_into(self, run_id: int, targets: Sequence[Target]) -> None:
        """Probe targets, judge each result by the policy and commit it to run_id as it arrives."""
        policy, store = self.policy, self.store
        prepared = [with_required_extensions(policy, target) for target in targets]

        def on_done(report: TargetReport) -> None:  # from worker threads; the store serialises writes
            result = evaluate(policy, report)
            if not result.reachable and policy.max_age.unreachable_days is not None:
                result = with_staleness(policy, result, report.target, now=time.time(),
                                        last_probed=store.last_probed(result.target),
                                        first_seen=store.first_seen(result.target))
            store.record_target(run_id, result)
            if self.on_progress:
                self.on_progress(report)

        # committed in on_done, nothing kept
        probe_each(self.fleet, prepared, deep=self.deep, on_done=on_done)

    def finish(self, run_id: int) -> None:
        if not self.fleet.interrupted:  # a Ctrl-C'd audit stays incomplete: never a drift baseline
            self.store.finish_run(run_id, finished=time.time())


class AuditOptions(TypedDict, total=False):
    """run_audit's options: Auditor's deep and on_progress; the run's args (what the command was asked,
    recorded); which facts the returned run holds (FactsNeed)."""

    deep: bool
    on_progress: Callable[[TargetReport], None] | None
    args: Mapping[str, Any] | None
    facts: FactsNeed


def run_audit(fleet: Fleet, targets: Sequence[Target], *, policy: Policy, store: AuditStore,
              **options: Unpack[AuditOptions]) -> AuditRun:
    """Probe targets, judge each result by the policy and commit it as it arrives; then mark the run
    complete. An exception (or a kill) before the end leaves the run incomplete, its finished targets kept.
    Returns the run as stored (load_audit; facts=False: without the targets' facts, for reports that do
    not show them; a projection: with what it keeps of them)."""
    auditor = Auditor(fleet, policy, store, options.get("deep", False), options.get("on_progress"))
    run_id = store.start_run({**(options.get("args") or {}), **policy_args(policy), "deep": auditor.deep})
    auditor.probe_into(run_id, targets)
    auditor.finish(run_id)
    return load_audit(store, run_id, facts=options.get("facts", True))


def remediate_audit(audit: AuditRun, targets: Sequence[Target], remedy: Remedy, auditor: Auditor) -> AuditRun:
    """Apply the playbook (through `remedy.apply`, which records it) to the audit's failing targets,
    re-probe them into a new run linked to the audit run, and return the run that shows the state
    afterwards: that re-probe run, or the audit run itself when nothing was re-probed (check mode, nothing
    failing, a refused playbook run). The remediation is stored on that run either way."""
    store = auditor.store
    source = audit.info.id
    remediation, reprobe = apply_to_failing(audit.targets, targets, remedy, source)
    if not reprobe:
        store.set_remediation(source, remediation.to_json())
        return load_audit(store, source)
    args = {**audit.info.args, "remediates": source, "targets": len(audit.targets)}
    run_id = store.start_run(args, parent=source, remediation=remediation.to_json())
    # Carried over first (no work), so a kill during the re-probe leaves them with the run incomplete.
    reprobed = {target.name for target in reprobe}
    for result in audit.targets:
        if result.target not in reprobed:
            store.record_target(run_id, result)
    auditor.probe_into(run_id, reprobe)
    auditor.finish(run_id)
    return load_audit(store, run_id)
