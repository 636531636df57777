"""Running playbooks: per target (`run_target`) and across the fleet (`run_playbook`).

Per step: `when` false → skipped. `check` exits 0 → ok (its last stdout line is the reason). In check
mode stop there → would-change. Otherwise `apply` (retried per retries/delay/until), then `verify` must
exit 0 → changed. A step with only `check` is an assertion: a failing check fails the step. A step of a
type (steps/: copy, fetch, wheels, ...) is run by its type once its own check, if any, did not pass. A
failed step stops its target (unless ignore_errors); it never stops other targets. A transport failure
makes the target unreachable; nothing is raised out of a target.

Fleet level, in two phases so that a template error stops the run before anything runs anywhere:
1. plan: per target, gather facts (FleetAccess.facts_for), resolve vars, evaluate `when` and render every
   script that does not depend on `registered`;
2. run: per target, the planned steps — in `serial` batches, stopping early past `max_fail_pct`.
Concurrency, connections and per-target error capture belong to the fleet (FleetAccess.map). What all
targets of a run share travels down as one RunContext, not as parameters at every level.

Snapshots (fleetfix.playbook.snapshots): with a SnapshotPolicy and guest drivers (FleetAccess.guest_for),
each target gets a SnapshotGuard, asked right before a step's first change (after its check said "change
needed"); a failed target is rolled back after its last step.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, cast

from fleetfix.errors import (
    CommandTimeoutError,
    ExitCode,
    FleetfixError,
    TemplateError,
    TransferError,
    TransportError,
)
from fleetfix.guests.transfer import DEFAULT_MAX_BYTES
from fleetfix.playbook.checkbatch import (
    MAX_BATCH_OUTPUT,
    BatchedCheck,
    batch_script,
    batchable,
    new_nonce,
    parse_batch,
)
from fleetfix.playbook.clonebuild import CloneBuilds, CloneRun
from fleetfix.playbook.model import Playbook
from fleetfix.playbook.records import NullRecorder, Recorder
from fleetfix.playbook.render import CompiledPlaybook, CompiledStep, RenderedStep, compile_playbook, scoped
from fleetfix.playbook.snapshots import GuestFor, SnapshotGuard, SnapshotOutcome, SnapshotPolicy
from fleetfix.playbook.steps import StepEnd, StepType
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.secrets import Redactor, mask_vars, secret_values
from fleetfix.target import Target
from fleetfix.transport.base import CappedOutput, CommandResult, OutputSink, Stream, Transport, run_script
from fleetfix.wheels.source import Sources

if TYPE_CHECKING:
    from fleetfix.fleet import Outcome
    from fleetfix.guests.base import Guest

StepStatus = Literal["ok", "changed", "would-change", "failed", "skipped"]
TargetStatus = Literal["ok", "changed", "would-change", "failed", "skipped", "unreachable"]
# check/apply/verify: a step's own scripts; describe/build/install: a wheels step's per-item scripts.
Phase = Literal["check", "apply", "verify", "describe", "build", "install"]

R = TypeVar("R")
# on_output(target, step name, "stdout" | "stderr", chunk): a script's output as it arrives. Called from
# worker (and reader) threads, for many targets at once: the handler must be thread-safe.
StepOutputHandler = Callable[[Target, str, Stream, bytes], None]


# --- results ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScriptRun:
    phase: Phase
    attempt: int
    script: str
    rc: int | None
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False


@dataclass
class StepResult:
    name: str
    status: StepStatus
    reason: str
    rc: int | None = None  # of the script that decided the status
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    script: str | None = None  # the rendered script that decided the status
    playbook: str = ""
    ignored: bool = False  # failed, but ignore_errors let the target go on
    runs: list[ScriptRun] = field(default_factory=list)  # every script run, in order

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "playbook": self.playbook, "status": self.status, "reason": self.reason,
                "rc": self.rc, "stdout": self.stdout, "stderr": self.stderr,
                "duration": round(self.duration, 3), "ignored": self.ignored}


@dataclass
class TargetRun:
    target: str
    status: TargetStatus
    steps: list[StepResult]
    duration: float
    reason: str = ""
    snapshot: SnapshotOutcome | None = None  # set when a snapshot was taken, refused or rolled back
    error: FleetfixError | None = None  # why it was unreachable/failed outside a step (reason says it too)

    def counts(self) -> dict[str, int]:
        counted = Counter("ignored" if step.ignored else step.status for step in self.steps)
        return {status: counted.get(status, 0)
                for status in ("ok", "changed", "would-change", "failed", "skipped", "ignored")}

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "status": self.status, "reason": self.reason,
                "duration": round(self.duration, 3), "counts": self.counts(),
                "steps": [step.to_dict() for step in self.steps],
                "snapshot": self.snapshot.to_dict() if self.snapshot is not None else None}


@dataclass
class PlaybookRun:
    playbook: str
    check: bool
    targets: list[TargetRun]
    duration: float
    run_id: str | None = None
    aborted: str | None = None  # why the run stopped before every target ran
    error: FleetfixError | None = None  # the first template error, when that is why
    report_kind: ClassVar[str] = "apply"

    @property
    def status(self) -> str:
        if self.error is not None:
            return "aborted"
        statuses = {run.status for run in self.targets}
        for status in ("failed", "unreachable", "would-change", "changed", "ok"):
            if status in statuses:
                return status
        return "skipped"

    @property
    def exit_code(self) -> ExitCode:
        """OK when every target is fine; the template error's code (USAGE) when the run was refused;
        FAILED if any target failed; UNREACHABLE if targets were only unreachable."""
        if self.error is not None:
            return self.error.exit_code
        statuses = {run.status for run in self.targets}
        if "failed" in statuses:
            return ExitCode.FAILED
        if "unreachable" in statuses:
            return ExitCode.UNREACHABLE
        return ExitCode.OK

    def recap(self) -> list[tuple[str, str, dict[str, int]]]:
        """(target, status, step counts) per target, like Ansible's PLAY RECAP."""
        return [(run.target, run.status, run.counts()) for run in self.targets]

    def recap_lines(self) -> list[str]:
        width = max((len(run.target) for run in self.targets), default=0)
        lines = []
        for run in self.targets:
            numbers = "  ".join(f"{key}={value}" for key, value in run.counts().items())
            note = run.snapshot.note() if run.snapshot is not None else ""
            lines.append(f"{run.target:<{width}}  {run.status:<12} {numbers}" + (f"  {note}" if note else ""))
        return lines

    def to_json(self) -> dict[str, Any]:
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "playbook": self.playbook, "check": self.check,
                "status": self.status, "aborted": self.aborted, "duration": round(self.duration, 3),
                "error": str(self.error) if self.error else None,
                "targets": [run.to_dict() for run in self.targets]}


