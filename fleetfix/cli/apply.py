"""`fleetfix apply`, and the one way a playbook is rolled out (also for `audit --remediate`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from fleetfix.cli.common import (
    DEFAULT_RECORD_OUTPUT,
    FleetOptions,
    ReportChoice,
    RolloutOptions,
    handle_errors,
    local_option,
    report_options,
    resolve,
    rollout_options,
    targeting_options,
    verbose,
)
from fleetfix.errors import ExitCode
from fleetfix.inventory.request import TargetRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from fleetfix.fleet import Fleet
    from fleetfix.playbook import Playbook, PlaybookRun
    from fleetfix.probe.facts import Facts
    from fleetfix.target import Target
    from fleetfix.transport.base import CommandResult, Transport


def roll_out(playbook: Playbook, targets: Sequence[Target], fleet: Fleet, rollout: RolloutOptions, *,
             show_steps: bool, live_output: bool) -> PlaybookRun:
    """Run the playbook on targets as `fleetfix apply` does: recorded, secrets masked in everything shown,
    each step printed as it ends (show_steps), scripts' output streamed (live_output)."""
    from fleetfix.cli.live import LiveOutput, step_printer
    from fleetfix.playbook import FleetAccess, RunHooks, RunOptions, RunRecorder, run_playbook
    from fleetfix.probe.run import gather_facts
    from fleetfix.secrets import Redactor

    variables, secrets = rollout.secret_vars()
    # Secret-named vars and every value from the secret channel (references, --var-file): masked in
    # everything printed, live lines included, and recorded.
    redactor = Redactor()
    redactor.add(secrets)
    live = LiveOutput(redact=redactor.text) if live_output else None
    with RunRecorder(rollout.records_dir(), max_field=rollout.record_output or DEFAULT_RECORD_OUTPUT
                     ) as recorder:
        recorder.add_secrets(secrets)
        fleet_access = FleetAccess(
            fleet.map, lambda target, transport: gather_facts(target, transport).model_dump(mode="json"),
            fleet.guest, _facts_then)
        options = RunOptions(vars=variables, check_mode=rollout.check, serial=rollout.serial,
                             max_fail_pct=rollout.max_fail, snapshots=rollout.snapshot_policy(),
                             wheels=rollout.wheel_options(), batch_checks=True)
        hooks = RunHooks(recorder=recorder,
                         on_step=step_printer(verbose=verbose(), live=live) if show_steps else None,
                         on_output=None if live is None else live.on_output, redactor=redactor)
        run = run_playbook(playbook, targets, fleet_access, options, hooks)
    if live is not None:
        live.flush()
    return run


def _facts_then(target: Target, transport: Transport, then: Callable[[Mapping[str, Any]], str | None]
                ) -> tuple[Mapping[str, Any], CommandResult | None] | None:
    """FleetAccess.facts_then: the probe's facts (as the records and templates take them: JSON-shaped),
    then the script then() makes of them, in one command."""
    from fleetfix.probe.run import gather_facts_then

    dumped: list[dict[str, Any]] = []

    def then_dumped(facts: Facts) -> str | None:
        dumped.append(facts.model_dump(mode="json"))
        return then(dumped[0])

    gathered = gather_facts_then(target, transport, then_dumped)
    if gathered is None:
        return None
    return (dumped[0] if dumped else gathered[0].model_dump(mode="json")), gathered[1]


@click.command("apply")
@click.argument("playbook_path", metavar="PLAYBOOK", type=click.Path(dir_okay=False))
@targeting_options
@local_option
@rollout_options()
@report_options("apply")
@handle_errors
def apply_command(playbook_path: str, rollout: RolloutOptions, report: ReportChoice, targets: TargetRequest,
                  fleet_options: FleetOptions) -> ExitCode:
    """Apply a playbook to targets: ordered, idempotent steps; a recap per target at the end.

    With --snapshot (or `snapshot: true` in the playbook) each container or VM is snapshotted on its
    node right before its first change; see docs/snapshots.md.

    \b
    Examples:
      fleetfix apply playbooks/cuda-toolkit.yaml -i inventory.yaml --check
      fleetfix apply playbooks/cuda-toolkit.yaml --local --check
      fleetfix apply playbooks/cuda-toolkit.yaml --host 10.1.2.6 --ct 200 \\
          --var cuda_repo_base=http://mirror.internal/compute/cuda/repos
      fleetfix apply playbooks/cuda-toolkit.yaml -i inventory.yaml --snapshot --rollback-on-failure
    """
    from fleetfix.playbook import load_playbook

    targets.check()  # a usage error first, before any file is read
    playbook = load_playbook(playbook_path)
    rollout.variables()  # a bad --var fails before anything is resolved or probed
    resolved = resolve(targets).targets
    with fleet_options.open() as fleet:
        run = roll_out(playbook, resolved, fleet, rollout, show_steps=not report.as_json,
                       live_output=verbose() and not report.as_json)
    report.emit(run)
    return run.exit_code
