"""`audit --remediate PLAYBOOK`: apply a playbook to the targets the audit found failing, then re-probe them.

How it is recorded (docs/audit.md, "Remediation"):
- the apply is an ordinary playbook run (the injected `apply` records it: `fleetfix runs list`);
- the re-probe is a second audit run whose `parent` is the audit run: the remediated targets freshly
  probed, every other target's result carried over unchanged from the audit run (they were not touched).
  So it is a whole-fleet picture of the state after the remediation: its drift against the parent is
  exactly what the remediation changed, the exit code is computed from it, and the next nightly audit
  uses it as its baseline like any complete run;
- what was done (playbook, apply run id, per-target apply status, the error codes before) is stored as
  the `remediation` of the run showing its outcome: the re-probe run, or the audit run itself when
  nothing was re-probed (`--check`, nothing failing, the apply refused by a template error).

Only targets with error-severity findings after the policy are remediated: an unreachable target cannot
be, and warnings are not worth an unattended change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetfix.audit.model import TargetResult
from fleetfix.secrets import mask_vars
from fleetfix.target import Target


class SnapshotLike(Protocol):
    """What is read of a playbook.snapshots.SnapshotOutcome."""

    def note(self) -> str: ...


class TargetRunLike(Protocol):
    """What is read of a playbook.TargetRun."""

    @property
    def target(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def snapshot(self) -> SnapshotLike | None: ...


class PlaybookRunLike(Protocol):
    """What is read of a playbook.PlaybookRun (a protocol keeps this module free of the runner)."""

    @property
    def run_id(self) -> str | None: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> Exception | None: ...
    @property
    def targets(self) -> Sequence[TargetRunLike]: ...


# apply(targets) -> the finished (and recorded) playbook run on exactly those targets.
ApplyPlaybook = Callable[[Sequence[Target]], PlaybookRunLike]

NOTHING_TO_DO = "nothing-to-remediate"
NOT_RUN = "not-run"  # the apply stopped (max-fail) before this target's batch


@dataclass(frozen=True)
class TargetRemediation:
    target: str
    apply_status: str  # the playbook run's target status: changed, ok, failed, would-change, ...
    reason: str = ""
    codes_before: tuple[str, ...] = ()  # its error-severity codes in the audit run
    snapshot: str = ""  # with --snapshot: "snapshot NAME", "rolled back to NAME", why there is none

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "apply_status": self.apply_status, "reason": self.reason,
                "codes_before": list(self.codes_before), "snapshot": self.snapshot}


@dataclass(frozen=True)
class Remediation:
    playbook: str
    check: bool
    source_run: int  # the audit run whose failing targets were remediated
    status: str  # the playbook run's status, or NOTHING_TO_DO
    reprobed: bool  # True: the run holding this is the re-probe (its parent is source_run)
    apply_run: str | None = None  # the playbook run's record id (`fleetfix runs show ID`)
    error: str | None = None  # why the playbook run was refused (a template error)
    vars: dict[str, Any] = field(default_factory=dict)
    targets: tuple[TargetRemediation, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"playbook": self.playbook, "check": self.check, "source_run": self.source_run,
                "status": self.status, "reprobed": self.reprobed, "apply_run": self.apply_run,
                "error": self.error, "vars": self.vars, "targets": [t.to_json() for t in self.targets]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Remediation:
        return cls(
            playbook=str(data["playbook"]), check=bool(data["check"]), source_run=int(data["source_run"]),
            status=str(data["status"]), reprobed=bool(data["reprobed"]), apply_run=data.get("apply_run"),
            error=data.get("error"), vars=dict(data.get("vars") or {}),
            targets=tuple(TargetRemediation(target=str(t["target"]), apply_status=str(t["apply_status"]),
                                            reason=str(t.get("reason", "")),
                                            codes_before=tuple(t.get("codes_before", ())),
                                            snapshot=str(t.get("snapshot") or ""))
                          for t in data.get("targets", ())),
        )


def needs_remediation(result: TargetResult) -> bool:
    """Probed, with at least one error-severity finding after the policy."""
    return result.reachable and result.health == "error"


def failing_targets(results: Sequence[TargetResult], targets: Sequence[Target]) -> list[Target]:
    """The targets (inventory objects, in inventory order) whose audit result needs remediation."""
    failing = {result.target for result in results if needs_remediation(result)}
    return [target for target in targets if target.name in failing]


@dataclass(frozen=True)
class Remedy:
    """What a remediation applies: the playbook (its path, for the record), `apply` that rolls it out on
    the targets given and records it, check mode, and the vars (only recorded: masked by the caller)."""

    playbook: str
    apply: ApplyPlaybook
    check: bool = False
    vars: Mapping[str, Any] = field(default_factory=dict)


def apply_to_failing(results: Sequence[TargetResult], targets: Sequence[Target], remedy: Remedy,
                     source_run: int) -> tuple[Remediation, list[Target]]:
    """Run the playbook on the failing targets; returns what was done and the targets to re-probe
    (none in check mode, when nothing failed, or when the playbook run was refused before running)."""
    playbook, apply, check, vars = remedy.playbook, remedy.apply, remedy.check, dict(remedy.vars)
    selected = failing_targets(results, targets)
    if not selected:
        return Remediation(playbook, check, source_run, NOTHING_TO_DO, reprobed=False,
                           vars=mask_vars(vars)), []
    errors_before = {
        result.target: tuple(dict.fromkeys(f.code for f in result.findings if f.severity.value == "error"))
        for result in results
    }
    applied = apply(selected)
    by_name = {run.target: run for run in applied.targets}
    per_target = tuple(
        _target_remediation(target.name, by_name.get(target.name), errors_before.get(target.name, ()))
        for target in selected
    )
    # A refused run (template error) changed nothing anywhere: planning happens before any step runs.
    reprobe = not check and applied.error is None
    remediation = Remediation(
        playbook, check, source_run, applied.status, reprobed=reprobe, apply_run=applied.run_id,
        error=None if applied.error is None else str(applied.error), vars=mask_vars(vars),
        targets=per_target,
    )
    return remediation, selected if reprobe else []


def _target_remediation(name: str, run: TargetRunLike | None, codes_before: tuple[str, ...]
                        ) -> TargetRemediation:
    if run is None:
        return TargetRemediation(name, NOT_RUN, codes_before=codes_before)
    snapshot = run.snapshot.note() if run.snapshot is not None else ""
    return TargetRemediation(name, run.status, run.reason, codes_before, snapshot)
