"""`fleetfix schedule ...`: run `fleetfix audit` nightly, as a systemd service + timer or a cron line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fleetfix.cli.audit import audit_group
from fleetfix.cli.common import handle_errors


@click.group("schedule")
def schedule_group() -> None:
    """Run `fleetfix audit` nightly: a systemd service + timer, or a cron line."""


def _spec(name: str, at: str, on_calendar: str | None, randomized_delay: str, audit_args: tuple[str, ...],
          db: str | None) -> Any:
    from fleetfix.audit.schedule import ScheduleSpec
    from fleetfix.errors import ConfigError

    # Parse the audit options now, with the audit command's own parser: a typo fails here, at install
    # time, instead of every night in the journal.
    # A plain command (not the group) with the same options: a stray word is an error, not a subcommand.
    parser = click.Command("audit", params=audit_group.params, add_help_option=False)
    try:
        parser.make_context("audit", list(audit_args))
    except click.ClickException as exc:
        raise ConfigError(f"audit options: {exc.format_message()}") from None
    return ScheduleSpec.build(name=name, at=at, on_calendar=on_calendar, randomized_delay=randomized_delay,
                              audit_args=audit_args, db=db)


_NAME = click.option("--name", default="fleetfix-audit", show_default=True, help="Unit name (no suffix).")
_UNIT_DIR = click.option("--unit-dir", type=click.Path(file_okay=False), default="/etc/systemd/system",
                         show_default=True, help="Where the units go.")


@schedule_group.command("install", context_settings={"ignore_unknown_options": True})
@_NAME
@_UNIT_DIR
@click.option("--at", default="03:00", show_default=True, help="Daily time, HH:MM (timer and cron).")
@click.option("--on-calendar", default=None, help="A systemd OnCalendar= expression instead of --at.")
@click.option("--randomized-delay", default="15min", show_default=True,
              help="RandomizedDelaySec= (spreads fleets that share a schedule).")
@click.option("--db", type=click.Path(dir_okay=False), default=None,
              help="FLEETFIX_AUDIT_DB for the scheduled run.")
@click.option("--cron", is_flag=True, help="Print a crontab line instead of installing systemd units.")
@click.option("--dry-run", is_flag=True, help="Print the units; write nothing.")
@click.argument("audit_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- AUDIT OPTIONS]")
@handle_errors
def schedule_install(name: str, unit_dir: str, at: str, on_calendar: str | None, randomized_delay: str,
                     db: str | None, cron: bool, dry_run: bool, audit_args: tuple[str, ...]) -> None:
    """Install a systemd timer running `fleetfix audit AUDIT OPTIONS` daily (or print the cron line).

    \b
    Examples:
      fleetfix schedule install --dry-run -- -i /etc/fleetfix/inventory.yaml --policy policy.yaml
      fleetfix schedule install --at 02:30 -- -i /etc/fleetfix/inventory.yaml \\
          --prometheus /var/lib/prometheus/node-exporter/fleetfix.prom
      fleetfix schedule install --cron -- -i /etc/fleetfix/inventory.yaml
    """
    from fleetfix.audit import schedule

    spec = _spec(name, at, on_calendar, randomized_delay, audit_args, db)
    if cron:
        click.echo(schedule.cron_line(spec))
        return
    if dry_run:
        for filename, text in schedule.units(spec).items():
            click.echo(f"# {Path(unit_dir) / filename}\n{text}")
        return
    for line in schedule.install(spec, Path(unit_dir)):
        click.echo(line)


@schedule_group.command("show")
@_NAME
@_UNIT_DIR
@handle_errors
def schedule_show(name: str, unit_dir: str) -> None:
    """Print the installed units and, where systemd runs, the timer's next run."""
    from fleetfix.audit import schedule

    click.echo(schedule.show(name, Path(unit_dir)), nl=False)


@schedule_group.command("remove")
@_NAME
@_UNIT_DIR
@handle_errors
def schedule_remove(name: str, unit_dir: str) -> None:
    """Stop and disable the timer and delete both units."""
    from fleetfix.audit import schedule

    for line in schedule.remove(name, Path(unit_dir)):
        click.echo(line)
