"""Probe a fleet: one probe script per target, one node-facts script per node, then the diagnosis.

This module says what the probe is (its scripts, their limits, how their output becomes `Facts` and
`Finding`s); how the scripts are run, batched and bounded is the fleet's (fleetfix.fleet.batches).
Library code: returns `TargetReport`s; the CLI renders them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from fleetfix.errors import ExitCode, FleetfixError
from fleetfix.fleet import Fleet, Outcome
from fleetfix.fleet.batches import NodeScript, Ran, ScriptJob, run_scripts, script_output
from fleetfix.importahead import import_ahead
from fleetfix.probe.script import build_node_script, build_probe_script
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult, Transport, run_script

if TYPE_CHECKING:
    from fleetfix.probe.facts import Facts, NodeFacts
    from fleetfix.probe.rules import Finding

R = TypeVar("R")

# What reads the probe's output: imported while the first scripts run (import_ahead), not before they are
# sent, because pydantic building the facts models is most of the probe's start-up CPU and can overlap
# the network's round trips (docs/performance.md).
MODEL_MODULES = ("fleetfix.probe.facts", "fleetfix.probe.rules")

PROBE_TIMEOUT = 120.0
NODE_FACTS_TIMEOUT = 30.0
# --deep imports torch and each extension in child processes, each with its own limit.
DEEP_PROBE_TIMEOUT = 900.0


@dataclass
class TargetReport:
    target: Target
    status: str  # "ok" | "unreachable" | "failed"
    facts: Facts | None = None
    node: NodeFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    error: FleetfixError | None = None
    duration: float = 0.0

    @property
    def worst(self) -> str:
        """The worst severity among findings, or "healthy"."""
        for severity in ("error", "warning", "info"):  # Severity's values (a StrEnum), worst first
            if any(finding.severity == severity for finding in self.findings):
                return severity
        return "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.name,
            "node": self.target.node.name,
            **self.target.guest.to_json(),
            "status": self.status,
            "health": self.worst if self.status == "ok" else self.status,
            "error": None if self.error is None else str(self.error),
            "duration": round(self.duration, 3),
            "findings": [finding.model_dump(mode="json") for finding in self.findings],
            "facts": self.facts.model_dump(mode="json") if self.facts else None,
            "node_facts": self.node.model_dump(mode="json") if self.node else None,
        }


def python_interpreters(target: Target) -> list[str]:
    """The python envs to inspect, from the target's vars: `pythons` (list) or `python` (one)."""
    pythons = target.vars.get("pythons")
    if isinstance(pythons, list) and pythons:
        return [str(p) for p in pythons]
    return [str(target.vars.get("python", "python3"))]


def discovers_pythons(target: Target) -> bool:
    """Whether the probe also looks for torch envs nobody named and inspects them: yes, unless the target
    pins its list with `pythons` (docs/inventory.md). `python` names the main interpreter and keeps it on."""
    pythons = target.vars.get("pythons")
    return not (isinstance(pythons, list) and pythons)


@dataclass
class ProbeRun:
    """Every target's report, in input order; knows the exit code it calls for."""

    report_kind: ClassVar[str] = "probe"
    reports: list[TargetReport]

    @property
    def exit_code(self) -> ExitCode:
        if any(report.status != "ok" for report in self.reports):
            return ExitCode.UNREACHABLE
        if any(report.worst == "error" for report in self.reports):
            return ExitCode.FINDINGS
        return ExitCode.OK

    def summary(self) -> dict[str, int]:
        """How many targets at each health ("error", "healthy", "unreachable", ...), in first-seen order."""
        counts: dict[str, int] = {}
        for report in self.reports:
            key = report.worst if report.status == "ok" else report.status
            counts[key] = counts.get(key, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"targets": [report.to_json() for report in self.reports], "summary": self.summary()}


def probe_targets(
    fleet: Fleet,
    targets: Sequence[Target],
    *,
    deep: bool = False,
    on_probed: Callable[[Target], None] | None = None,
    also_import: Sequence[str] = (),
) -> list[TargetReport]:
    """Probe every target; their reports, in input order. on_probed(target) as each target's probe ends
    (from worker threads: a progress bar). also_import: modules the caller needs afterwards (its report's
    renderer), imported while the first scripts run, with the probe's own models (fleetfix.importahead).

    The outputs are read and diagnosed after the last probe has ended, one after the other: done on the node
    threads as each came in, between the other threads' packets, the same work costs about twice the CPU
    (docs/performance.md). What it costs: a target's findings come with the others', not as it finishes. A
    caller that takes each report as it comes (the audit commits them one by one) uses probe_each."""
    def probed(item: Ran[NodeFacts] | TargetReport) -> Ran[NodeFacts] | TargetReport:
        if on_probed:
            on_probed(item.target)
        return item

    items = _probe(fleet, targets, deep=deep, finish=probed, also_import=also_import)
    for index, item in enumerate(items):  # in place: each output is dropped once it is read
        if isinstance(item, Ran):
            items[index] = _report(item)
    return cast("list[TargetReport]", items)


def probe_each(fleet: Fleet, targets: Sequence[Target], *, deep: bool = False,
               on_done: Callable[[TargetReport], None]) -> None:
    """Probe every target and hand each report to on_done (from worker threads) as it finishes, keeping
    none: for a caller that takes each one in there (the audit commits it). Held to the end, a large fleet's
    facts and reports would make the audit's peak memory grow with the number of targets
    (docs/performance.md)."""
    def report(item: Ran[NodeFacts] | TargetReport) -> None:
        on_done(_report(item) if isinstance(item, Ran) else item)

    _probe(fleet, targets, deep=deep, finish=report)


