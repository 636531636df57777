"""`fleetfix audit`: probe the fleet, judge it by a policy, record it in the history, report drift.

Exit codes (also in docs/audit.md): 0 healthy; 3 error-severity findings; 4 a target unreachable or not
probed (wins over 3); 2 bad input (policy, options); 1 anything else failed.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleetfix.cli.apply import roll_out
from fleetfix.cli.common import (
    FleetOptions,
    ReportChoice,
    RolloutOptions,
    gathered,
    handle_errors,
    report_options,
    resolve,
    rollout_options,
    targeting_options,
)
from fleetfix.errors import ConfigError, ExitCode
from fleetfix.inventory.request import TargetRequest

if TYPE_CHECKING:
    from fleetfix.audit import AuditRun, AuditStore
    from fleetfix.audit.notify import NotifyConfig

DB_HELP = ("History database: an SQLite file, or postgresql://USER@HOST[:PORT]/DB[?password=@env:NAME] "
           "(needs fleetfix[postgres]; default: $FLEETFIX_AUDIT_DB, else <state dir>/audit.db).")
_DB = click.option("--db", type=click.Path(dir_okay=False), default=None, help=DB_HELP)
_SITE_FILTER = click.option("--site", default=None, metavar="SITE",
                            help="Only the runs of this site (default: every site).")


def _store(db: str | None, *, readonly: bool = False) -> AuditStore:
    from fleetfix.audit import AuditStore
    from fleetfix.audit.store import default_db

    return AuditStore(default_db(db), readonly=readonly)


@dataclass(frozen=True)
class _AuditChoice:
    """The audit's own options: its policy, its history, deep probes, and the playbook that remediates."""

    policy_path: str | None
    db: str | None
    deep: bool
    remediate_path: str | None
    site: str | None
    controller: str | None


# The usage line says so explicitly: the subcommand is optional (click releases disagree on what to infer).
@click.group("audit", invoke_without_command=True, subcommand_metavar="[COMMAND] [ARGS]...")
@targeting_options
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False), default=None,
              help="Policy YAML (default: the built-in policy; see docs/audit.md).")
@_DB
@click.option("--deep", is_flag=True, help="Also import torch and the extensions (slower, touches the GPU).")
@click.option("--site", default=None, metavar="SITE",
              help="The site this audit covers, recorded with its run: drift compares only runs of the same "
                   "site (default: $FLEETFIX_AUDIT_SITE, else 'default').")
@click.option("--controller", default=None, metavar="NAME",
              help="Who runs the audit, recorded with its run (default: $FLEETFIX_AUDIT_CONTROLLER, else "
                   "this machine's host name).")
@report_options("audit")
@click.option("--remediate", "remediate_path", metavar="PLAYBOOK", type=click.Path(dir_okay=False),
              default=None, help="After the audit, apply PLAYBOOK to the targets with error findings and "
                                 "re-probe them (recorded as a second run).")
