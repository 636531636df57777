"""The command line: the only module that imports click and prints. Everything below returns data.

Exit codes (also in docs/cli.md):
  0  success / healthy          2  bad input (inventory, playbook, options)
  1  a command or step failed   3  probe/audit found error-severity findings
  4  a target was unreachable   130 interrupted
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from fleetfix import __version__
from fleetfix.errors import ConfigError, FleetfixError

if TYPE_CHECKING:
    from fleetfix.snapshots import SnapshotPolicy
    from fleetfix.target import Target

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_FINDINGS, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

F = TypeVar("F", bound=Callable[..., Any])


def targeting_options(func: F) -> F:
    """The options every fleet command shares, in one place so names stay consistent."""
    options = [
        click.option("-i", "--inventory", metavar="FILE",
                     help="Inventory YAML (default: $FLEETFIX_INVENTORY, else ./inventory.yaml)."),
        click.option("-l", "--limit", metavar="PATTERN",
                     help="Select targets: name, glob, group, tag:T, node:N; '!' excludes; comma-separated."),
        click.option("--host", metavar="ADDR", help="Ad-hoc node address instead of an inventory."),
        click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True,
                     help="SSH port (with --host)."),
        click.option("--user", default="root", show_default=True, help="SSH user (with --host)."),
        click.option("--identity", metavar="FILE", help="SSH private key (with --host)."),
        click.option("--known-hosts", metavar="FILE", help="known_hosts file (default ~/.ssh/known_hosts)."),
        click.option("--accept-new", is_flag=True,
                     help="Record unknown host keys (never accepts a changed key)."),
        click.option("--ct", "ctids", type=click.IntRange(1, 999_999_999), multiple=True, metavar="CTID",
                     help="Container on --host (repeatable). Without it, the node itself."),
        click.option("--connect-timeout", type=click.FloatRange(0.1), default=10.0, show_default=True,
                     help="Seconds to wait for an SSH connection."),
        # fleet.DEFAULT_FORKS, spelled out: importing fleetfix.fleet here would slow down `--help`.
        click.option("--forks", type=click.IntRange(1, 1000), default=32, show_default=True,
                     help="Nodes worked on at once."),
        click.option("--refresh", is_flag=True, help="Bypass the Proxmox discovery cache."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def local_option(func: F) -> F:
    """`--local`: this machine as the one target, no SSH (probe, exec, apply)."""
    return click.option("--local", is_flag=True,
                        help="Act on this machine, no SSH (not with -i/--inventory or --host).")(func)


@dataclass(frozen=True)
class RolloutOptions:
    """How a playbook is rolled out: the options `apply` and `audit --remediate` share.

    Declared once (`rollout_options`) and interpreted once (the methods below), so the two commands
    cannot drift apart in names or meaning.
    """

    var_items: tuple[str, ...] = ()
    check: bool = False
    serial: int | None = None
    max_fail: float | None = None
    state_dir: str | None = None
    snapshot: bool = False
    rollback_on_failure: bool = False
    keep_snapshots: int | None = None
    allow_no_snapshot: bool = False

    def given(self) -> list[str]:
        """The options set on the command line, by their option names (for error messages)."""
        return [_ROLLOUT_FLAGS[f.name] for f in fields(self) if _is_set(getattr(self, f.name))]

    def variables(self) -> dict[str, str]:
        return parse_var(self.var_items)

    def snapshot_policy(self) -> SnapshotPolicy:
        from fleetfix.snapshots import SnapshotPolicy

        return SnapshotPolicy(
            take=self.snapshot or self.rollback_on_failure or self.keep_snapshots is not None,
            rollback_on_failure=self.rollback_on_failure, keep=self.keep_snapshots,
            allow_no_snapshot=self.allow_no_snapshot,
        )

    def records_dir(self) -> str | Path:
        from fleetfix.playbook import default_state_dir

        return self.state_dir or default_state_dir()


def _is_set(value: object) -> bool:
    # Not `value in (None, False, ())`: --max-fail 0 is set, and 0.0 == False.
    return value is not None and value is not False and value != ()


_ROLLOUT_FLAGS = {
    "var_items": "--var", "check": "--check", "serial": "--serial", "max_fail": "--max-fail",
    "state_dir": "--state-dir", "snapshot": "--snapshot", "rollback_on_failure": "--rollback-on-failure",
    "keep_snapshots": "--keep-snapshots", "allow_no_snapshot": "--allow-no-snapshot",
}


def _rollout_click_options(help_prefix: str) -> list[Callable[[F], F]]:
    def text(help_text: str) -> str:  # "With --remediate: set a ..." reads as one sentence
        return help_prefix + help_text[0].lower() + help_text[1:] if help_prefix else help_text

    return [
        click.option("--var", "var_items", multiple=True, metavar="NAME=VALUE",
                     help=text("Set a playbook var (repeatable).")),
        click.option("--check", is_flag=True,
                     help=text("Run only `when` and `check`: report what would change, change nothing.")),
        click.option("--serial", type=click.IntRange(1), default=None,
                     help=text("Roll out in batches of N targets.")),
        click.option("--max-fail", "max_fail", type=click.FloatRange(0, 100), default=None, metavar="PCT",
                     help=text("Stop starting new batches once more than PCT% of targets failed.")),
        click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                     help=text("Where run records go (default: $FLEETFIX_STATE_DIR or "
                               "~/.local/state/fleetfix).")),
        click.option("--snapshot", is_flag=True,
                     help=text("`pct snapshot` each container before its first change (never in --check "
                               "mode).")),
        click.option("--rollback-on-failure", is_flag=True,
                     help=text("`pct rollback` a container whose apply failed (implies --snapshot).")),
        click.option("--keep-snapshots", type=click.IntRange(1), default=None, metavar="N",
                     help=text("Keep only the N newest fleetfix-* snapshots per container (implies "
                               "--snapshot).")),
        click.option("--allow-no-snapshot", is_flag=True,
                     help=text("Change containers whose storage cannot snapshot (and nodes) anyway.")),
    ]


def rollout_options(help_prefix: str = "") -> Callable[[F], F]:
    """Add the rollout options to a command; it receives them as one `rollout: RolloutOptions` argument.
    help_prefix (e.g. "With --remediate: ") is put in front of every help text."""

    def decorate(func: F) -> F:
        names = [f.name for f in fields(RolloutOptions)]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rollout = RolloutOptions(**{name: kwargs.pop(name) for name in names})
            return func(*args, rollout=rollout, **kwargs)

        decorated = cast(F, wrapper)
        for option in reversed(_rollout_click_options(help_prefix)):
            decorated = option(decorated)
        return decorated

    return decorate


def check_local_alone(*, local: bool = False, inventory: str | None = None, host: str | None = None,
                      **_: Any) -> None:
    """--local names the one target; -i or --host besides it would be silently ignored: refuse instead."""
    if local and (inventory or host):
        clashing = (("-i/--inventory", inventory), ("--host", host))
        given = " and ".join(flag for flag, value in clashing if value)
        raise ConfigError(f"--local cannot be combined with {given}: --local acts on this machine only")


def resolve_targets(
    *, inventory: str | None, limit: str | None, host: str | None, port: int, user: str,
    identity: str | None, known_hosts: str | None, accept_new: bool, ctids: Sequence[int],
    connect_timeout: float, local: bool = False, refresh: bool = False,
    skipped: list[tuple[str, str]] | None = None, **_: Any,
) -> list[Any]:
    """The targets a command acts on. Discovery's skipped containers are appended to `skipped`."""
    from fleetfix.discovery import Discoverer
    from fleetfix.inventory import adhoc_targets, load_inventory, local_target, resolve_inventory_path
    from fleetfix.selection import select

    check_local_alone(local=local, inventory=inventory, host=host)
    if local:
        targets = [local_target()]
    elif host:
        targets = adhoc_targets(
            host, port=port, user=user, identity_file=identity, known_hosts=known_hosts,
            accept_new=accept_new, ctids=ctids, connect_timeout=connect_timeout,
        )
    else:
        loaded = load_inventory(resolve_inventory_path(inventory), discover=Discoverer(refresh=refresh))
        for warning in loaded.warnings:
            click.echo(f"fleetfix: warning: {warning}", err=True)
        if skipped is not None:
            skipped.extend(loaded.skipped)
        targets = list(loaded.targets)
        if accept_new or known_hosts:
            targets = [_override_ssh(t, accept_new=accept_new, known_hosts=known_hosts) for t in targets]
    return select(targets, limit)


