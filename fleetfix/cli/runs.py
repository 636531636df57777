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
    """List recorded runs, oldest first.

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
    """Show one run (RUN_ID, or `last` for the newest): every target's snapshot, if any, and its steps,
    with their scripts' output.

    \b
    Examples:
      fleetfix runs show 20261202T120000Z-1a2b3c
      fleetfix runs show last
    """
    from fleetfix.errors import ConfigError
    from fleetfix.paths import default_state_dir
    from fleetfix.playbook.records import list_runs, load_run

    directory = state_dir or default_state_dir()
    if run_id == "last":  # run ids start with their UTC start time: the last in order is the newest
        runs = list_runs(directory)
        if not runs:
            raise ConfigError(f"no runs recorded in {directory}")
        run_id = runs[-1].run_id
    report.emit(load_run(directory, run_id))
