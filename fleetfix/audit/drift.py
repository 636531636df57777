"""Drift: what changed between two runs (normally a run and the previous complete one).

A finding is "the same" in both runs when its target, code and identity agree. The identity is the
evidence that names *which* thing is wrong (interpreter, extension, apt URI, ...), never the summary:
a summary carries numbers (free MiB, pending updates) that move every night without anything being
newly wrong. Findings are compared only for targets probed in both runs; a target that could not be
probed in one of them shows up as became-unreachable / recovered instead, not as resolved findings.

Each run records the policy that judged it (source, sha256 of its canonical JSON, and the document). When
a target's baseline was judged by another policy than the current run, a finding change the policy alone
explains is the policy's, listed apart in `policy_change` and not counted against the targets:
- new, and its code was ignored in the baseline result (the policy stopped ignoring it); resolved, and
  its code is ignored in the current result;
- a severity change on a code either policy overrides (fleet-wide or in a rule), the finding otherwise
  the same (summary and evidence);
- EXTENSION_MISSING new or resolved for an extension one policy requires and the other does not, while
  the target's facts show that interpreter's extensions present as before and its torch CUDA the same.
The documents are read without the targets' groups and tags (a result does not keep them): "overrides"
and "requires" mean anywhere in the document, and a change they cannot show is left to the targets.
A run recorded before runs carried their policy's digest is "unknown": said so, nothing attributed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetfix.audit.model import RunInfo, StoredRun, TargetResult
from fleetfix.probe import Finding

# Evidence keys that tell two findings of one code apart on one target.
IDENTITY_KEYS = ("interpreter", "extension", "uri", "suite", "path")

FindingKey = tuple[str, str, tuple[tuple[str, str], ...]]

# (run id, target) -> the target's facts recorded in that run, or None (AuditStore.facts_of).
FactsOf = Callable[[int, str], "dict[str, Any] | None"]

EXTENSION_MISSING = "EXTENSION_MISSING"


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
class PolicyRef:
    """The policy a run recorded in its args (audit.policy.policy_args)."""

    source: str | None
    sha256: str | None  # None: recorded by a fleetfix that did not record it (unknown)
    document: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, info: RunInfo) -> PolicyRef:
        args = info.args
        document = args.get("policy_document")
        sha256 = args.get("policy_sha256")
        return cls(None if args.get("policy") is None else str(args["policy"]),
                   sha256 if isinstance(sha256, str) else None,
                   document if isinstance(document, dict) else None)

    @property
    def known(self) -> bool:
        return self.sha256 is not None and self.document is not None

    @property
    def label(self) -> str:
        """`policy.yaml (sha256 0123456789ab…)`, or the source alone when the digest is unknown."""
        source = self.source or "-"
        return f"{source} (sha256 {self.sha256[:12]}…)" if self.sha256 else f"{source} (digest not recorded)"

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "sha256": self.sha256}

    def overridden_codes(self) -> set[str]:
        """Codes whose severity the document sets anywhere (fleet-wide or in a rule)."""
        document = self.document or {}
        codes = set(document.get("severity") or {})
        for rule in document.get("rules") or ():
            codes.update(rule.get("severity") or {})
        return codes

    def required_extensions(self) -> set[str]:
        """Extensions the document requires anywhere (fleet-wide or in a rule)."""
        document = self.document or {}
        names = set(document.get("required_extensions") or ())
        for rule in document.get("rules") or ():
            names.update(rule.get("required_extensions") or ())
        return names


@dataclass(frozen=True)
class PolicyChange:
    """The baseline was judged by another policy than the current run, and what that alone changed."""

    before: tuple[PolicyRef, ...]  # the baseline's policies that differ from `after` (usually one)
    after: PolicyRef
    new_findings: list[FindingChange] = field(default_factory=list)
    resolved_findings: list[FindingChange] = field(default_factory=list)
    severity_changed: list[FindingChange] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Both sides recorded their policy: only then is anything attributed to it."""
        return self.after.known and all(ref.known for ref in self.before)

    @property
    def changes(self) -> int:
        return len(self.new_findings) + len(self.resolved_findings) + len(self.severity_changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": [ref.to_json() for ref in self.before],
            "to": self.after.to_json(),
            "known": self.known,
            "new_findings": [c.to_json() for c in self.new_findings],
            "resolved_findings": [c.to_json() for c in self.resolved_findings],
            "severity_changed": [c.to_json() for c in self.severity_changed],
        }


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
    # Set when the baseline was judged by another policy; the finding changes above are then the
    # targets' own, those the policy alone explains are its own.
    policy_change: PolicyChange | None = None

    @property
    def empty(self) -> bool:
        """Nothing changed on the targets (a policy change is reported on its own)."""
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
            "policy_change": None if self.policy_change is None else self.policy_change.to_json(),
        }


def _keyed(result: TargetResult) -> dict[FindingKey, Finding]:
    keyed: dict[FindingKey, Finding] = {}
    for finding in result.findings:
        keyed.setdefault(finding_key(result.target, finding), finding)
    return keyed


