"""`fleetfix schedule ...`: run `fleetfix audit` nightly, as a systemd service + timer or a cron line.

The audit runs where it was not installed: systemd starts it in `/` with an empty environment. So at
install time every path the audit will read or write is made absolute and checked (an input must exist,
an output's folder must), including the ones left implicit: the inventory ($FLEETFIX_INVENTORY or
./inventory.yaml), the history database and, with --remediate, the run records. A mistake fails now,
not on the first night.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from fleetfix.cli.audit import audit_group
from fleetfix.cli.common import gathered, handle_errors
from fleetfix.errors import ConfigError
from fleetfix.secrets import check_private_file

if TYPE_CHECKING:
    from fleetfix.audit.schedule import InstalledService, ScheduleSpec

# Every path-valued option of `fleetfix audit`, by what must exist when the schedule is installed.
# (tests/unit/audit/test_audit_schedule.py checks that no click.Path option of the audit is left out.)
INPUT_FILES = {"inventory": "inventory", "policy_path": "policy", "remediate_path": "playbook",
               "identity": "SSH key", "var_files": "var file", "wheel_lock": "wheel lock"}
INPUT_DIRS = {"wheelhouses": "wheelhouse"}
OUTPUT_FILES = {"db": "history database", "report_html": "HTML report", "report_junit": "JUnit report",
                "report_prometheus": "Prometheus textfile", "known_hosts": "known_hosts file"}
OUTPUT_DIRS = {"state_dir": "state directory", "wheel_cache": "wheel cache"}


@click.group("schedule")
def schedule_group() -> None:
    """Run `fleetfix audit` nightly: a systemd service + timer, or a cron line."""


def _audit_parser() -> click.Command:
    # A plain command (not the group) with the audit's options: a stray word is an error, not a subcommand.
    return click.Command("audit", params=audit_group.params, add_help_option=False)


def _parse(parser: click.Command, args: Sequence[str]) -> click.Context:
    try:
        return parser.make_context("audit", list(args))
    except click.ClickException as exc:
        raise ConfigError(f"audit options: {exc.format_message()}") from None


def _option_name(param: click.Option) -> str:
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])


def path_problem(kind: str, path: str) -> str | None:
    """Why path cannot serve as a `kind` ("input": a file to read; "output", "output-dir": to be written,
    so its folder must exist), or None. (A file where a directory belongs, and the reverse, click's
    own type checks have refused already.)"""
    where = Path(path)
    if kind == "input":
        return None if where.is_file() else ("not a file" if where.exists() else "no such file")
    if kind == "input-dir":
        return None if where.is_dir() else ("not a folder" if where.exists() else "no such folder")
    return None if where.exists() or where.parent.is_dir() else f"no such folder {where.parent}"


def _kind(name: str) -> tuple[str, str] | None:
    for kind, names in (("input", INPUT_FILES), ("input-dir", INPUT_DIRS), ("output", OUTPUT_FILES),
                        ("output-dir", OUTPUT_DIRS)):
        if name in names:
            return kind, names[name]
    return None


def _absolute(path: str, cwd: Path) -> str:
    return os.path.normpath(cwd / os.path.expanduser(path))


def is_url(value: object) -> bool:
    from fleetfix.audit.backend import is_url as url

    return url(value)


def check_url(url: str) -> None:
    from fleetfix.audit.backend import check_url as check

    check(url)


def pin_audit_args(audit_args: Sequence[str], cwd: Path) -> list[str]:
    """The audit options as the scheduled run must get them: parsed with the audit's own parser (a typo
    fails now), every path absolute and checked, the implicit inventory and run-record folder named.
    ConfigError names the first problem."""
    from fleetfix.inventory.load import resolve_inventory_path
    from fleetfix.paths import default_state_dir, group_id
    from fleetfix.reports import FORMATS

    parser = _audit_parser()
    ctx = _parse(parser, audit_args)
    argv: list[str] = []
    expected: dict[str, Any] = dict(ctx.params)
    for param in parser.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        value, option = ctx.params[param.name], _option_name(param)
        kind = _kind(param.name)
        if param.name == "db" and is_url(value):  # a PostgreSQL history: no path; never a password
            check_url(value)
            kind = None
        if kind is not None:
            pinned = [_absolute(str(item), cwd) for item in (value if param.multiple else [value])]
            for path in pinned:
                problem = path_problem(kind[0], path)
                if problem:
                    raise ConfigError(f"audit option {option} ({kind[1]}): {path}: {problem}")
            value = expected[param.name] = tuple(pinned) if param.multiple else pinned[0]
        if param.is_flag:  # the audit's flags are on/off switches (the round trip below checks it)
            if value:
                argv.append(option)
            elif param.secondary_opts:
                argv.append(param.secondary_opts[0])
        elif param.multiple:
            for item in value:
                argv += [option, str(item)]
        else:
            argv += [option, str(value)]
    given = {name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}
    for report_format in FORMATS:  # a group that does not exist here would fail tonight
        group = ctx.params.get(f"report_{report_format.name}_group")
        if report_format.group and group:
            option = f"audit option --{report_format.name}-group"
            if not ctx.params.get(f"report_{report_format.name}"):
                raise ConfigError(f"{option} {group}: needs --{report_format.name} FILE")
            group_id(group, option)
    if not {"inventory", "host"} & given:
        # What the audit would read now ($FLEETFIX_INVENTORY, else ./inventory.yaml), which neither the
        # unit's environment nor its working directory would give it.
        expected["inventory"] = str(resolve_inventory_path(None).resolve())
        argv += ["--inventory", expected["inventory"]]
    if "remediate_path" in given and "state_dir" not in given:
        # The apply's run records (`fleetfix runs show`): where this user finds them now.
        expected["state_dir"] = _absolute(str(default_state_dir()), cwd)
        argv += ["--state-dir", expected["state_dir"]]
    if "policy_path" in given:
        from fleetfix.audit.policy import load_policy

        # A policy (its notify: section too) that would refuse to load tonight is refused now.
        load_policy(expected["policy_path"])
    if _parse(parser, argv).params != expected:  # the rebuilt line must mean what was given
        raise AssertionError(f"audit options {list(audit_args)} rebuilt as {argv} mean something else")
    return argv


@dataclass(frozen=True)
class _Schedule:
    """install's options that make the units (the rest say where they go, or print them)."""

    name: str
    at: str
    on_calendar: str | None
    randomized_delay: str
    timeout: str
    db: str | None
    env_file: str | None


