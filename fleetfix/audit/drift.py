"""Drift: what changed between two runs (normally a run and the previous complete one).

A finding is "the same" in both runs when its target, code and identity agree. The identity is the
evidence that names *which* thing is wrong (interpreter, extension, apt URI, ...), never the summary:
a summary carries numbers (free MiB, pending updates) that move every night without anything being
newly wrong. Findings are compared only for targets probed in both runs; a target that could not be
probed in one of them shows up as became-unreachable / recovered instead, not as resolved findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetfix.audit.model import StoredRun, TargetResult
from fleetfix.probe import Finding

# Evidence keys that tell two findings of one code apart on one target.
IDENTITY_KEYS = ("interpreter", "extension", "uri", "suite", "path")

FindingKey = tuple[str, str, tuple[tuple[str, str], ...]]


def finding_key(target: str, finding: Finding) -> FindingKey:
    identity = tuple(
        (key, str(finding.evidence[key])) for key in IDENTITY_KEYS if finding.evidence.get(key) is not None
    )
    return (target, finding.code, identity)


@dataclass(frozen=True)
class FindingChange:
    target: str
    finding: Finding
    previous_severity: str | None = None  # set for a severity change

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"target": self.target, **self.finding.model_dump(mode="json")}
        if self.previous_severity is not None:
            data["previous_severity"] = self.previous_severity
        return data


@dataclass(frozen=True)
class Drift:
    report_kind: ClassVar[str] = "audit-diff"
    baseline: int | None  # the run compared against; None: nothing to compare with (first run)
    current: int
    new_findings: list[FindingChange] = field(default_factory=list)
    resolved_findings: list[FindingChange] = field(default_factory=list)
    severity_changed: list[FindingChange] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    became_unreachable: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.new_findings or self.resolved_findings or self.severity_changed or self.appeared
                    or self.vanished or self.became_unreachable or self.recovered)

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "current": self.current,
            "new_findings": [c.to_json() for c in self.new_findings],
            "resolved_findings": [c.to_json() for c in self.resolved_findings],
            "severity_changed": [c.to_json() for c in self.severity_changed],
            "appeared": self.appeared,
            "vanished": self.vanished,
            "became_unreachable": self.became_unreachable,
            "recovered": self.recovered,
        }


def _keyed(result: TargetResult) -> dict[FindingKey, Finding]:
    keyed: dict[FindingKey, Finding] = {}
    for finding in result.findings:
        keyed.setdefault(finding_key(result.target, finding), finding)
    return keyed


def compute_drift(previous: StoredRun | None, current: StoredRun) -> Drift:
    if previous is None:
        return Drift(baseline=None, current=current.info.id)
    before = {result.target: result for result in previous.targets}
    after = {result.target: result for result in current.targets}
    drift = Drift(
        baseline=previous.info.id, current=current.info.id,
        appeared=sorted(set(after) - set(before)),
        vanished=sorted(set(before) - set(after)),
    )
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old.reachable and not new.reachable:
            drift.became_unreachable.append(name)
        elif new.reachable and not old.reachable:
            drift.recovered.append(name)
        elif old.reachable and new.reachable:
            old_findings, new_findings = _keyed(old), _keyed(new)
            for key, finding in new_findings.items():
                if key not in old_findings:
                    drift.new_findings.append(FindingChange(name, finding))
                elif old_findings[key].severity != finding.severity:
                    drift.severity_changed.append(
                        FindingChange(name, finding, previous_severity=old_findings[key].severity.value)
                    )
            drift.resolved_findings.extend(
                FindingChange(name, finding)
                for key, finding in old_findings.items() if key not in new_findings
            )
    return drift