def _override_ssh(target: Any, *, accept_new: bool, known_hosts: str | None) -> Any:
    import dataclasses

    ssh = target.node.ssh
    if ssh is None:
        return target
    changes: dict[str, Any] = {"accept_new": accept_new or ssh.accept_new}
    if known_hosts:
        changes["known_hosts"] = known_hosts
    node = dataclasses.replace(target.node, ssh=dataclasses.replace(ssh, **changes))
    return dataclasses.replace(target, node=node)


class InterruptState:
    """How many Ctrl-Cs (SIGINT) arrived while a command ran."""

    def __init__(self) -> None:
        self.count = 0

    @property
    def interrupted(self) -> bool:
        return self.count > 0


def _say(message: str) -> None:
    # os.write, not click.echo: this runs in a signal handler, possibly in the middle of another write to
    # a buffered stream, which Python refuses to re-enter.
    os.write(2, (message + "\n").encode())


@contextlib.contextmanager
def graceful_interrupts() -> Iterator[InterruptState]:
    """Ctrl-C while a command runs.

    First: if a Fleet is working, it starts no more targets and lets the ones in flight finish (or time
    out), so the command still writes its records and prints its recap; the command then exits 130. With
    no Fleet open there is nothing to finish: KeyboardInterrupt, exit 130.
    Second: abort at once (os._exit). Records stay consistent without any clean-up: run records are
    append-only and fsync'ed per event, and audit results are one SQLite transaction each, so a run
    without its end event reads back as incomplete.
    """
    state = InterruptState()
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield state
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        state.count += 1
        if state.count > 1:
            _say("fleetfix: aborted (second Ctrl-C)")
            os._exit(EXIT_INTERRUPTED)
        fleet_module = sys.modules.get("fleetfix.fleet")  # not imported: no Fleet can be working
        if fleet_module is not None and fleet_module.interrupt_all():
            _say("fleetfix: interrupted: starting no new targets, waiting for the ones in flight "
                 "(Ctrl-C again to abort now)")
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def handle_errors(func: F) -> F:
    """Expected failures become one line on stderr and their exit code; -v keeps the traceback.
    Ctrl-C is handled as `graceful_interrupts` says: exit 130 once the command has wrapped up."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with graceful_interrupts() as interrupts:
            try:
                result = func(*args, **kwargs)
            except FleetfixError as exc:
                if click.get_current_context().find_root().params.get("verbose"):
                    raise
                from fleetfix.output import with_hint

                click.echo(f"fleetfix: error: {with_hint(str(exc), exc)}", err=True)
                sys.exit(EXIT_INTERRUPTED if interrupts.interrupted else exc.exit_code)
            except KeyboardInterrupt:
                click.echo("fleetfix: interrupted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            except SystemExit:
                if not interrupts.interrupted:
                    raise
                result = None
            if interrupts.interrupted:  # the command wrapped up after a Ctrl-C: say so in the exit code
                click.echo("fleetfix: interrupted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            return result

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fleetfix")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and live output.")
def main(verbose: bool) -> None:
    """Find and fix broken GPU software stacks across Proxmox VE nodes and their LXC containers.

    \b
    Examples:
      fleetfix probe --local
      fleetfix probe --host 10.1.2.6 --ct 200
      fleetfix apply playbooks/cuda-toolkit.yaml --check
    """


@main.command("exec", context_settings={"ignore_unknown_options": True})
@targeting_options
@local_option
@click.option("--timeout", type=click.FloatRange(0.1), default=None, help="Per-target command timeout (s).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_command(command: tuple[str, ...], timeout: float | None, as_json: bool, **opts: Any) -> None:
    """Run a command on targets; its arguments reach the remote side verbatim.

    Each target's stdout is printed when it finishes, under a `== TARGET exit N` line; its stderr goes
    to stderr as it arrives (as `TARGET ! line` when there are several targets), with secret-named vars
    masked. Pipe stdout, watch stderr.

    \b
    Examples:
      fleetfix exec --host 10.1.2.6 --ct 200 -- cat /etc/os-release
      fleetfix exec --local -- nvcc --version
    """
    from fleetfix.fleet import Fleet
    from fleetfix.output import LiveOutput, err_console, render_exec
    from fleetfix.playbook.records import Redactor, secret_values
    from fleetfix.transport.base import CommandResult, Transport

    targets = resolve_targets(**opts)
    # --json carries stderr in its records: streaming it as well would only print it twice.
    live: LiveOutput | None = None
    if not as_json:
        redactor = Redactor()
        for target in targets:
            redactor.add(secret_values(target.vars))
        # One target: its stderr lines as the command wrote them (as over plain ssh); several: labelled.
        live = LiveOutput(err_console, redact=redactor.text, labelled=len(targets) > 1)

    def run(target: Target, transport: Transport) -> CommandResult:
        if live is None:
            return transport.execute(command, timeout=timeout)
        stream_stderr = live.sink_for(target.name, streams=("stderr",))
        try:
            return transport.execute(command, timeout=timeout, on_output=stream_stderr)
        finally:
            live.flush(target.name)  # a last line without its newline

    with Fleet(forks=opts["forks"]) as fleet:
        outcomes = fleet.map(targets, run)
    render_exec(outcomes, as_json=as_json, stderr_streamed=live is not None)
    if any(o.status == "unreachable" for o in outcomes):
        sys.exit(EXIT_UNREACHABLE)
    if any(o.value is None or not o.value.ok for o in outcomes):
        sys.exit(EXIT_FAILED)


@main.group("inventory")
def inventory_group() -> None:
    """Inspect the inventory."""


@inventory_group.command("list")
@targeting_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def inventory_list(as_json: bool, **opts: Any) -> None:
    """List the resolved targets, with their node, vars, tags and groups.

    \b
    Example:
      fleetfix inventory list -i inventory.yaml --limit tag:training
    """
    from fleetfix.output import render_targets

    skipped: list[tuple[str, str]] = []
    render_targets(resolve_targets(skipped=skipped, **opts), skipped=skipped, as_json=as_json)


@main.command("probe")
@targeting_options
@local_option
@click.option("--deep", is_flag=True, help="Also import torch and the extensions (slower, touches the GPU).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def probe_command(local: bool, deep: bool, as_json: bool, **opts: Any) -> None:
    """Gather every fact in one round trip per target and name the root cause, with its fix.

    \b
    Examples:
      fleetfix probe --local
      fleetfix probe --host 10.1.2.6 --ct 200 --ct 201
      fleetfix probe -i inventory.yaml --limit 'tag:gpu' --json
    """
    from fleetfix.fleet import Fleet
    from fleetfix.output import ProbeProgress, render_probe
    from fleetfix.probing import probe_targets

    targets = resolve_targets(local=local, **opts)
    with Fleet(forks=opts["forks"]) as fleet, ProbeProgress(len(targets), enabled=not as_json) as progress:
        reports = probe_targets(fleet, targets, deep=deep, on_done=progress.advance)
    render_probe(reports, as_json=as_json)
    if any(r.status != "ok" for r in reports):
        sys.exit(EXIT_UNREACHABLE)
    if any(r.worst == "error" for r in reports):
        sys.exit(EXIT_FINDINGS)


def parse_var(values: Sequence[str]) -> dict[str, str]:
    """--var k=v, kept as strings (YAML would read 12.10 as the float 12.1)."""
    from fleetfix.errors import ConfigError

    parsed: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"--var {item!r}: expected NAME=VALUE with NAME a plain identifier")
        parsed[key.strip()] = value
    return parsed


@main.command("apply")
@click.argument("playbook_path", metavar="PLAYBOOK", type=click.Path(dir_okay=False))
@targeting_options
@local_option
@rollout_options()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def apply_command(playbook_path: str, rollout: RolloutOptions, as_json: bool, **opts: Any) -> None:
    """Apply a playbook to targets: ordered, idempotent steps; a recap per target at the end.

    With --snapshot (or `snapshot: true` in the playbook) each container is snapshotted on its node
    right before its first change; see docs/snapshots.md.

    \b
    Examples:
      fleetfix apply playbooks/cuda-toolkit.yaml -i inventory.yaml --check
      fleetfix apply playbooks/cuda-toolkit.yaml --local --check
      fleetfix apply playbooks/cuda-toolkit.yaml --host 10.1.2.6 --ct 200 \\
          --var cuda_repo_base=http://mirror.internal/compute/cuda/repos
      fleetfix apply playbooks/cuda-toolkit.yaml -i inventory.yaml --snapshot --rollback-on-failure
    """
    from fleetfix.fleet import Fleet
    from fleetfix.output import LiveOutput, render_apply, step_printer
    from fleetfix.playbook import RunRecorder, load_playbook, run_playbook
    from fleetfix.playbook.records import Redactor
    from fleetfix.probing import gather_facts

    check_local_alone(**opts)  # a usage error first, before any file is read
    playbook = load_playbook(playbook_path)
    snapshots = rollout.snapshot_policy()
    variables = rollout.variables()
    targets = resolve_targets(**opts)
    verbose = bool(click.get_current_context().find_root().params.get("verbose"))
    redactor = Redactor()  # secret-named vars: masked in everything printed, live lines included
    live = LiveOutput(redact=redactor.text) if verbose and not as_json else None  # -v: stream output
    with (
        Fleet(forks=opts["forks"]) as fleet,
        RunRecorder(rollout.records_dir()) as recorder,
    ):
        run = run_playbook(
            playbook, targets, fleet_map=fleet.map,
            facts_for=lambda target, transport: gather_facts(target, transport).model_dump(mode="json"),
            vars=variables, check=rollout.check, recorder=recorder, serial=rollout.serial,
            max_fail_pct=rollout.max_fail,
            on_step=None if as_json else step_printer(verbose=verbose, live=live),
            on_output=None if live is None else live.on_output,
            snapshots=snapshots, node_for=fleet.node_transport, redactor=redactor,
        )
    if live is not None:
        live.flush()
    render_apply(run, as_json=as_json)
    sys.exit(run.exit_code)


@main.group("runs")
def runs_group() -> None:
    """Read the records of past `apply` runs."""


@runs_group.command("list")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="Where run records are.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def runs_list(state_dir: str | None, as_json: bool) -> None:
    """List recorded runs, newest first.

    \b
    Example:
      fleetfix runs list
    """
    from fleetfix.output import render_runs
    from fleetfix.playbook import default_state_dir, list_runs

    render_runs(list_runs(state_dir or default_state_dir()), as_json=as_json)


@runs_group.command("show")
@click.argument("run_id")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="Where run records are.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def runs_show(run_id: str, state_dir: str | None, as_json: bool) -> None:
    """Show one run: every target's steps, with their scripts' output.

    \b
    Example:
      fleetfix runs show 20261202T120000Z-1a2b3c
    """
    from fleetfix.output import render_run_detail
    from fleetfix.playbook import default_state_dir, load_run

    render_run_detail(load_run(state_dir or default_state_dir(), run_id), as_json=as_json)


def _register_subcommands() -> None:
    from fleetfix.cli_audit import audit_group, schedule_group

    main.add_command(audit_group)
    main.add_command(schedule_group)


_register_subcommands()