def _spec(asked: _Schedule, audit_args: tuple[str, ...]) -> ScheduleSpec:
    from fleetfix.audit.schedule import ScheduleRequest, ScheduleSpec
    from fleetfix.audit.store import default_db_path

    db, env_file = asked.db, asked.env_file

    cwd = Path.cwd()
    pinned = pin_audit_args(audit_args, cwd)
    if db is not None and is_url(db):
        check_url(db)  # a password only as a reference: never in the unit file
    elif db is not None:
        db = _absolute(db, cwd)
        problem = path_problem("output", db)
        if problem:
            raise ConfigError(f"--db (history database): {db}: {problem}")
    elif "--db" not in pinned:
        db = _absolute(str(default_db_path()), cwd)  # the history `fleetfix audit history` shows now
    if env_file is not None:
        env_file = _absolute(env_file, cwd)
        problem = path_problem("input", env_file)
        if problem:
            raise ConfigError(f"--env-file: {env_file}: {problem}")
        check_private_file(env_file, "--env-file")
    return ScheduleSpec.build(ScheduleRequest(
        name=asked.name, at=asked.at, on_calendar=asked.on_calendar, randomized_delay=asked.randomized_delay,
        audit_args=pinned, db=db, working_directory=str(cwd), timeout=asked.timeout, env_file=env_file))


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
@click.option("--timeout", default="3h", show_default=True,
              help="Stop an audit still running after this long (TimeoutStartSec=; `timeout` in cron).")
@click.option("--db", type=click.Path(dir_okay=False), default=None,
              help="FLEETFIX_AUDIT_DB for the scheduled run (default: the database the audit uses now).")
@click.option("--env-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="NAME=value lines (mode 0600) the scheduled run gets as its environment "
                   "(EnvironmentFile=): where `--var NAME=@env:X` secrets come from. Not with --cron.")
@click.option("--cron", is_flag=True, help="Print a crontab line instead of installing systemd units.")
@click.option("--dry-run", is_flag=True, help="Print the units; write nothing.")
@click.argument("audit_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- AUDIT OPTIONS]")
@handle_errors
@gathered("asked", _Schedule)
def schedule_install(asked: _Schedule, unit_dir: str, cron: bool, dry_run: bool,
                     audit_args: tuple[str, ...]) -> None:
    """Install a systemd timer running `fleetfix audit AUDIT OPTIONS` daily (or print the cron line).

    Every path in AUDIT OPTIONS is made absolute and checked now (an input must exist, an output's
    folder must); the unit runs in the current directory.

    \b
    Examples:
      fleetfix schedule install --dry-run -- -i /etc/fleetfix/inventory.yaml --policy policy.yaml
      fleetfix schedule install --at 02:30 -- -i /etc/fleetfix/inventory.yaml \\
          --prometheus /var/lib/prometheus/node-exporter/fleetfix.prom
      fleetfix schedule install --cron -- -i /etc/fleetfix/inventory.yaml
    """
    from fleetfix.audit import schedule

    if cron and asked.env_file:
        raise ConfigError("--env-file is for the systemd unit: a crontab line has no environment file; give "
                          "the secrets as @file:PATH references instead")
    spec = _spec(asked, audit_args)
    if cron:
        click.echo(schedule.cron_line(spec))
        return
    if dry_run:
        for filename, text in schedule.units(spec).items():
            click.echo(f"# {Path(unit_dir) / filename}\n{text}")
        return
    for line in schedule.install(spec, Path(unit_dir)):
        click.echo(line)


def _what_runs(service: InstalledService) -> list[str]:
    """`schedule show`'s first lines: the command as one sh line, and whatever would fail tonight."""
    lines = [f"# what runs (from {service.path}):", service.command_line()]
    if service.timeout:
        lines.append(f"# stopped after {service.timeout} (TimeoutStartSec=)")
    audit_args = service.audit_args
    if audit_args is not None:
        cwd = Path(service.working_directory or "/")
        try:
            pin_audit_args(audit_args, cwd)
        except ConfigError as exc:
            lines.append(f"# warning: it would fail: {exc}")
    return [*lines, ""]


@schedule_group.command("show")
@_NAME
@_UNIT_DIR
@handle_errors
def schedule_show(name: str, unit_dir: str) -> None:
    """Print what the scheduled audit runs (as one command line, with any path that no longer
    exists), the installed units and, where systemd runs, the timer's next run."""
    from fleetfix.audit import schedule

    shown = schedule.show(name, Path(unit_dir))
    service = schedule.installed_service(name, Path(unit_dir))
    if service is not None:
        click.echo("\n".join(_what_runs(service)))
    click.echo(shown, nl=False)


@schedule_group.command("remove")
@_NAME
@_UNIT_DIR
@handle_errors
def schedule_remove(name: str, unit_dir: str) -> None:
    """Stop and disable the timer and delete both units."""
    from fleetfix.audit import schedule

    for line in schedule.remove(name, Path(unit_dir)):
        click.echo(line)
