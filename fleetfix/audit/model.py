"""The audit's data: what one run recorded, independent of where it came from (a live probe or SQLite)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetfix.probe import Finding, Severity
from fleetfix.probe.rules import CODES

# Codes the audit itself raises from its history (not the probe's diagnosis); docs/audit.md has them.
STALE_AUDIT = "STALE_AUDIT"
AUDIT_CODES: tuple[str, ...] = (STALE_AUDIT,)
ALL_CODES: tuple[str, ...] = (*CODES, *AUDIT_CODES)

# What of the targets' facts to load from the history (AuditStore.load, load_audit): none (False), all
# (True), or a projection of each target's facts to what a report shows (dashboard.matrix_facts): at
# 10,000 targets all of them are ~115 MB in Python, the HTML report's version matrix needs a few fields.
FactsNeed = bool | Callable[[dict[str, Any]], dict[str, Any]]

# The health of a target: the worst finding severity when it was probed, else why it was not.
HEALTH_ORDER = ("healthy", "info", "warning", "error", "failed", "unreachable")


def worst_health(status: str, findings: tuple[Finding, ...] | list[Finding]) -> str:
    """"healthy", the worst severity among findings, or the status when the target was not probed."""
    if status != "ok":
        return status
    for severity in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        if any(finding.severity == severity for finding in findings):
            return str(severity.value)
    return "healthy"


@dataclass(frozen=True)
class TargetResult:
    """One target's result in one run, after the policy (severities overridden, ignored codes dropped)."""

    target: str
    node: str
    ctid: int | None
    status: str  # "ok" | "unreachable" | "failed" (as probing.TargetReport.status)
    error: str | None = None
    findings: tuple[Finding, ...] = ()
    facts: dict[str, Any] | None = None
    duration: float = 0.0
    ignored: tuple[str, ...] = ()  # codes the policy dropped, kept so reports can say so
    # The Proxmox node's own facts (NodeFacts: the host's driver kernel module), for the dashboard's
    # version matrix; not part of the JSON report, whose shape is a contract.
    node_facts: dict[str, Any] | None = None

    @property
    def health(self) -> str:
        return worst_health(self.status, self.findings)

    @property
    def reachable(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "node": self.node,
            "ctid": self.ctid,
            "status": self.status,
            "health": self.health,
            "error": self.error,
            "duration": round(self.duration, 3),
            "findings": [finding.model_dump(mode="json") for finding in self.findings],
            "ignored": list(self.ignored),
            "facts": self.facts,
        }


@dataclass(frozen=True)
class RunInfo:
    id: int
    started: float  # epoch seconds
    finished: float | None
    status: str  # "complete" | "incomplete"
    args: dict[str, Any] = field(default_factory=dict)
    duration: float | None = None
    target_count: int = 0
    error_count: int = 0  # targets whose health is "error"
    unreachable_count: int = 0  # targets not probed (unreachable or failed)
    parent: int | None = None  # for a remediation's re-probe run: the audit run it remediated
    remediation: dict[str, Any] | None = None  # Remediation.to_json() of the remediation this run shows
    pruned: float | None = None  # when its results were pruned (AuditStore.prune); only this row is left
    site: str = "default"  # the scope its controller audits: drift and the trend compare within a site
    controller: str | None = None  # who ran it (its host name, or --controller); None: before v6

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "started": self.started, "finished": self.finished, "status": self.status,
            "args": self.args, "duration": self.duration, "targets": self.target_count,
            "errors": self.error_count, "unreachable": self.unreachable_count, "parent": self.parent,
        }


@dataclass(frozen=True)
class StoredRun:
    info: RunInfo
    targets: tuple[TargetResult, ...]
    # For a drift baseline put together per target (load_audit): the run a result came from, where that
    # is not `info`'s run. Its args say which policy judged that result.
    origins: dict[str, RunInfo] = field(default_factory=dict)

    def origin(self, target: str) -> RunInfo:
        """The run the target's result was recorded in."""
        return self.origins.get(target, self.info)

    def target(self, name: str) -> TargetResult | None:
        return next((result for result in self.targets if result.target == name), None)


@dataclass(frozen=True)
class TrendPoint:
    """One run in the trend: when, and how many targets it found per health."""

    run: int
    started: float
    status: str
    parent: int | None
    counts: dict[str, int]
    finished: float | None = None  # None: not finished (an incomplete run)

    def count(self, *healths: str) -> int:
        return sum(self.counts.get(health, 0) for health in healths)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class History:
    """What the dashboard shows from the history beyond the run itself (AuditStore.trend and .since)."""

    trend: tuple[TrendPoint, ...] = ()  # the last N runs, oldest first, this run last
    since: dict[tuple[str, str], float] = field(default_factory=dict)  # (target, code) -> epoch