@rollout_options(help_prefix="With --remediate: ")
@click.pass_context
@handle_errors
@gathered("choice", _AuditChoice)
def audit_group(ctx: click.Context, /, choice: _AuditChoice, report: ReportChoice, rollout: RolloutOptions,
                targets: TargetRequest, fleet_options: FleetOptions) -> ExitCode | None:
    """Probe the fleet, judge it by a policy, record it, and report what changed since the last run.

    \b
    Exit codes: 0 healthy, 3 error findings, 4 unreachable targets, 2 bad input.
    Examples:
      fleetfix audit -i inventory.yaml --policy policy.yaml \\
          --prometheus /var/lib/prometheus/node-exporter/fleetfix.prom --prometheus-group prometheus
      fleetfix audit -i inventory.yaml --remediate playbooks/cuda-toolkit.yaml --check
      fleetfix audit history
      fleetfix audit show last --html report.html
      fleetfix audit diff 41 42
      fleetfix audit prune --keep-days 90
    """
    if ctx.invoked_subcommand is not None:
        return None
    from fleetfix.audit import (
        Auditor,
        AuditStore,
        RemediatedAudit,
        Remedy,
        load_policy,
        remediate_audit,
        run_audit,
    )
    from fleetfix.audit.lock import exclusive_audit
    from fleetfix.cli.progress import ProbeProgress
    from fleetfix.playbook import load_playbook

    policy_path, db, deep, remediate_path = choice.policy_path, choice.db, choice.deep, choice.remediate_path
    if remediate_path is None and rollout.given():
        raise ConfigError(f"{', '.join(rollout.given())}: these apply options need --remediate PLAYBOOK")
    report.file_groups()  # --prometheus-group: a group the file cannot get fails now, not after the audit
    policy = load_policy(policy_path)
    # Load the playbook and vars before probing anything: a typo fails now, not after the audit.
    playbook = load_playbook(remediate_path) if remediate_path else None
    from fleetfix.secrets import mask_vars

    variables, secrets = rollout.secret_vars()
    resolved = resolve(targets).targets
    args = {"limit": targets.limit, "inventory": targets.inventory, "host": targets.host,
            "targets": len(resolved)}
    if remediate_path:
        args.update(remediate=remediate_path, check=rollout.check)
    from fleetfix.audit.store import default_db

    history = default_db(db)
    # One audit per history (an SQLite file: fleetfix.audit.lock) or per site of a shared PostgreSQL
    # history (AuditStore.audit_lock) at a time: a second one exits instead of interleaving.
    file_lock = exclusive_audit(history) if isinstance(history, Path) else contextlib.nullcontext()
    with (file_lock, AuditStore(history, site=choice.site, controller=choice.controller) as store,
          store.audit_lock(), fleet_options.open() as fleet):
        fleet.start_connecting(resolved)  # the handshakes overlap the rest of the set-up
        with ProbeProgress(len(resolved), enabled=not report.as_json) as progress:
            # A remediation records the audit's results again (its re-probe run): with their facts.
            run = run_audit(fleet, resolved, policy=policy, store=store, deep=deep,
                            on_progress=lambda done: progress.advance(done.target), args=args,
                            facts=True if playbook is not None else report.facts)
        # What the audit found, before any remediation changes it; the re-probe run's args are the audit
        # run's as started, without this run's notification.
        shown = run if policy.notify is None else _notified(policy.notify, run, store)
        if playbook is None or remediate_path is None:
            report.emit(shown)
            return shown.exit_code
        # Steps stream on a terminal (like the probe's progress); cron and --json stay quiet.
        show_steps = sys.stdout.isatty() and not report.as_json
        remedy = Remedy(
            remediate_path, check=rollout.check, vars=mask_vars(variables, secrets),  # only recorded: masked
            apply=lambda chosen: roll_out(playbook, chosen, fleet, rollout, show_steps=show_steps,
                                          live_output=False))
        final = remediate_audit(run, resolved, remedy, Auditor(fleet, policy, store, deep))
        result = shown if final is run else RemediatedAudit(shown, final)
        report.emit(result)  # under the lock too: the report files are this run's
    return result.exit_code


def _notified(config: NotifyConfig, run: AuditRun, store: AuditStore) -> AuditRun:
    """The run after its notification (recorded in it). A failed channel is one line on stderr; the
    exit code stays the findings' (docs/audit.md, "Notifications")."""
    import dataclasses

    from fleetfix.audit.notify import notify_run
    from fleetfix.terminal import safe_line

    outcome = notify_run(config, run.run, run.drift, store)
    if outcome is None:
        return run
    if outcome.failures:
        click.echo(f"fleetfix: warning: {safe_line(outcome.line())} (audit run {run.info.id} is recorded)",
                   err=True)
    info = dataclasses.replace(run.info, args={**run.info.args, "notification": outcome.to_json()})
    return dataclasses.replace(run, run=dataclasses.replace(run.run, info=info))


@audit_group.command("history")
@_DB
@_SITE_FILTER
@click.option("-n", "--last", "count", type=click.IntRange(1, 1_000_000), default=20, show_default=True,
              help="How many runs.")
@report_options("audit-history")
@handle_errors
def audit_history(db: str | None, site: str | None, count: int, report: ReportChoice) -> None:
    """List recorded audit runs, newest first (of every site, or of --site)."""
    from fleetfix.audit import AuditHistory

    with _store(db, readonly=True) as store:
        history = AuditHistory(store.runs(limit=count, site=site))
    report.emit(history)


@audit_group.command("show")
@click.argument("run_ref", metavar="RUN")
@_DB
@_SITE_FILTER
@report_options("audit")
@click.option("--verbose-findings", is_flag=True, help="Also list info findings.")
@handle_errors
def audit_show(run_ref: str, db: str | None, site: str | None, report: ReportChoice,
               verbose_findings: bool) -> None:
    """Re-render a recorded run (a number, or `last`: of --site if given), with its drift against the
    run of its own site before it. `last` of a history of several sites, without --site: the HTML page
    shows the newest run of every site, each with its own drift and trend."""
    import dataclasses

    from fleetfix.audit import load_audit

    with _store(db, readonly=True) as store:
        run = load_audit(store, store.resolve(run_ref, site=site), facts=report.facts)
        if site is None and run_ref in ("last", "latest") and any(f.name == "html" for f, _ in report.files):
            newest = store.newest_per_site()
            if len(newest) > 1:
                run = dataclasses.replace(run, sites=tuple(
                    run if run_id == run.info.id else load_audit(store, run_id, facts=report.facts)
                    for run_id in newest))
    report.emit(run, verbose=verbose_findings)