# on_step(target, result): each step's result as it ends; called from the same threads as on_output.
StepHandler = Callable[[Target, StepResult], None]


# --- plans -----------------------------------------------------------------------------------------

@dataclass
class PlannedStep:
    compiled: CompiledStep
    skip_reason: str | None = None  # `when` was false at plan time
    rendered: RenderedStep | None = None  # None and not skipped: renders at run time (uses registered)
    known: str | None = None  # its facts_check, rendered: in its desired state per the facts (see _run_plays)


@dataclass
class PlannedPlay:
    compiled: CompiledPlaybook
    vars: dict[str, Any]
    steps: list[PlannedStep]


@dataclass
class TargetPlan:
    target: Target
    facts: dict[str, Any]
    target_info: dict[str, Any]
    plays: list[PlannedPlay]
    # The check batch that ran with the facts (run_playbook's plan); its target runs no batch of its own.
    # checked_with_facts and early_checks None: that batch is not to be used (its event says why).
    checked_with_facts: bool = False
    early_checks: _CheckBatch | None = None


def target_info(target: Target) -> dict[str, Any]:
    # build_wheels: false under the inventory's `wheels: build: never` (steps that only prepare a build
    # can skip themselves).
    return {"name": target.name, "node": target.node.name, **target.guest.to_json(),
            "build_wheels": target.wheel_build}


def plan_target(
    chain: Sequence[CompiledPlaybook], target: Target, facts: Mapping[str, Any],
    cli_vars: Mapping[str, Any],
) -> TargetPlan:
    """Resolve vars, evaluate `when` and render every step that can be rendered now. Raises
    TemplateError, before anything has run on the target."""
    info = target_info(target)
    plays: list[PlannedPlay] = []
    for compiled in chain:
        play_vars = compiled.resolve_vars(facts=facts, target=info, target_vars=target.vars,
                                          cli_vars=cli_vars)
        scope = compiled.scope(facts=facts, vars=play_vars, target=info, registered={})
        steps: list[PlannedStep] = []
        for step in compiled.steps:
            if step.uses_registered:
                steps.append(PlannedStep(step))
            elif step.step.when is not None and not compiled.evaluate(step, "when", scope):
                steps.append(PlannedStep(step, skip_reason=f"when is false: {step.step.when}"))
            else:
                steps.append(PlannedStep(step, rendered=compiled.render(step, scope),
                                         known=compiled.known_from_facts(step, scope)))
        plays.append(PlannedPlay(compiled, play_vars, steps))
    return TargetPlan(target, dict(facts), info, plays)


# --- the run's context ----------------------------------------------------------------------------

GuardFor = Callable[[Target], SnapshotGuard | None]


@dataclass(frozen=True)
class RunContext:
    """What every target and step of one run shares. run_playbook builds it once and hands it down whole,
    so that a new setting is one field here rather than one more parameter at each level.

    check_mode is the dry run (`apply --check`): only `when` and `check` run. It is named so everywhere,
    apart from a step's `check` script, which is something else."""

    check_mode: bool = False
    recorder: Recorder = field(default_factory=NullRecorder)
    on_step: StepHandler | None = None
    on_output: StepOutputHandler | None = None
    # each target's guest driver: copy/fetch/wheels steps move files with it; None: such steps fail
    guest_for: GuestFor | None = None
    # each target's snapshot guard, made when the target starts (it keeps that target's state)
    guard_for: GuardFor | None = None
    wheels: WheelOptions = field(default_factory=WheelOptions)
    sleep: Callable[[float], None] = time.sleep  # between apply attempts; tests pass a recorder of delays
    # evaluate a target's checks ahead of their steps in one round trip (see _CheckBatch)
    batch_checks: bool = False
    # a step may be known from the facts (its facts_check, see _run_plays): not in a later --serial batch
    trust_facts: bool = True


# --- one target ------------------------------------------------------------------------------------

class _TargetLost(Exception):
    """The transport failed mid-step; carries the step's result so far."""

    def __init__(self, result: StepResult, error: TransportError) -> None:
        super().__init__(str(error))
        self.result, self.error = result, error


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# The line that says what went wrong, in the order they are looked for (the first kind found wins):
# a compiler's diagnostic (gcc/nvcc `file:line: error: ...`, the first: later ones tend to follow from it);
# the last exception of a Python traceback (what was raised, after the frames); dpkg's own error (it names
# the package; apt-get prints it on stdout, and on stderr only `E: Sub-process /usr/bin/dpkg returned an
# error code (1)`); apt's `E:` (apt-get, apt 2.6 and 3.0) or `Error:` (the `apt` command of apt 3.0), the
# first; pip's `ERROR:` or `error:`, the first. tests/fixtures/failures/ holds what the real tools printed.
_COMPILER_ERROR = re.compile(r"^\S.*?(?::\d+(?::\d+)?:|\(\d+\):)\s+(?:fatal\s+)?error\b|^\S+: fatal error\b")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")
_TOOL_ERRORS = (
    re.compile(r"^dpkg(?:-deb)?: error\b.*"),
    re.compile(r"^(?:E|Error): .*"),
    re.compile(r"^(?:ERROR|error): .*"),
)