def _report(ran: Ran[NodeFacts]) -> TargetReport:
    """A target's output read and diagnosed; a failed report for output that is not the probe's (or a bug
    in a rule: for this target only, as anything raised for a target while the fleet runs it)."""
    from fleetfix.probe.facts import parse_facts  # loaded by now (import_ahead)
    from fleetfix.probe.rules import diagnose

    try:
        facts = parse_facts(ran.stdout)
        required = ran.target.vars.get("required_extensions") or ()
        findings = diagnose(facts, ran.node, required_extensions=[str(name) for name in required],
                            guest=ran.target.guest)
    except Exception as error:
        failed = Outcome.failed(ran.target, error, ran.duration)
        return TargetReport(ran.target, failed.status, error=failed.error, duration=ran.duration)
    return TargetReport(ran.target, "ok", facts, ran.node, findings, duration=ran.duration)


def _probe(
    fleet: Fleet, targets: Sequence[Target], *, deep: bool,
    finish: Callable[[Ran[NodeFacts] | TargetReport], R], also_import: Sequence[str] = (),
) -> list[R]:
    """What finish makes of each target, in input order: of its output once the probe ended (with the
    node's facts), or of its failed report."""
    job = _probe_job(deep, lambda: import_ahead(*MODEL_MODULES, *also_import))
    outcomes = run_scripts(fleet, targets, job, finish)
    return [cast(R, outcome.value) if outcome.ok else finish(
                TargetReport(outcome.target, outcome.status, error=outcome.error, duration=outcome.duration))
            for outcome in outcomes]


def _probe_job(deep: bool, on_first_start: Callable[[], object] | None = None) -> ScriptJob[NodeFacts]:
    """The probe as the fleet runs it: the script for each target, its node's script, their limits."""
    node = NodeScript(build_node_script(), NODE_FACTS_TIMEOUT, _parse_node_facts)
    return ScriptJob("probe", _script_for(deep), _script_key, DEEP_PROBE_TIMEOUT if deep else PROBE_TIMEOUT,
                     node, on_first_start)


def _script_key(target: Target) -> Hashable:
    """What the probe script depends on besides --deep: targets with equal keys get the same script."""
    return tuple(python_interpreters(target)), discovers_pythons(target)


def _script_for(deep: bool) -> Callable[[Target], str]:
    def script(target: Target) -> str:
        return with_buffered_stdout(
            build_probe_script(python_interpreters(target), deep=deep, discover=discovers_pythons(target)))
    return script


def _parse_node_facts(stdout: str) -> NodeFacts:
    from fleetfix.probe.facts import parse_node_facts  # after the script ran: see MODEL_MODULES

    return parse_node_facts(stdout)


def gather_facts(target: Target, transport: Transport, *, deep: bool = False) -> Facts:
    """The probe on one target, for playbooks: its facts only."""
    from fleetfix.probe.facts import parse_facts  # after the script ran: see MODEL_MODULES

    return parse_facts(_probe_output(target, transport, deep=deep))


def gather_facts_then(target: Target, transport: Transport, then: Callable[[Facts], str | None]
                      ) -> tuple[Facts, CommandResult | None] | None:
    """gather_facts, then the script then(facts) returns, run in the same command on the target (one
    `pct exec`, transport/session.py): the facts and that script's result (None when none was sent).
    None, and nothing run, where the transport cannot feed a command's stdin over time."""
    from fleetfix.probe.facts import parse_facts  # after the script ran: see MODEL_MODULES
    from fleetfix.transport.session import run_then

    job = _probe_job(deep=False)
    parsed: list[Facts] = []

    def next_script(stdout: str) -> str | None:
        parsed.append(parse_facts(stdout))
        return then(parsed[0])

    session = run_then(transport, job.script(target), next_script, timeout=job.timeout)
    if session is None:
        return None
    if not parsed:  # the probe did not end (a timeout, ...): its failure as gather_facts reports it
        parsed.append(parse_facts(script_output(session.first, job)))
    return parsed[0], session.second


def _probe_output(target: Target, transport: Transport, *, deep: bool) -> str:
    job = _probe_job(deep)
    return script_output(run_script(transport, job.script(target), timeout=job.timeout), job)


def with_buffered_stdout(script: str) -> str:
    """The same sh script, its stdout written in one piece when it ends instead of line by line.

    Why: sshd sends every write as its own SSH packet, and paramiko spends a fraction of a millisecond of
    controller CPU per packet in its transport thread; the probe writes its JSON in dozens of pieces, which
    cost several times the controller CPU of one piece (benchmarks/, docs/performance.md).
    The output is held in a shell variable on the target (the probe writes no files) and printed exactly:
    the trailing "x" keeps command substitution from eating trailing newlines. The exit status is the
    script's; stderr is not buffered. The script runs in a subshell, so its own `exit` ends only that.
    """
    return (
        "__fleetfix_out=$(\n(\n:\n"  # ":" so an empty (or comments-only) script is still valid sh
        f"{script.rstrip(chr(10))}\n"
        ")\n__fleetfix_rc=$?; printf x; exit $__fleetfix_rc\n)\n"
        "__fleetfix_rc=$?\n"
        "printf '%s' \"${__fleetfix_out%x}\"\n"
        "exit $__fleetfix_rc\n"
    )
