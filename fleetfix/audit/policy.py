"""The audit policy: which findings are errors, warnings or ignored, and which extensions must be there,
per group, tag or target name. YAML, validated by pydantic (unknown keys are errors).

    # policy.yaml
    severity:                      # fleet-wide overrides: finding code -> error | warning | info | ignore
      APT_OLD_NVIDIA_KEY: ignore
    required_extensions: []        # fleet-wide
    rules:                         # applied in order; a later rule's severity wins, extensions add up
      - match: {groups: [training], tags: [a100]}   # any listed group, tag or name glob matches
        severity: {EXTENSION_MISSING: error}
        required_extensions: [flash_attn, causal_conv1d, fla]
    max_age:
      unreachable_days: 3          # a target not probed successfully for 3 days gets STALE_AUDIT (error)
    notify:                        # who hears of new and resolved problems (fleetfix.audit.notify)
      webhook: {url: "@env:FLEETFIX_WEBHOOK_URL"}

Without a file, DEFAULT_POLICY applies: every finding keeps the severity its rule gives it (rules.py
chose those for exactly this: error = a training run breaks or an install fails, warning = slow or
fragile, info = nothing to do), and no extension is required beyond the inventory's own
`required_extensions` var.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetfix.audit.model import ALL_CODES, STALE_AUDIT, TargetResult
from fleetfix.audit.notify import NotifyConfig
from fleetfix.errors import ConfigError
from fleetfix.probe import Finding, Fix, Severity
from fleetfix.probe.run import TargetReport
from fleetfix.target import Target
from fleetfix.yamlsource import load_yaml, validate

Level = Literal["error", "warning", "info", "ignore"]
IGNORE = "ignore"


def _known_codes(value: dict[str, Level]) -> dict[str, Level]:
    unknown = sorted(set(value) - set(ALL_CODES))
    if unknown:
        raise ValueError(f"unknown finding code {unknown[0]!r} (see docs/findings.md)")
    return value


def _extension_names(value: list[str]) -> list[str]:
    for name in value:
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not an importable module name")
    return value


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    targets: list[str] = Field(default_factory=list)  # target names or globs

    def matches(self, groups: frozenset[str], tags: frozenset[str], name: str) -> bool:
        return (bool(groups.intersection(self.groups)) or bool(tags.intersection(self.tags))
                or any(fnmatchcase(name, pattern) for pattern in self.targets))


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: Match
    severity: dict[str, Level] = Field(default_factory=dict)
    required_extensions: list[str] = Field(default_factory=list)

    _codes = field_validator("severity")(_known_codes)
    _extensions = field_validator("required_extensions")(_extension_names)


class MaxAge(BaseModel):
    """How old the newest good observation of a target may get. One limit today: a target that keeps
    failing to be probed is a different problem from one unreachable tonight (a box that died, was
    renamed or lost its key), and deserves its own alert instead of a nightly exit code 4 people learn
    to ignore."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # STALE_AUDIT when a target's last successful probe (from the history) is more than this many days
    # old; a target never probed counts from its first appearance in the history.
    unreachable_days: float | None = Field(default=None, gt=0)


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: dict[str, Level] = Field(default_factory=dict)
    required_extensions: list[str] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)
    max_age: MaxAge = Field(default_factory=MaxAge)
    # Who hears of the changes (fleetfix.audit.notify). Excluded from the document a run records: where
    # the news goes is no part of how the targets are judged, and changing it is no policy change.
    notify: NotifyConfig | None = Field(default=None, exclude=True)
    source: str = Field(default="built-in default", exclude=True)

    _codes = field_validator("severity")(_known_codes)
    _extensions = field_validator("required_extensions")(_extension_names)

    def _applicable(self, groups: frozenset[str], tags: frozenset[str], name: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.match.matches(groups, tags, name)]

    def levels_for(self, groups: frozenset[str], tags: frozenset[str], name: str) -> dict[str, Level]:
        levels = dict(self.severity)
        for rule in self._applicable(groups, tags, name):
            levels.update(rule.severity)
        return levels

    def extensions_for(self, groups: frozenset[str], tags: frozenset[str], name: str) -> list[str]:
        names = list(self.required_extensions)
        for rule in self._applicable(groups, tags, name):
            names.extend(rule.required_extensions)
        return list(dict.fromkeys(names))


DEFAULT_POLICY = Policy()


def load_policy(path: str | Path | None) -> Policy:
    """The policy in path (one-line ConfigError naming file:line and field), or DEFAULT_POLICY."""
    if path is None:
        return DEFAULT_POLICY
    data, where = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("a policy is a mapping (severity, required_extensions, rules)", path=str(path))
    if "source" in data:
        raise where.error(("source",), "unknown field")
    policy = validate(Policy, data, where)
    return policy.model_copy(update={"source": str(path)})