def informative_line(*texts: str) -> str:
    """The line of a failed command's output that says what failed (stderr first, then stdout): see
    _COMPILER_ERROR, _EXCEPTION and _TOOL_ERRORS; else the last non-empty line. pip's PEP 668 refusal,
    for one, ends in `hint: See PEP 668 for the detailed specification.`, its error is the first line."""
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    found = _error_line(lines)
    if found is None:
        return next((last for text in texts if (last := _last_line(text))), "")
    # A script that caught the error and said it again with its own context (the playbooks' "gave up
    # after 5s (apt_lock_timeout): dpkg: error: ...") said more: its line wins.
    return next((line for line in reversed(lines) if found in line), found)


def _error_line(lines: list[str]) -> str | None:
    for line in lines:
        if _COMPILER_ERROR.match(line):
            return line
    if any(line.startswith("Traceback (most recent call last):") for line in lines):
        exceptions = [line for line in lines if _EXCEPTION.match(line)]
        if exceptions:
            return exceptions[-1]
    for pattern in _TOOL_ERRORS:
        for line in lines:
            if pattern.match(line):
                return line
    return None


def _why(run: ScriptRun) -> str:
    if run.timed_out:
        return "timed out"
    tail = informative_line(run.stderr, run.stdout)
    return f"exit {run.rc}" + (f": {tail}" if tail else "")