@audit_group.command("diff")
@click.argument("old_ref", metavar="RUN1")
@click.argument("new_ref", metavar="RUN2")
@_DB
@_SITE_FILTER
@report_options("audit-diff")
@handle_errors
def audit_diff(old_ref: str, new_ref: str, db: str | None, site: str | None, report: ReportChoice) -> None:
    """What changed from RUN1 to RUN2: findings new / resolved, targets appeared / vanished / unreachable."""
    from fleetfix.audit.drift import compute_drift

    with _store(db, readonly=True) as store:
        # Drift compares findings and reachability, not facts, which are most of a large run's bytes
        # (docs/performance.md). It reads a target's facts only where a policy change may explain an
        # EXTENSION_MISSING change (store.facts_of), so it is computed while the store is open.
        old = store.load(store.resolve(old_ref, site=site), facts=False)
        new = store.load(store.resolve(new_ref, site=site), facts=False)
        drift = compute_drift(old, new, facts_of=store.facts_of)
    report.emit(drift)


def _at_least_one_day(_ctx: click.Context, _param: click.Parameter, days: float) -> float:
    # Said in the user's own number: click.FloatRange would print 0 as "0.0 is not in the range x>=1".
    if not days >= 1:  # also NaN
        raise click.BadParameter(f"{days:g} is less than one day")
    return days


@audit_group.command("prune")
@_DB
@click.option("--keep-days", type=float, callback=_at_least_one_day, required=True, metavar="DAYS",
              help="Keep the results of the runs of the last DAYS days (at least 1).")
@click.option("--vacuum", is_flag=True, help="Then give the freed space back to the file system (rewrites "
                                              "the database; without it, SQLite reuses the space).")
@handle_errors
def audit_prune(db: str | None, keep_days: float, vacuum: bool) -> None:
    """Delete the results of older runs; their summaries stay in `audit history`.

    \b
    Kept whatever their age: each target's newest result, newest probed result and newest result in a
    complete run (drift, since-when and staleness go on from these), and the newest complete run.
    Example (nightly, after the audit):
      fleetfix audit prune --keep-days 90
    """
    from fleetfix.audit import AuditStore
    from fleetfix.audit.lock import exclusive_audit
    from fleetfix.audit.store import default_db

    history = default_db(db)
    if isinstance(history, Path) and not history.is_file():
        raise ConfigError("no audit database here (a typo in --db?)", path=str(history))
    # SQLite: under the audit lock, as an audit running now would otherwise lose the baseline it is
    # comparing with. PostgreSQL: audits of other sites go on; prune's one transaction keeps what each
    # target's next result goes on from (its newest results) and never touches a site's newest run on.
    file_lock = exclusive_audit(history) if isinstance(history, Path) else contextlib.nullcontext()
    with file_lock, AuditStore(history, create=False) as store:
        pruned = store.prune(keep_days=keep_days)
        if vacuum:
            store.vacuum()
    click.echo(f"pruned {pruned.results} result(s) of {pruned.runs} run(s) older than {keep_days:g} days "
               f"({pruned.states} target state(s), {pruned.blobs} document(s) no longer used)"
               + ("; database vacuumed" if vacuum else ""))


@audit_group.command("migrate")
@_DB
@handle_errors
def audit_migrate(db: str | None) -> None:
    """Upgrade the history's schema to this fleetfix's (an older one is refused until then).

    \b
    Back the database up first; each version's step is one transaction. With several controllers on one
    PostgreSQL history, upgrade fleetfix on all of them and run this once.
    """
    from fleetfix.audit import AuditStore
    from fleetfix.audit.lock import exclusive_audit
    from fleetfix.audit.store import default_db

    history = default_db(db)
    if isinstance(history, Path) and not history.is_file():
        raise ConfigError("no audit database here (a typo in --db?)", path=str(history))
    file_lock = exclusive_audit(history) if isinstance(history, Path) else contextlib.nullcontext()
    with file_lock, AuditStore(history, migrate=True) as store:
        found, current = store.migrated_from, store.schema_version
    if found == current:
        click.echo(f"audit database schema v{current}: up to date")
    else:
        click.echo(f"audit database schema upgraded from v{found} to v{current}")
