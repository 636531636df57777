"""`fleetfix probe`: every fact in one round trip per target, the root cause named, with its fix."""

from __future__ import annotations

from dataclasses import replace

import click

from fleetfix.cli.common import (
    FleetOptions,
    ReportChoice,
    dial_ahead,
    handle_errors,
    local_option,
    report_options,
    resolve,
    targeting_options,
)
from fleetfix.errors import ExitCode
from fleetfix.inventory.request import TargetRequest


@click.command("probe")
@targeting_options
@local_option
@click.option("--deep", is_flag=True, help="Also import torch and the extensions (slower, touches the GPU).")
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              help="Inspect exactly this interpreter (repeatable), for every target: like an inventory's "
                   "`pythons`, it turns the discovery of other torch envs off.")
@report_options("probe")
@handle_errors
def probe_command(deep: bool, pythons: tuple[str, ...], report: ReportChoice, targets: TargetRequest,
                  fleet_options: FleetOptions) -> ExitCode:
    """Gather every fact in one round trip per target and name the root cause, with its fix.

    \b
    Examples:
      fleetfix probe --local
      fleetfix probe --host 10.1.2.6 --ct 200 --ct 201
      fleetfix probe -i inventory.yaml --limit 'tag:gpu' --json
      fleetfix probe --local --python /srv/env/bin/python3
    """
    resolved = resolve(targets).targets
    if pythons:  # the command line's list pins every target's, as `pythons` in an inventory would
        resolved = [replace(target, vars={**target.vars, "pythons": list(pythons)}) for target in resolved]
    dial_ahead(resolved, fleet_options)  # first packets out now; the imports below overlap the handshakes
    with fleet_options.open() as fleet:
        fleet.start_connecting(resolved)  # the imports below overlap the SSH handshakes
        from fleetfix.cli.progress import ProbeProgress
        from fleetfix.probe.run import ProbeRun, probe_targets

        with ProbeProgress(len(resolved), enabled=not report.as_json) as progress:
            run = ProbeRun(probe_targets(fleet, resolved, deep=deep, on_probed=progress.advance,
                                         also_import=report.modules))
    report.emit(run)
    return run.exit_code