class _StepRunner:
    """Runs one planned step on one target. Kept small: one method per part of the protocol. To a typed
    step's type it is the StepCall (steps/base.py)."""

    def __init__(self, target: _TargetState, play: PlannedPlay, planned: PlannedStep,
                 registered: Mapping[str, Any]) -> None:
        self.plan, self.play, self.planned = target.plan, play, planned
        self.step = planned.compiled.step
        self.context, self.transport, self.guard = target.context, target.transport, target.guard
        self.recorder, self.registered, self.sleep = target.context.recorder, registered, target.context.sleep
        self.on_output = target.context.on_output
        self.wheels = target.context.wheels
        self.check_mode = target.context.check_mode
        self.would_change_before = False
        self.runs: list[ScriptRun] = []
        self.started = time.monotonic()
        self.extra: dict[str, Any] = {}  # what a typed step adds to its registered value
        self.prechecked: BatchedCheck | None = None  # its check's result from the target's check batch
        self.known: str | None = None  # in its desired state per the facts, which still hold (_run_plays)
        self.acted = False  # ran more than its check (apply, or its type's part): the target may have changed

    @property
    def target(self) -> Target:
        return self.plan.target

    @property
    def last_run(self) -> ScriptRun | None:
        return self.runs[-1] if self.runs else None

    def _scope(self, result: ScriptRun | None = None) -> dict[str, Any]:
        scope = self.play.compiled.scope(facts=self.plan.facts, vars=self.play.vars,
                                         target=self.plan.target_info, registered=self.registered)
        if result is not None:
            scope["result"] = scoped({"rc": result.rc, "stdout": result.stdout, "stderr": result.stderr,
                                      "timed_out": result.timed_out, "attempt": result.attempt}, "result")
        return scope

    def _result(self, status: StepStatus, reason: str, run: ScriptRun | None = None) -> StepResult:
        return StepResult(
            name=self.step.name, status=status, reason=reason, rc=run.rc if run else None,
            stdout=run.stdout if run else "", stderr=run.stderr if run else "",
            duration=time.monotonic() - self.started, script=run.script if run else None,
            playbook=self.play.compiled.playbook.name,
            ignored=status == "failed" and self.step.ignore_errors, runs=list(self.runs))

    def execute(self, phase: str, script: str, attempt: int = 1) -> ScriptRun:
        where = {"target": self.plan.target.name, "playbook": self.play.compiled.playbook.name,
                 "step": self.step.name, "phase": phase, "attempt": attempt}
        self.recorder.event("script-start", **where, script=script)
        started = time.monotonic()
        error: str | None = None
        # What arrived so far, kept even when the link drops mid-script: the record says how far it got.
        partial: dict[Stream, CappedOutput] = {"stdout": CappedOutput(), "stderr": CappedOutput()}
        try:
            result = run_script(self.transport, script, timeout=self.step.timeout,
                                on_output=self._sink(partial))
        except CommandTimeoutError as exc:  # the step's own timeout: a failed step, not a lost target
            result = CommandResult(-1, "", str(exc), time.monotonic() - started, timed_out=True)
        except TransportError as exc:
            error = str(exc)
            self.recorder.event("script-end", **where, rc=None,
                                stdout=partial["stdout"].getvalue().decode(errors="replace"),
                                stderr=partial["stderr"].getvalue().decode(errors="replace"),
                                duration=time.monotonic() - started, timed_out=False, error=error)
            raise self.lost(f"{phase}: {exc}", exc) from None
        run = ScriptRun(cast(Phase, phase), attempt, script, result.exit_code, result.stdout, result.stderr,
                        time.monotonic() - started, result.timed_out)
        self.runs.append(run)
        self.recorder.event("script-end", **where, rc=run.rc, stdout=run.stdout, stderr=run.stderr,
                            duration=run.duration, timed_out=run.timed_out, error=None)
        return run

    def _batched_check(self, script: str, batched: BatchedCheck) -> ScriptRun:
        """The check's run as the batch saw it, recorded and shown as execute() records and shows a run
        (its output handed on whole, stdout then stderr, as a transport without streaming does)."""
        where = {"target": self.plan.target.name, "playbook": self.play.compiled.playbook.name,
                 "step": self.step.name, "phase": "check", "attempt": 1}
        self.recorder.event("script-start", **where, script=script)
        if self.on_output is not None:
            for stream, chunk in (("stdout", batched.stdout), ("stderr", batched.stderr)):
                if chunk:
                    self.on_output(self.plan.target, self.step.name, cast(Stream, stream), chunk)
        duration = batched.duration if batched.duration is not None else 0.0
        self.started = min(self.started, time.monotonic() - duration)  # the step took as long as its check
        run = ScriptRun("check", 1, script, batched.rc, batched.stdout.decode(errors="replace"),
                        batched.stderr.decode(errors="replace"), duration)
        self.runs.append(run)
        self.recorder.event("script-end", **where, rc=run.rc, stdout=run.stdout, stderr=run.stderr,
                            duration=run.duration, timed_out=False, error=None)
        return run

    def _sink(self, partial: dict[Stream, CappedOutput]) -> OutputSink:
        """The transport-level sink for this step's scripts: keeps the output in partial, and passes it to
        on_output with the target and step bound."""
        handler = self.on_output
        target, name = self.plan.target, self.step.name

        def sink(stream: Stream, chunk: bytes) -> None:
            partial[stream].add(chunk)
            if handler is not None:
                handler(target, name, stream, chunk)

        return sink

    def run(self, *, would_change_before: bool) -> StepResult:
        self.would_change_before = would_change_before
        check_mode = self.check_mode
        if self.planned.skip_reason is not None:
            return self._result("skipped", self.planned.skip_reason)
        rendered = self.planned.rendered
        if rendered is None:  # depends on registered: render now
            compiled, scope = self.play.compiled, self._scope()
            try:
                if self.step.when is not None and not compiled.evaluate(self.planned.compiled, "when", scope):
                    return self._result("skipped", f"when is false: {self.step.when}")
                rendered = compiled.render(self.planned.compiled, scope)
            except TemplateError as exc:
                return self._result("failed", str(exc))
        action = self.step.action
        if self.known is not None and rendered.check is not None:
            return self._result("ok", f"{self.known} (from the facts)")
        if rendered.check is not None:
            checked = (self._batched_check(rendered.check, self.prechecked) if self.prechecked is not None
                       else self.execute("check", rendered.check))
            if checked.rc == 0 and not checked.timed_out:
                return self._result("ok", _last_line(checked.stdout) or "check passed", checked)
            if rendered.apply is None and action is None:
                if check_mode and would_change_before:
                    return self._result("would-change", "not met before the changes above: "
                                        + _why(checked), checked)
                return self._result("failed", "assertion failed: " + _why(checked), checked)
            if check_mode:
                return self._result("would-change", "check: " + _why(checked), checked)
        if action is not None:  # model.Step's action is its StepType; render sees only the template side
            return self._typed(cast(StepType, action[0]), rendered.action)
        if check_mode:
            return self._result("would-change", "no check: apply always runs")
        refusal = self.before_change()  # the first change on this target: snapshot it first
        if refusal is not None:
            return self._result("failed", refusal, self.last_run)
        return self._apply(rendered)

    def _typed(self, kind: StepType, rendered: Any) -> StepResult:
        """A typed step's own part (steps/), once its check, if it has one, did not pass."""
        self.acted = True
        end: StepEnd = kind.run(self, rendered)
        assert end.run is None or isinstance(end.run, ScriptRun)
        self.extra = dict(end.registered)
        result = self._result(end.status, end.reason, end.run)
        if end.stdout is not None:
            result.stdout = end.stdout
        return result

    def guest(self) -> Guest:
        if self.context.guest_for is None:
            raise TransferError(f"step {self.step.name!r}: no guest driver to move files with")
        return self.context.guest_for(self.plan.target)

    def before_change(self) -> str | None:
        return self.guard.before_change() if self.guard is not None else None

    def event(self, kind: str, /, **fields: Any) -> None:
        self.recorder.event(kind, target=self.plan.target.name, playbook=self.play.compiled.playbook.name,
                            step=self.step.name, **fields)

    def lost(self, reason: str, error: TransportError) -> Exception:
        return _TargetLost(self._result("failed", reason), error)

    def _apply(self, rendered: RenderedStep) -> StepResult:
        assert rendered.apply is not None
        self.acted = True
        compiled = self.play.compiled
        attempts = self.step.retries + 1
        applied: ScriptRun | None = None
        done = False
        try:
            for attempt in range(1, attempts + 1):
                applied = self.execute("apply", rendered.apply, attempt)
                if self.step.until is not None:
                    done = compiled.evaluate(self.planned.compiled, "until", self._scope(applied))
                else:
                    done = applied.rc == 0 and not applied.timed_out
                if done:
                    break
                if attempt < attempts and self.step.delay:
                    self.sleep(self.step.delay)
            assert applied is not None
            succeeded = done and applied.rc == 0 and not applied.timed_out
            if not succeeded:
                tries = f" (after {applied.attempt} attempts)" if applied.attempt > 1 else ""
                reason = "until never true" if applied.rc == 0 else _why(applied)
                return self._result("failed", f"apply failed{tries}: {reason}", applied)
            changed = True
            if self.step.changed_when is not None:
                changed = compiled.evaluate(self.planned.compiled, "changed_when", self._scope(applied))
        except TemplateError as exc:
            return self._result("failed", str(exc), applied)
        if rendered.verify is not None:
            verified = self.execute("verify", rendered.verify)
            if verified.rc != 0 or verified.timed_out:
                return self._result("failed", "verify failed: " + _why(verified), verified)
        if not changed:
            return self._result("ok", "apply made no change (changed_when)", applied)
        return self._result("changed", _last_line(applied.stdout) or "applied", applied)


