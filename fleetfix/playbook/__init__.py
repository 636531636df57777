"""Declarative playbooks: load (model), template (render), run (runner), record (records).

See docs/playbooks.md for the file format and the rules.
"""

from fleetfix.playbook.load import load_playbook, parse_playbook
from fleetfix.playbook.model import Playbook, Step
from fleetfix.playbook.records import RunRecorder, list_runs, load_run
from fleetfix.playbook.runner import (
    FleetAccess,
    PlaybookRun,
    RunContext,
    RunHooks,
    RunOptions,
    StepResult,
    TargetPlan,
    TargetRun,
    plan_target,
    run_playbook,
    run_target,
)

__all__ = [
    "FleetAccess",
    "Playbook",
    "PlaybookRun",
    "RunContext",
    "RunHooks",
    "RunOptions",
    "RunRecorder",
    "Step",
    "StepResult",
    "TargetPlan",
    "TargetRun",
    "list_runs",
    "load_playbook",
    "load_run",
    "parse_playbook",
    "plan_target",
    "run_playbook",
    "run_target",
]