def policy_document(policy: Policy) -> dict[str, Any]:
    """What the policy says, as JSON (its source left out): recorded with each run, so drift can tell a
    change of policy from a change on the targets."""
    document: dict[str, Any] = policy.model_dump(mode="json")
    return document


def policy_digest(policy: Policy) -> str:
    """sha256 of the policy's canonical JSON (sorted keys, no spaces): equal for two files that say the
    same thing, whatever their name, comments or key order."""
    canonical = json.dumps(policy_document(policy), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def policy_args(policy: Policy) -> dict[str, Any]:
    """The run args that record the policy a run was judged by (docs/audit.md, "Drift")."""
    return {"policy": policy.source, "policy_sha256": policy_digest(policy),
            "policy_document": policy_document(policy)}


def with_required_extensions(policy: Policy, target: Target) -> Target:
    """The target with the policy's required extensions added to its `required_extensions` var, which
    the probe's diagnosis reads (so EXTENSION_MISSING is raised where the policy wants the extension)."""
    wanted = policy.extensions_for(target.groups, target.tags, target.name)
    if not wanted:
        return target
    have = [str(name) for name in target.vars.get("required_extensions") or ()]
    merged = list(dict.fromkeys([*have, *wanted]))
    return dataclasses.replace(target, vars={**target.vars, "required_extensions": merged})


def apply_levels(findings: list[Finding] | tuple[Finding, ...], levels: dict[str, Level]
                 ) -> tuple[tuple[Finding, ...], tuple[str, ...]]:
    """Findings with the policy's severities, and the codes it ignored (dropped)."""
    kept: list[Finding] = []
    ignored: list[str] = []
    for finding in findings:
        level = levels.get(finding.code)
        if level == IGNORE:
            ignored.append(finding.code)
        elif level is not None and level != finding.severity.value:
            kept.append(finding.model_copy(update={"severity": Severity(level)}))
        else:
            kept.append(finding)
    return tuple(kept), tuple(dict.fromkeys(ignored))


def evaluate(policy: Policy, report: TargetReport) -> TargetResult:
    """A probe.run.TargetReport judged by the policy: the TargetResult that is recorded and reported."""
    target = report.target
    findings, ignored = apply_levels(
        report.findings, policy.levels_for(target.groups, target.tags, target.name)
    )
    return TargetResult(
        target=target.name, node=target.node.name, ctid=target.guest.to_json()["ctid"],
        status=report.status, error=None if report.error is None else str(report.error), findings=findings,
        facts=report.facts.model_dump(mode="json") if report.facts else None,
        duration=report.duration, ignored=ignored,
        node_facts=report.node.model_dump(mode="json") if report.node else None,
    )


DAY = 86400.0


def stale_finding(limit_days: float, last_probed: float | None, first_seen: float | None,
                  now: float) -> Finding | None:
    """STALE_AUDIT when the target has gone unprobed for more than limit_days (error by default; the
    policy's severity map can lower or ignore it like any code)."""
    since = last_probed if last_probed is not None else first_seen
    if since is None or now - since <= limit_days * DAY:
        return None
    days = (now - since) / DAY
    what = "last probed successfully" if last_probed is not None else "never probed successfully; first seen"
    return Finding(
        code=STALE_AUDIT, severity=Severity.ERROR,
        summary=f"not probed successfully for {days:.1f} days (policy max_age.unreachable_days: "
                f"{limit_days:g}); {what} {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}",
        evidence={"last_probed": last_probed, "first_seen": first_seen, "days": round(days, 2),
                  "limit_days": limit_days},
        fix=Fix(hint="Check the node and container are up and SSH works (`fleetfix exec ... -- true`); "
                     "if it was decommissioned, remove it from the inventory."),
    )


def with_staleness(policy: Policy, result: TargetResult, target: Target, *, last_probed: float | None,
                   first_seen: float | None, now: float) -> TargetResult:
    """An unprobed target's result with STALE_AUDIT added when the policy's max_age says it is overdue."""
    limit = policy.max_age.unreachable_days
    if limit is None or result.reachable:
        return result
    finding = stale_finding(limit, last_probed, first_seen, now)
    if finding is None:
        return result
    kept, ignored = apply_levels([finding], policy.levels_for(target.groups, target.tags, target.name))
    return dataclasses.replace(result, findings=(*result.findings, *kept),
                               ignored=tuple(dict.fromkeys((*result.ignored, *ignored))))
