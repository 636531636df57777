"""`fleetfix exec`: a command on every target, stdout per target at the end, stderr live (on a terminal:
everything a target printed under its header)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from fleetfix.target import Target
    from fleetfix.transport.base import OutputSink


@click.command("exec", context_settings={"ignore_unknown_options": True})
@targeting_options
@local_option
@click.option("--timeout", type=click.FloatRange(0.1, 7 * 86400), default=None,
              help="Per-target command timeout (s).")
@report_options("exec")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_command(command: tuple[str, ...], timeout: float | None, report: ReportChoice,
                 targets: TargetRequest, fleet_options: FleetOptions) -> ExitCode:
    """Run a command on targets; its arguments reach the remote side verbatim.

    Each target's stdout is printed when it finishes, under a `== TARGET exit N` line; its stderr goes
    to stderr as it arrives (as `TARGET ! line` when there are several targets), with secret-named vars
    masked. Pipe stdout, watch stderr. On a terminal (stdout and stderr both), everything a target
    printed follows its header instead, in the order it came.

    \b
    Examples:
      fleetfix exec --host 10.1.2.6 --ct 200 -- cat /etc/os-release
      fleetfix exec --local -- nvcc --version
    """
    resolved = resolve(targets).targets
    dial_ahead(resolved, fleet_options)  # first packets out now; the imports below overlap the handshakes
    with fleet_options.open() as fleet:
        fleet.start_connecting(resolved)  # the imports below overlap the SSH handshakes
        from fleetfix.cli.live import LiveOutput, Transcripts
        from fleetfix.command import run_command
        from fleetfix.reports.console import err_console
        from fleetfix.secrets import Redactor, secret_values

        redactor = Redactor()
        for target in resolved:
            redactor.add(secret_values(target.vars))
        # --json carries stderr in its records: streaming it as well would only print it twice. On one
        # screen, a target's output goes under its header, which only exists once the target is done.
        live: LiveOutput | None = None
        transcripts: Transcripts | None = None
        if not report.as_json and sys.stdout.isatty() and sys.stderr.isatty():
            transcripts = Transcripts(redact=redactor.text)
        elif not report.as_json:
            # One target: its stderr lines as the command wrote them (as over plain ssh); several:
            # labelled.
            live = LiveOutput(err_console, redact=redactor.text, labelled=len(resolved) > 1)

        def sink_for(target: Target) -> OutputSink | None:
            if transcripts is not None:
                return transcripts.sink_for(target.name)
            return None if live is None else live.sink_for(target.name, streams=("stderr",))

        def done(target: Target) -> None:
            if live is not None:
                live.flush(target.name)  # a last line without its newline

        run = run_command(fleet, resolved, command, timeout=timeout, sink_for=sink_for, done=done)
    if transcripts is not None:
        report.emit(run, transcripts=transcripts.lines())
    else:
        report.emit(run)
    return run.exit_code
