"""`fleetfix probe`: every fact in one round trip per target, the root cause named, with its fix."""

from __future__ import annotations

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
@report_options("probe")
@handle_errors
def probe_command(deep: bool, report: ReportChoice, targets: TargetRequest,
                  fleet_options: FleetOptions) -> ExitCode:
    """Gather every fact in one round trip per target and name the root cause, with its fix.

    \b
    Examples:
      fleetfix probe --local
      fleetfix probe --host 10.1.2.6 --ct 200 --ct 201
      fleetfix probe -i inventory.yaml --limit 'tag:gpu' --json
    """
    resolved = resolve(targets).targets
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
