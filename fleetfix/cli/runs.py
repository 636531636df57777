"""`fleetfix runs ...`: the records of past `apply` runs."""

from __future__ import annotations

import click

from fleetfix.cli.common import ReportChoice, handle_errors, report_options

_STATE_DIR = click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                          help="Where run records are.")


@click.group("runs")
def runs_group() -> None:
    """Read the records of past `apply` runs."""


@runs_group.command("list")
@_STATE_DIR
@report_options("runs")
@handle_errors
def runs_list(state_dir: str | None, report: ReportChoice) -> None:
    """List recorded runs, newest first.

    \b
    Example:
      fleetfix runs list
    """
    from fleetfix.paths import default_state_dir
    from fleetfix.playbook.records import RunList, list_runs

    report.emit(RunList(list_runs(state_dir or default_state_dir())))


@runs_group.command("show")
@click.argument("run_id")
@_STATE_DIR
@report_options("run")
@handle_errors
def runs_show(run_id: str, state_dir: str | None, report: ReportChoice) -> None:
    """Show one run: every target's steps, with their scripts' output.

    \b
    Example:
      fleetfix runs show 20261202T120000Z-1a2b3c
    """
    from fleetfix.paths import default_state_dir
    from fleetfix.playbook.records import load_run

    report.emit(load_run(state_dir or default_state_dir(), run_id))