def compute_drift(previous: StoredRun | None, current: StoredRun, *, facts_of: FactsOf | None = None
                  ) -> Drift:
    """What changed from previous to current. facts_of gives a target's facts in a run, for the few
    EXTENSION_MISSING changes a policy change may explain (default: the facts the runs were loaded with)."""
    if previous is None:
        return Drift(baseline=None, current=current.info.id)
    before = {result.target: result for result in previous.targets}
    after = {result.target: result for result in current.targets}
    attribution = _Attribution(previous, current, facts_of or _loaded_facts(previous, current))
    drift = Drift(
        baseline=previous.info.id, current=current.info.id,
        appeared=sorted(set(after) - set(before)),
        vanished=sorted(set(before) - set(after)),
        policy_change=attribution.change,
    )
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old.reachable and not new.reachable:
            drift.became_unreachable.append(name)
        elif new.reachable and not old.reachable:
            drift.recovered.append(name)
        elif old.reachable and new.reachable:
            _compare(drift, attribution, old, new)
    return drift


def _compare(drift: Drift, attribution: _Attribution, old: TargetResult, new: TargetResult) -> None:
    """One target's finding changes, each put with the targets' or with the policy's."""
    name = new.target
    old_findings, new_findings = _keyed(old), _keyed(new)
    policy = attribution.for_target(name)
    for key, finding in new_findings.items():
        if key not in old_findings:
            change = FindingChange(name, finding)
            if policy is not None and attribution.explains_new(old, new, finding):
                policy.new_findings.append(change)
            else:
                drift.new_findings.append(change)
        elif old_findings[key].severity != finding.severity:
            change = FindingChange(name, finding, previous_severity=old_findings[key].severity.value)
            if policy is not None and attribution.explains_severity(name, old_findings[key], finding):
                policy.severity_changed.append(change)
            else:
                drift.severity_changed.append(change)
    for key, finding in old_findings.items():
        if key not in new_findings:
            change = FindingChange(name, finding)
            if policy is not None and attribution.explains_resolved(old, new, finding):
                policy.resolved_findings.append(change)
            else:
                drift.resolved_findings.append(change)


def _loaded_facts(*runs: StoredRun) -> FactsOf:
    facts = {(run.info.id, result.target): result.facts for run in runs for result in run.targets}
    for run in runs:  # a result taken from an older run (a per-target baseline) is that run's
        for result in run.targets:
            facts[(run.origin(result.target).id, result.target)] = result.facts
    return lambda run_id, target: facts.get((run_id, target))


class _Attribution:
    """Which policy judged each side of a target's comparison, and whether it alone explains a change."""

    def __init__(self, previous: StoredRun, current: StoredRun, facts_of: FactsOf) -> None:
        self.previous, self.current, self.facts_of = previous, current, facts_of
        self.after = PolicyRef.of(current.info)
        self.before = {result.target: PolicyRef.of(previous.origin(result.target))
                       for result in previous.targets}
        differing = tuple(dict.fromkeys(ref for ref in self.before.values() if self._differs(ref)))
        self.change = PolicyChange(differing, self.after) if differing else None

    def _differs(self, ref: PolicyRef) -> bool:
        # Neither side recorded a digest (two runs of an older fleetfix): nothing is known, nothing said.
        if ref.sha256 is None and self.after.sha256 is None:
            return False
        return ref.sha256 != self.after.sha256

    def for_target(self, name: str) -> PolicyChange | None:
        """The change the target's own findings may be attributed to; None: its policy is the same, or
        one side's is unknown."""
        ref = self.before.get(name)
        if self.change is None or ref is None or not self._differs(ref):
            return None
        return self.change if ref.known and self.after.known else None

    def explains_new(self, old: TargetResult, new: TargetResult, finding: Finding) -> bool:
        if finding.code in old.ignored:
            return True
        return self._extension_requirement(old, new, finding, required_now=True)

    def explains_resolved(self, old: TargetResult, new: TargetResult, finding: Finding) -> bool:
        if finding.code in new.ignored:
            return True
        return self._extension_requirement(old, new, finding, required_now=False)

    def explains_severity(self, name: str, old: Finding, new: Finding) -> bool:
        overridden = self.before[name].overridden_codes() | self.after.overridden_codes()
        return (new.code in overridden and old.summary == new.summary and old.evidence == new.evidence)

    def _extension_requirement(self, old: TargetResult, new: TargetResult, finding: Finding, *,
                               required_now: bool) -> bool:
        """EXTENSION_MISSING that came or went with the policy's required extensions, the target's
        extensions as they were."""
        extension = finding.evidence.get("extension")
        interpreter = finding.evidence.get("interpreter")
        if finding.code != EXTENSION_MISSING or not isinstance(extension, str) or interpreter is None:
            return False
        required_before = extension in self.before[new.target].required_extensions()
        required_after = extension in self.after.required_extensions()
        if required_after == required_before or required_after != required_now:
            return False
        then = _extensions_seen(self.facts_of(self.previous.origin(old.target).id, old.target), interpreter)
        now = _extensions_seen(self.facts_of(self.current.info.id, new.target), interpreter)
        return then is not None and then == now


def _extensions_seen(facts: Mapping[str, Any] | None, interpreter: object) -> tuple[Any, ...] | None:
    """An interpreter's extensions (name, present) and its torch's CUDA, from recorded facts; None when
    the facts do not show them."""
    if not facts:
        return None
    for env in facts.get("pythons") or ():
        if isinstance(env, dict) and env.get("interpreter") == interpreter:
            extensions = env.get("extensions")
            if not isinstance(extensions, dict) or not extensions:
                return None
            torch = env.get("torch") if isinstance(env.get("torch"), dict) else {}
            presence = tuple(sorted((str(name), bool(isinstance(ext, dict) and ext.get("present")))
                                    for name, ext in extensions.items()))
            return presence, (torch or {}).get("cuda")
    return None
