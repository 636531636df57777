"""`fleetfix exec`: one command on every target, its result per target."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fleetfix.errors import ExitCode
from fleetfix.fleet import Fleet, Outcome
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult, OutputSink, Transport


@dataclass
class ExecRun:
    """Each target's outcome (its CommandResult as value), in input order."""

    report_kind: ClassVar[str] = "exec"
    outcomes: list[Outcome[CommandResult]]

    @property
    def exit_code(self) -> ExitCode:
        if any(outcome.status == "unreachable" for outcome in self.outcomes):
            return ExitCode.UNREACHABLE
        if any(outcome.value is None or not outcome.value.ok for outcome in self.outcomes):
            return ExitCode.FAILED
        return ExitCode.OK

    def to_json(self) -> list[dict[str, Any]]:
        return [_outcome_json(outcome) for outcome in self.outcomes]


def run_command(
    fleet: Fleet, targets: Sequence[Target], argv: Sequence[str], *, timeout: float | None = None,
    sink_for: Callable[[Target], OutputSink | None] = lambda target: None,
    done: Callable[[Target], None] = lambda target: None,
) -> ExecRun:
    """argv on every target (verbatim, no shell of ours). sink_for(target) may stream its output live;
    done(target) is called when that target's command has ended, whatever the outcome."""

    def run(target: Target, transport: Transport) -> CommandResult:
        try:
            return transport.execute(argv, timeout=timeout, on_output=sink_for(target))
        finally:
            done(target)

    return ExecRun(fleet.map(targets, run))


def _outcome_json(outcome: Outcome[CommandResult]) -> dict[str, Any]:
    result = outcome.value
    return {
        "target": outcome.target.name,
        "status": outcome.status if result is None else ("ok" if result.ok else "failed"),
        "error": None if outcome.error is None else str(outcome.error),
        "exit_code": None if result is None else result.exit_code,
        "timed_out": None if result is None else result.timed_out,
        "stdout": None if result is None else result.stdout,
        "stderr": None if result is None else result.stderr,
        "dropped": None if result is None else result.dropped,  # bytes over the output cap
        "duration": round(outcome.duration, 3),
    }