def _registered_value(result: StepResult, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {**(extra or {}), "rc": result.rc, "stdout": result.stdout, "stderr": result.stderr,
            "status": result.status, "changed": result.status == "changed",
            "skipped": result.status == "skipped", "failed": result.status == "failed"}


def _target_status(steps: Sequence[StepResult]) -> TargetStatus:
    statuses = {step.status for step in steps if not step.ignored}
    ranked: tuple[TargetStatus, ...] = ("failed", "would-change", "changed", "ok")
    for status in ranked:
        if status in statuses:
            return status
    return "ok" if any(step.ignored for step in steps) else "skipped"


@dataclass(frozen=True)
class _TargetState:
    """One target's run: its plan, its transport, the run's context, and its own snapshot guard."""

    plan: TargetPlan
    transport: Transport
    context: RunContext
    guard: SnapshotGuard | None


def run_target(plan: TargetPlan, transport: Transport, context: RunContext | None = None) -> TargetRun:
    """Run a planned target's steps in order. Never raises for a target's own failures. With a guard
    (context.guard_for), the target is snapshotted before its first change and, if its policy says so,
    rolled back when the target fails (not when it is unreachable: the node connection is most likely
    gone too)."""
    context = context or RunContext()
    recorder = context.recorder
    guard = context.guard_for(plan.target) if context.guard_for is not None else None
    started = time.monotonic()
    results: list[StepResult] = []
    status: TargetStatus | None = None
    reason = ""
    try:
        reason = _run_plays(_TargetState(plan, transport, context, guard), results)
    except _TargetLost as lost:
        _record_step(context, plan.target, lost.result)
        results.append(lost.result)
        status, reason = "unreachable", f"step {lost.result.name!r}: {lost.error}"
        error: FleetfixError | None = lost.error
    else:
        error = None
    status = status or _target_status(results)
    snapshot = _after_snapshot(guard, status) if guard is not None else None
    run = TargetRun(plan.target.name, status, results, time.monotonic() - started, reason, snapshot, error)
    _record_target_end(recorder, run)
    return run


def _after_snapshot(guard: SnapshotGuard, status: TargetStatus) -> SnapshotOutcome | None:
    """Roll a failed target back when asked; the guard's outcome if there is anything to report."""
    if not guard.touched:
        return None
    outcome = guard.outcome
    if outcome.name is not None and guard.policy.rollback_on_failure:
        if status == "failed":
            guard.rollback()
        elif status == "unreachable":
            outcome.warnings.append(f"not rolled back (target unreachable); snapshot {outcome.name} kept")
    return outcome


def _run_plays(target: _TargetState, results: list[StepResult]) -> str:
    """Append each step's result to results; stop at the first failure. Returns why it stopped ("").

    The facts describe the target as it was before this run touched it: a step is taken as known from
    them (its facts_check) only while no step has run anything but checks (in check mode, always), the
    rule the check batch's results follow."""
    would_change = False
    changed = False
    if target.plan.checked_with_facts:
        batch = target.plan.early_checks
    else:
        batch = _CheckBatch.run(target) if target.context.batch_checks else None
    for play in target.plan.plays:
        registered: dict[str, Any] = {}
        for planned in play.steps:
            runner = _StepRunner(target, play, planned, registered)
            if batch is not None:
                runner.prechecked = batch.take(planned)
            if not changed and target.context.trust_facts:
                runner.known = planned.known
            result = runner.run(would_change_before=would_change)
            if runner.acted and not target.context.check_mode:
                batch, changed = None, True  # the target may have changed: every later check runs afresh
            _record_step(target.context, target.plan.target, result)
            results.append(result)
            would_change = would_change or result.status == "would-change"
            if planned.compiled.step.register_as:
                registered[planned.compiled.step.register_as] = _registered_value(result, runner.extra)
            if result.status == "failed" and not result.ignored:
                return f"step {result.name!r}: {result.reason}"
    return ""


class _CheckBatch:
    """A target's checks, evaluated ahead of their steps in one script (playbook/checkbatch.py).

    Which checks: those of the steps, in order across the chain, whose check was rendered at plan time
    (not one that uses `registered`), with no `timeout` of their own (a timeout keeps its exact meaning
    in its own run) and short enough to pass as one argument. Steps skipped by `when` at plan time are
    passed over. Outside check mode the batch ends before the first step that is none of these (it would
    run something that may change the target, or a check that must wait for it) and stops at the first
    check that fails (its step changes the target: every later check is out of date). In check mode
    nothing changes, so every such check of the whole chain is in it.

    Use: a step takes its check's result from the batch only while no step since the batch ran has run
    anything but checks (`_run_plays` drops the batch at the first apply or typed step's part); the step
    then records that run (script-start, script-end) and shows its output as if it had run it itself.
    A batch that fails to run or to parse is not used at all: every step runs its own check, as without it.
    One `check-batch` event says what the batch held and whether it was used."""

    def __init__(self, results: Mapping[int, BatchedCheck]) -> None:
        self._results = dict(results)

    def take(self, planned: PlannedStep) -> BatchedCheck | None:
        return self._results.pop(id(planned), None)

    @staticmethod
    def candidates(plan: TargetPlan, check_mode: bool) -> list[tuple[PlannedPlay, PlannedStep, str]]:
        found: list[tuple[PlannedPlay, PlannedStep, str]] = []
        for play in plan.plays:
            for planned in play.steps:
                if planned.skip_reason is not None or planned.known is not None:
                    continue  # runs nothing while the batch's results hold (_run_plays)
                rendered = planned.rendered
                check = rendered.check if rendered is not None else None
                if check is not None and planned.compiled.step.timeout is None and batchable(check):
                    found.append((play, planned, check))
                elif not check_mode:
                    return found
        return found

    @classmethod
    def run(cls, target: _TargetState) -> _CheckBatch | None:
        pending = _PendingBatch.of(target.plan, target.context.check_mode)
        if pending is None:
            return None
        output = bytearray()

        def keep(stream: Stream, chunk: bytes) -> None:
            if stream == "stdout" and len(output) <= MAX_BATCH_OUTPUT:
                output.extend(chunk)

        started = time.monotonic()
        try:
            # No timeout: no check in it has one, as none of those steps' own runs would.
            result = run_script(target.transport, pending.script, on_output=keep)
        except TransportError as exc:
            return pending.finish(target.context.recorder, target.plan.target, f"not run: {exc}",
                                  duration=time.monotonic() - started)
        if result.stdout and not output:  # a transport that hands no output on as it comes
            output.extend(result.stdout.encode(errors="surrogateescape"))
        return pending.finish(target.context.recorder, target.plan.target, (result, bytes(output)),
                              duration=time.monotonic() - started)


@dataclass(frozen=True)
class _PendingBatch:
    """A target's check batch as it goes to the target: which checks, and the script that runs them."""

    found: list[tuple[PlannedPlay, PlannedStep, str]]
    nonce: str
    script: str

    @classmethod
    def of(cls, plan: TargetPlan, check_mode: bool, *, at_least: int = 2) -> _PendingBatch | None:
        """The batch of plan's checks; None when there are fewer than at_least (sent on its own, one
        check is one round trip either way; with the facts, one saves one)."""
        found = _CheckBatch.candidates(plan, check_mode)
        if not found or len(found) < at_least:
            return None
        nonce = new_nonce()
        return cls(found, nonce, batch_script([check for _, _, check in found], nonce,
                                              stop_at_failure=not check_mode))

    def finish(self, recorder: Recorder, target: Target, ran: tuple[CommandResult, bytes] | str, *,
               duration: float, with_facts: bool = False) -> _CheckBatch | None:
        """The batch's results from its run (its result, and its stdout as bytes; or why it did not run),
        recorded; None when it is not to be used."""
        parsed: list[BatchedCheck] | None = None
        error = ran if isinstance(ran, str) else None
        if not isinstance(ran, str):
            result, output = ran
            if len(output) > MAX_BATCH_OUTPUT or result.dropped:
                error = "output over the batch's cap"
            else:
                parsed = parse_batch(output, self.nonce, len(self.found))
                if parsed is None:
                    error = f"unreadable result (exit {result.exit_code})"
        recorder.event(
            "check-batch", target=target.name,
            steps=[{"playbook": play.compiled.playbook.name, "step": planned.compiled.step.name}
                   for play, planned, _ in self.found],
            ran=len(parsed) if parsed is not None else None, duration=duration, error=error,
            with_facts=with_facts)
        if parsed is None:
            return None
        return _CheckBatch({id(planned): checked
                            for (_, planned, _), checked in zip(self.found, parsed, strict=False)})


def _record_step(context: RunContext, target: Target, result: StepResult) -> None:
    context.recorder.event("step", target=target.name, playbook=result.playbook, step=result.name,
                           status=result.status, reason=result.reason, rc=result.rc,
                           duration=result.duration, ignored=result.ignored)
    if context.on_step is not None:
        context.on_step(target, result)


def _record_target_end(recorder: Recorder, run: TargetRun) -> None:
    recorder.event("target-end", target=run.target, status=run.status, reason=run.reason,
                   duration=run.duration, counts=run.counts(),
                   snapshot=run.snapshot.to_dict() if run.snapshot is not None else None)


# --- the fleet -------------------------------------------------------------------------------------

class FleetMap(Protocol):
    """Fleet.map: run fn on every target concurrently, one Outcome per target, in target order."""

    def __call__(
        self, targets: Sequence[Target], fn: Callable[[Target, Transport], R], /,
    ) -> Sequence[Outcome[R]]: ...


FactsFor = Callable[[Target, Transport], Mapping[str, Any]]
# A target's facts, then the script a function of them returns, in one command on the target
# (transport/session.py): the facts and that script's result (None: none sent); None where the transport
# cannot (nothing ran: facts_for then).
FactsThen = Callable[[Target, Transport, Callable[[Mapping[str, Any]], str | None]],
                     tuple[Mapping[str, Any], CommandResult | None] | None]


@dataclass(frozen=True)
class FleetAccess:
    """How the runner reaches the targets: the fleet's map, the facts of a target, and its guest driver
    (Fleet.guest; needed for snapshots, copy/fetch/wheels steps and a dedicated builder's clones).
    facts_then, where given, lets a run send a target's check batch with its facts (RunOptions)."""

    map: FleetMap
    facts_for: FactsFor
    guest_for: GuestFor | None = None
    facts_then: FactsThen | None = None


@dataclass(frozen=True)
class RunOptions:
    """What the caller chooses for one run.

    check_mode: the dry run (only `when` and `check` run; nothing is snapshotted or cloned).
    serial: targets per batch; max_fail_pct: no new batch once more than this percentage of all targets
    failed or were unreachable. snapshots: snapshot each target before its first change (also when any
    playbook of the chain says `snapshot: true`), never in check mode. wheels: the wheel cache.
    batch_checks: evaluate each target's checks ahead of their steps in one round trip (_CheckBatch);
    `fleetfix apply` does. Where the fleet can (FleetAccess.facts_then) and every target runs in the one
    batch of `serial` (so that no target's steps wait behind other batches' after its checks ran), that
    round trip is the facts' own: the batch goes in the same command, right after them."""

    vars: Mapping[str, Any] = field(default_factory=dict)
    check_mode: bool = False
    serial: int | None = None
    max_fail_pct: float | None = None
    snapshots: SnapshotPolicy | None = None
    wheels: WheelOptions | None = None
    batch_checks: bool = False


@dataclass(frozen=True)
class RunHooks:
    """Who watches the run: the record, each step as it ends, each script's output live (not fact
    gathering's), and the redactor whose values are masked in all of it (more are added as found)."""

    recorder: Recorder | None = None
    on_step: StepHandler | None = None
    on_output: StepOutputHandler | None = None
    redactor: Redactor | None = None


def _lost_target(outcome: Outcome[Any], what: str) -> TargetRun:
    error = outcome.error
    unreachable = outcome.status == "unreachable" or isinstance(error, TransportError)
    reason = f"{what}: {error}" if error is not None else f"{what}: {outcome.status}"
    return TargetRun(outcome.target.name, "unreachable" if unreachable else "failed", [],
                     outcome.duration, reason, error=error)


def _snapshot_policy(playbook: Playbook, options: RunOptions, fleet: FleetAccess) -> SnapshotPolicy:
    policy = options.snapshots or SnapshotPolicy()
    if any(book.snapshot for book in playbook.chain()) and not policy.take:
        policy = replace(policy, take=True)
    if options.check_mode or not policy.active:
        policy = SnapshotPolicy()  # check mode changes nothing, so there is nothing to snapshot
    if policy.active and fleet.guest_for is None:
        raise ValueError("snapshots need guest_for (each target's guest driver)")
    return policy


def run_playbook(playbook: Playbook, targets: Sequence[Target], fleet: FleetAccess, options: RunOptions,
                 hooks: RunHooks | None = None) -> PlaybookRun:
    """Plan every target, then run them (in batches of `options.serial`), as RunOptions says. guest drivers
    (fleet.guest_for) snapshot and roll back on their node."""
    hooks = hooks or RunHooks()
    recorder = hooks.recorder or NullRecorder()
    started = time.monotonic()
    chain = [compile_playbook(book) for book in playbook.chain()]
    policy = _snapshot_policy(playbook, options, fleet)
    # Secret-named vars are masked in everything that leaves this function: the record, on_step, and the
    # returned run. Unmasked values stay inside, where later steps' templates may need them.
    redact = hooks.redactor or Redactor()

    def add_secrets(values: Sequence[str]) -> None:
        recorder.add_secrets(values)
        redact.add(values)

    add_secrets(secret_values(options.vars))
    for target in targets:
        add_secrets(secret_values(target.vars))
    on_step: StepHandler | None = None
    if hooks.on_step is not None:
        show_step = hooks.on_step
        on_step = lambda target, result: show_step(target, _redacted_step(result, redact))  # noqa: E731
    context = RunContext(
        check_mode=options.check_mode, recorder=recorder, on_step=on_step, on_output=hooks.on_output,
        batch_checks=options.batch_checks,
        guest_for=fleet.guest_for, guard_for=_guard_factory(policy, fleet.guest_for, recorder, playbook.name),
        # what a wheel's manifest records (its build command) is masked the same way
        wheels=replace(options.wheels, redact=redact.text,
                       sources=options.wheels.sources or Sources(max_bytes=DEFAULT_MAX_BYTES))
        if options.wheels is not None else WheelOptions())
    if options.wheels is not None and not options.check_mode and fleet.guest_for is not None \
            and any(t.wheel_builder for t in targets):
        # Check mode clones nothing: its wheels steps only verify.
        clone = _CloneContext(chain, options.vars, fleet.facts_for, replace(context, on_output=None,
                                                                            guard_for=None))
        context = replace(context, wheels=replace(context.wheels, clones=clone.builds()))
    recorder.event("run-start", playbook=playbook.name, playbooks=[c.playbook.name for c in chain],
                   path=playbook.path, check=options.check_mode, vars=mask_vars(options.vars),
                   targets=[target.name for target in targets], serial=options.serial,
                   max_fail_pct=options.max_fail_pct,
                   snapshot={"take": policy.take, "rollback_on_failure": policy.rollback_on_failure,
                             "keep": policy.keep, "allow_no_snapshot": policy.allow_no_snapshot})

    facts_then = fleet.facts_then if options.batch_checks and (
        not options.serial or options.serial >= len(targets)) else None

    def plan_or_error(target: Target, facts: Mapping[str, Any]) -> TargetPlan | TemplateError:
        try:
            return plan_target(chain, target, facts, options.vars)
        except TemplateError as exc:
            return exc

    def plan(target: Target, transport: Transport) -> TargetPlan | TemplateError:
        planned: TargetPlan | TemplateError | None = None
        pending: _PendingBatch | None = None

        def checks_for(facts: Mapping[str, Any]) -> str | None:  # once the facts are in, in the same command
            nonlocal planned, pending
            planned = plan_or_error(target, facts)
            if isinstance(planned, TargetPlan):
                pending = _PendingBatch.of(planned, options.check_mode, at_least=1)
            return None if pending is None else pending.script

        with_checks = facts_then(target, transport, checks_for) if facts_then is not None else None
        if with_checks is None:
            facts = dict(fleet.facts_for(target, transport))
            planned = plan_or_error(target, facts)
        else:
            facts, checked = dict(with_checks[0]), with_checks[1]
            if planned is None:
                planned = plan_or_error(target, facts)
        if isinstance(planned, TemplateError):
            recorder.event("target-start", target=target.name, facts=facts, vars=None)
            return planned
        for play in planned.plays:
            add_secrets(secret_values(play.vars))
        recorder.event("target-start", target=target.name, facts=facts,
                       vars=mask_vars(planned.plays[-1].vars))
        if pending is not None and with_checks is not None:
            planned.checked_with_facts = True
            ran = "not run" if checked is None else (checked, checked.stdout.encode(errors="surrogateescape"))
            planned.early_checks = pending.finish(recorder, target, ran, with_facts=True,
                                                  duration=checked.duration if checked else 0.0)
        return planned

    finished: dict[str, TargetRun] = {}
    plans: dict[str, TargetPlan] = {}
    template_errors: list[TemplateError] = []
    for outcome in fleet.map(targets, plan):
        name = outcome.target.name
        if outcome.status == "ok" and isinstance(outcome.value, TargetPlan):
            plans[name] = outcome.value
        elif outcome.status == "ok" and isinstance(outcome.value, TemplateError):
            template_errors.append(outcome.value)
            finished[name] = TargetRun(name, "failed", [], outcome.duration, str(outcome.value))
            _record_target_end(recorder, finished[name])
        else:
            finished[name] = _lost_target(outcome, "gathering facts")
            _record_target_end(recorder, finished[name])

    aborted: str | None = None
    if template_errors:
        # A template error means the playbook (or a var) is wrong: run nothing anywhere.
        aborted = f"template error on {len(template_errors)} target(s); nothing was run"
        for name in plans:
            finished[name] = TargetRun(name, "skipped", [], 0.0, "not run: " + aborted)
            _record_target_end(recorder, finished[name])
    else:
        batches = _Batches([target for target in targets if target.name in plans], len(targets), options)
        try:
            aborted = batches.run(plans, finished, fleet.map, context)
        finally:
            if context.wheels.sources is not None:
                context.wheels.sources.close()  # the run's copies of source archives

    run = PlaybookRun(
        playbook=playbook.name, check=options.check_mode,
        targets=[_redacted_target(finished[target.name], redact) for target in targets
                 if target.name in finished],
        duration=time.monotonic() - started, run_id=recorder.run_id, aborted=aborted,
        error=_redacted_error(template_errors[0], redact) if template_errors else None)
    recorder.event("run-end", status=run.status, aborted=aborted, duration=run.duration,
                   recap={name: {"status": status, **counts} for name, status, counts in run.recap()})
    return run


class _Tapped:
    """The run's recorder, with each `wheel` event's fields also handed to tap."""

    def __init__(self, recorder: Recorder, tap: Callable[[Mapping[str, Any]], None]) -> None:
        self.recorder, self.tap = recorder, tap

    @property
    def run_id(self) -> str | None:
        return self.recorder.run_id

    def event(self, kind: str, /, **fields: Any) -> None:
        self.recorder.event(kind, **fields)
        if kind == "wheel":
            self.tap(fields)

    def add_secrets(self, values: Iterable[str]) -> None:
        self.recorder.add_secrets(values)


@dataclass(frozen=True)
class _CloneContext:
    """What a dedicated builder's clone runs the playbook with (playbook/clonebuild.py): the run's own
    chain, vars and facts, and its context without live output or snapshots."""

    chain: Sequence[CompiledPlaybook]
    cli_vars: Mapping[str, Any]
    facts_for: FactsFor
    context: RunContext

    def builds(self) -> CloneBuilds:
        guest_for = self.context.guest_for
        assert guest_for is not None
        return CloneBuilds(
            node_transport=lambda spec: guest_for(Target(spec.node.name, spec.node)).transport(),
            run_in=self.run_in, event=self.context.recorder.event)

    def run_in(self, target: Target, builder: str, tap: Callable[[Mapping[str, Any]], None]) -> CloneRun:
        """The clone is probed and planned like any target and all its steps run (shown as they end, like
        the targets'); its wheels are kept as the builder's, never a target's; it never asks for a clone."""
        assert self.context.guest_for is not None
        transport = self.context.guest_for(target).transport()
        facts = dict(self.facts_for(target, transport))
        plan = plan_target(self.chain, target, facts, self.cli_vars)
        tapped = _Tapped(self.context.recorder, tap)
        tapped.event("target-start", target=target.name, facts=facts, vars=mask_vars(plan.plays[-1].vars))
        wheels = replace(self.context.wheels, clones=None, builder=builder)
        run = run_target(plan, transport, replace(self.context, recorder=tapped, wheels=wheels))
        return CloneRun(run.status, run.reason)


def _redacted_step(result: StepResult, redact: Redactor) -> StepResult:
    runs = [replace(run, script=redact.text(run.script), stdout=redact.text(run.stdout),
                    stderr=redact.text(run.stderr)) for run in result.runs]
    return replace(result, reason=redact.text(result.reason), stdout=redact.text(result.stdout),
                   stderr=redact.text(result.stderr),
                   script=None if result.script is None else redact.text(result.script), runs=runs)


def _redacted_error(error: TemplateError, redact: Redactor) -> TemplateError:
    """The error as shown (text, --json): a template error may quote the value it choked on."""
    return TemplateError(redact.text(error.detail), path=error.path, line=error.line, field=error.field)


def _redacted_target(run: TargetRun, redact: Redactor) -> TargetRun:
    return replace(run, reason=redact.text(run.reason), steps=[_redacted_step(s, redact) for s in run.steps])


def _guard_factory(policy: SnapshotPolicy, guest_for: GuestFor | None, recorder: Recorder,
                   playbook: str) -> GuardFor | None:
    if not policy.active or guest_for is None:
        return None

    def guard_for(target: Target) -> SnapshotGuard | None:
        description = f"fleetfix apply {playbook}" + (f" (run {recorder.run_id})" if recorder.run_id else "")
        return SnapshotGuard(target, policy, guest_for, event=recorder.event, description=description)

    return guard_for


@dataclass(frozen=True)
class _Batches:
    """The targets that were planned, in `serial` batches; the run stops starting batches once more than
    max_fail_pct percent of all `total` targets have failed or were unreachable."""

    runnable: Sequence[Target]
    total: int
    options: RunOptions

    def run(self, plans: Mapping[str, TargetPlan], finished: dict[str, TargetRun], fleet_map: FleetMap,
            context: RunContext) -> str | None:
        """Fill finished with every target's run; returns why the run stopped early, if it did."""
        serial, max_fail_pct, total = self.options.serial, self.options.max_fail_pct, self.total
        size = serial if serial and serial > 0 else max(len(self.runnable), 1)
        batches = [self.runnable[start:start + size] for start in range(0, len(self.runnable), size)]

        # Facts are gathered for every target before the first batch starts: a later batch's steps may run
        # long after, so its steps run their checks instead of taking the facts' word (facts_check).
        later = replace(context, trust_facts=False)

        def runner_for(ctx: RunContext) -> Callable[[Target, Transport], TargetRun]:
            return lambda target, transport: run_target(plans[target.name], transport, ctx)

        for number, batch in enumerate(batches):
            for outcome in fleet_map(batch, runner_for(later if number else context)):
                if outcome.status == "ok" and isinstance(outcome.value, TargetRun):
                    finished[outcome.target.name] = outcome.value
                else:
                    finished[outcome.target.name] = _lost_target(outcome, "running steps")
                    _record_target_end(context.recorder, finished[outcome.target.name])
            bad = sum(run.status in ("failed", "unreachable") for run in finished.values())
            if max_fail_pct is not None and total and bad * 100.0 / total > max_fail_pct:
                rest = [target for later in batches[number + 1:] for target in later]
                if not rest:
                    return None
                why = f"{bad} of {total} targets failed, over --max-fail {max_fail_pct:g}%"
                for target in rest:
                    finished[target.name] = TargetRun(target.name, "skipped", [], 0.0, "not run: " + why)
                    _record_target_end(context.recorder, finished[target.name])
                return why
        return None
