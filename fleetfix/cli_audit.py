"""`fleetfix audit` and `fleetfix schedule`: click commands over fleetfix.audit (registered in cli.py).

Exit codes of `fleetfix audit` (also in docs/audit.md): 0 healthy; 3 error-severity findings; 4 a
target unreachable or not probed (wins over 3); 2 bad input (policy, options); 1 anything else failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from fleetfix.cli import RolloutOptions, handle_errors, resolve_targets, rollout_options, targeting_options

DB_HELP = "History database (default: $FLEETFIX_AUDIT_DB, else <state dir>/audit.db)."


def _store(db: str | None) -> Any:
    from fleetfix.audit import AuditStore, default_db_path

    return AuditStore(db or default_db_path())


def _emit(run: Any, *, as_json: bool, html: str | None = None, junit: str | None = None,
          prometheus: str | None = None, verbose: bool = False) -> None:
    from fleetfix.audit import report
    from fleetfix.output import print_json

    if html:
        report.write_atomic(html, report.html_report(run))
    if junit:
        report.write_atomic(junit, report.junit_report(run))
    if prometheus:
        report.write_atomic(prometheus, report.prometheus_report(run))
    if as_json:
        print_json(report.json_report(run))
    else:
        click.echo(report.text_report(run, verbose=verbose), nl=False)


# The usage line says so explicitly: the subcommand is optional (click releases disagree on what to infer).
@click.group("audit", invoke_without_command=True, subcommand_metavar="[COMMAND] [ARGS]...")
@targeting_options
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False), default=None,
              help="Policy YAML (default: the built-in policy; see docs/audit.md).")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help=DB_HELP)
@click.option("--deep", is_flag=True, help="Also import torch and the extensions (slower, touches the GPU).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Write an HTML page.")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML.")
@click.option("--prometheus", type=click.Path(dir_okay=False), default=None,
              help="Write node_exporter textfile metrics (atomically).")
@click.option("--remediate", "remediate_path", metavar="PLAYBOOK", type=click.Path(dir_okay=False),
              default=None, help="After the audit, apply PLAYBOOK to the targets with error findings and "
                                 "re-probe them (recorded as a second run).")
@rollout_options(help_prefix="With --remediate: ")
@click.pass_context
@handle_errors
def audit_group(ctx: click.Context, /, policy_path: str | None, db: str | None, deep: bool, as_json: bool,
                html: str | None, junit: str | None, prometheus: str | None, remediate_path: str | None,
                rollout: RolloutOptions, **opts: Any) -> None:
    """Probe the fleet, judge it by a policy, record it, and report what changed since the last run.

    \b
    Exit codes: 0 healthy, 3 error findings, 4 unreachable targets, 2 bad input.
    Examples:
      fleetfix audit -i inventory.yaml --policy policy.yaml --prometheus /var/lib/prometheus/fleetfix.prom
      fleetfix audit -i inventory.yaml --remediate playbooks/cuda-toolkit.yaml --check
      fleetfix audit history
      fleetfix audit show last --html report.html
      fleetfix audit diff 41 42
    """
    if ctx.invoked_subcommand is not None:
        return
    from fleetfix.audit import load_policy, remediate_audit, run_audit
    from fleetfix.errors import ConfigError
    from fleetfix.fleet import Fleet
    from fleetfix.output import ProbeProgress

    if remediate_path is None and rollout.given():
        raise ConfigError(f"{', '.join(rollout.given())}: these apply options need --remediate PLAYBOOK")
    policy = load_policy(policy_path)
    # Load the playbook and vars before probing anything: a typo fails now, not after the audit.
    playbook = _load_playbook(remediate_path) if remediate_path else None
    variables = rollout.variables()
    targets = resolve_targets(**opts)
    args = {"limit": opts.get("limit"), "inventory": opts.get("inventory"), "host": opts.get("host"),
            "targets": len(targets)}
    if remediate_path:
        args.update(remediate=remediate_path, check=rollout.check)
    with _store(db) as store, Fleet(forks=opts["forks"]) as fleet:
        with ProbeProgress(len(targets), enabled=not as_json) as progress:
            run = run_audit(fleet, targets, policy=policy, store=store, deep=deep,
                            on_progress=progress.advance, args=args)
        final = run
        if playbook is not None and remediate_path is not None:
            apply = _applier(playbook, fleet, variables, rollout, as_json=as_json)
            final = remediate_audit(run, targets, playbook=remediate_path, apply=apply, check=rollout.check,
                                    fleet=fleet, policy=policy, store=store, vars=variables, deep=deep)
    _emit_audit(run, final, as_json=as_json, html=html, junit=junit, prometheus=prometheus)
    sys.exit(final.exit_code)


def _load_playbook(path: str) -> Any:
    from fleetfix.playbook import load_playbook

    return load_playbook(path)


def _applier(playbook: Any, fleet: Any, variables: dict[str, str], rollout: RolloutOptions, *,
             as_json: bool) -> Any:
    """apply(targets): run the playbook on them exactly as `fleetfix apply` would, recorded."""
    from fleetfix.output import step_printer
    from fleetfix.playbook import RunRecorder, run_playbook
    from fleetfix.probing import gather_facts

    # Steps stream on a terminal (like the probe's progress); cron and --json stay quiet.
    on_step = step_printer(verbose=False) if sys.stdout.isatty() and not as_json else None

    def apply(targets: Any) -> Any:
        with RunRecorder(rollout.records_dir()) as recorder:
            return run_playbook(
                playbook, targets, fleet_map=fleet.map,
                facts_for=lambda target, transport: gather_facts(target, transport).model_dump(mode="json"),
                vars=variables, check=rollout.check, recorder=recorder, serial=rollout.serial,
                max_fail_pct=rollout.max_fail, on_step=on_step, snapshots=rollout.snapshot_policy(),
                node_for=fleet.node_transport,
            )

    return apply


def _emit_audit(run: Any, final: Any, *, as_json: bool, html: str | None, junit: str | None,
                prometheus: str | None) -> None:
    """The audit's report; after a re-probing remediation, the files show the state afterwards (what
    monitoring must see), and the terminal/JSON output shows both."""
    from fleetfix.audit import report
    from fleetfix.output import print_json

    if final is run:
        _emit(run, as_json=as_json, html=html, junit=junit, prometheus=prometheus)
        return
    for path, render in ((html, report.html_report), (junit, report.junit_report),
                         (prometheus, report.prometheus_report)):
        if path:
            report.write_atomic(path, render(final))
    if as_json:
        print_json({**report.json_report(final), "audit": report.json_report(run)})
    else:
        click.echo(report.text_report(run), nl=False)
        click.echo()
        click.echo(report.remediation_report(final), nl=False)


@audit_group.command("history")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help=DB_HELP)
@click.option("-n", "--last", "count", type=click.IntRange(1), default=20, show_default=True,
              help="How many runs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def audit_history(db: str | None, count: int, as_json: bool) -> None:
    """List recorded audit runs, newest first."""
    import time

    from fleetfix.output import print_json

    with _store(db) as store:
        runs = store.runs(limit=count)
    if as_json:
        print_json([run.to_json() for run in runs])
        return
    if not runs:
        click.echo("no audit runs recorded")
        return
    click.echo(f"{'RUN':>5}  {'STARTED':<19}  {'STATUS':<10}  {'TARGETS':>7}  {'ERROR':>5}  "
               f"{'UNREACH':>7}  DURATION")
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        duration = "-" if run.duration is None else f"{run.duration:.1f}s"
        click.echo(f"{run.id:>5}  {started:<19}  {run.status:<10}  {run.target_count:>7}  "
                   f"{run.error_count:>5}  {run.unreachable_count:>7}  {duration}")


@audit_group.command("show")
@click.argument("run_ref", metavar="RUN")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help=DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Write an HTML page.")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML.")
@click.option("--prometheus", type=click.Path(dir_okay=False), default=None, help="Write metrics.")
@click.option("--verbose-findings", is_flag=True, help="Also list info findings.")
@handle_errors
def audit_show(run_ref: str, db: str | None, as_json: bool, html: str | None, junit: str | None,
               prometheus: str | None, verbose_findings: bool) -> None:
    """Re-render a recorded run (a number, or `last`), with its drift against the run before it."""
    from fleetfix.audit import load_audit

    with _store(db) as store:
        run = load_audit(store, store.resolve(run_ref))
    _emit(run, as_json=as_json, html=html, junit=junit, prometheus=prometheus, verbose=verbose_findings)


@audit_group.command("diff")
@click.argument("old_ref", metavar="RUN1")
@click.argument("new_ref", metavar="RUN2")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help=DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def audit_diff(old_ref: str, new_ref: str, db: str | None, as_json: bool) -> None:
    """What changed from RUN1 to RUN2: findings new / resolved, targets appeared / vanished / unreachable."""
    from fleetfix.audit.drift import compute_drift
    from fleetfix.audit.report import drift_lines
    from fleetfix.output import print_json

    with _store(db) as store:
        old, new = store.load(store.resolve(old_ref)), store.load(store.resolve(new_ref))
    drift = compute_drift(old, new)
    if as_json:
        print_json(drift.to_json())
    else:
        click.echo("\n".join(drift_lines(drift)))


# ---------------------------------------------------------------- schedule


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
