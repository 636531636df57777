"""What every command shares: option groups that arrive as typed objects, report options from the report
registry, one-line errors with their exit codes, and Ctrl-C handling.

Option groups are declared once and interpreted once (the objects' methods), so commands cannot drift
apart in names or meaning. Heavy modules (paramiko, pydantic models, the probe) are imported inside the
commands, never here: `fleetfix --help` stays fast.
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

from fleetfix.cli.collector import start_up_done
from fleetfix.errors import ConfigError, ExitCode, FleetfixError
from fleetfix.inventory.request import TargetRequest
from fleetfix.paths import check_shared_file, group_id
from fleetfix.reports import TEXT, FactsNeed, ReportFormat, facts_needed, formats_for, write_report
from fleetfix.secrets import is_reference, resolve_reference
from fleetfix.terminal import safe_line

if TYPE_CHECKING:
    from fleetfix.fleet import Fleet
    from fleetfix.inventory.resolve import Resolution
    from fleetfix.playbook.snapshots import SnapshotPolicy
    from fleetfix.playbook.wheels import WheelOptions
    from fleetfix.target import Target

F = TypeVar("F", bound=Callable[..., Any])

# fleet.DEFAULT_FORKS and transport.base.DEFAULT_MAX_OUTPUT, spelled out: importing fleetfix.fleet here
# would slow down `--help`.
DEFAULT_FORKS = 32
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
DEFAULT_RECORD_OUTPUT = 256 * 1024
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
               "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}


class ByteSize(click.types.IntParamType):  # an int type: click 8.5's ParamType is generic, 8.2's is not
    """A size in bytes: 65536, 512k, 8MiB, 1G (binary units), within [minimum, maximum]."""

    name = "size"

    def __init__(self, minimum: int, maximum: int) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            size = value
        else:
            text = str(value).strip().lower()
            number = text.rstrip("kmgib")
            unit = text[len(number):]
            if not number.isdigit() or len(number) > 12 or unit not in _SIZE_UNITS:
                self.fail(f"{value!r} is not a size (bytes, or with k/M/G, e.g. 8M)", param, ctx)
            size = int(number) * _SIZE_UNITS[unit]
        if not self.minimum <= size <= self.maximum:
            self.fail(f"{value!r} is not between {self.minimum} and {self.maximum} bytes", param, ctx)
        return size


@dataclass(frozen=True)
class FleetOptions:
    """How the fleet is driven: nodes at once, and what a command's output may hold in memory."""

    forks: int = DEFAULT_FORKS
    max_output: int = DEFAULT_MAX_OUTPUT

    def open(self) -> Fleet:
        """The fleet, for the command's work: its start-up is over (collector.start_up_done)."""
        from fleetfix.fleet import Fleet

        start_up_done()
        return Fleet(forks=self.forks, max_output=self.max_output)


def _decorate(func: F, options: Sequence[Callable[[F], F]]) -> F:
    for option in reversed(options):
        func = option(func)
    return func


def _collect(names: Sequence[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name in names}


def gathered(into: str, cls: Callable[..., Any]) -> Callable[[F], F]:
    """The command receives the options named like cls's fields as one `into` argument, cls(...) of them.
    Put it below the options (nearest the function): it moves no option, so --help is unchanged."""
    names = [f.name for f in fields(cast(Any, cls))]

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **{into: cls(**_collect(names, kwargs))}, **kwargs)

        return cast(F, wrapper)

    return decorate


# --- targeting ---------------------------------------------------------------------------------------

_TARGET_FIELDS = [f.name for f in fields(TargetRequest) if f.name != "local"]


def targeting_options(func: F) -> F:
    """The options every fleet command shares; the command receives `targets: TargetRequest` and
    `fleet: FleetOptions`."""
    options: list[Callable[[F], F]] = [
        # click.Path (no checks): `schedule install` finds the path-valued options by their type.
        click.option("-i", "--inventory", metavar="FILE", type=click.Path(),
                     help="Inventory YAML (default: $FLEETFIX_INVENTORY, else ./inventory.yaml)."),
        click.option("-l", "--limit", metavar="PATTERN",
                     help="Select targets: name, glob, group, tag:T, node:N; '!' excludes; comma-separated."),
        click.option("--host", metavar="ADDR", help="Ad-hoc node address instead of an inventory."),
        click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True,
                     help="SSH port (with --host)."),
        click.option("--user", default="root", show_default=True, help="SSH user (with --host)."),
        click.option("--identity", metavar="FILE", type=click.Path(), help="SSH private key (with --host)."),
        click.option("--known-hosts", metavar="FILE", type=click.Path(),
                     help="known_hosts file (default ~/.ssh/known_hosts)."),
        click.option("--accept-new", is_flag=True,
                     help="Record unknown host keys (never accepts a changed key)."),
        click.option("--ct", "ctids", type=click.IntRange(1, 999_999_999), multiple=True, metavar="CTID",
                     help="Container on --host (repeatable). Without --ct/--vm, the node itself."),
        click.option("--vm", "vmids", type=click.IntRange(1, 999_999_999), multiple=True, metavar="VMID",
                     help="VM on --host, through its QEMU guest agent (repeatable)."),
        click.option("--connect-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
                     help="Seconds to wait for an SSH connection."),
        click.option("--forks", type=click.IntRange(1, 1000), default=DEFAULT_FORKS, show_default=True,
                     help="Nodes worked on at once."),
        click.option("--refresh", is_flag=True, help="Bypass the Proxmox discovery cache."),
        click.option("--become", is_flag=True,
                     help="Run pct/qm/pvesh (and a node target's commands) through `sudo -n` on the "
                          "node: for a login that is not root (inventory: become)."),
        click.option("--become-user", metavar="USER", default=None,
                     help="The user sudo runs them as (default root; with --become)."),
        click.option("--become-password", metavar="REF", default=None,
                     help="sudo's password, as @env:NAME or @file:PATH (never the password itself; with "
                          "--become)."),
        click.option("--max-output", type=ByteSize(64 * 1024, 1024**3), default=DEFAULT_MAX_OUTPUT,
                     metavar="SIZE", help="Output kept in memory per command and stream (e.g. 8M); the "
                     "middle of more is dropped, and a marker line says how much.  [default: 8M]"),
    ]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = _collect(_TARGET_FIELDS, kwargs)
        values["local"] = kwargs.pop("local", False)
        fleet = FleetOptions(forks=kwargs.pop("forks"), max_output=kwargs.pop("max_output"))
        return func(*args, targets=TargetRequest(**values), fleet_options=fleet, **kwargs)

    return _decorate(cast(F, wrapper), options)


def dial_ahead(targets: Sequence[Target], fleet: FleetOptions) -> None:
    """Start connecting to the targets' first nodes now, before the command imports the fleet runner,
    paramiko and the probe (fleetfix.transport.dial): for one target, start-up was most of its time."""
    from fleetfix.transport.dial import dial_ahead as start

    start((target.node.ssh for target in targets if target.node.ssh is not None), limit=fleet.forks)


def local_option(func: F) -> F:
    """`--local`: this machine as the one target, no SSH (probe, exec, apply). Goes above
    targeting_options, which puts it into the TargetRequest."""
    return click.option("--local", is_flag=True,
                        help="Act on this machine, no SSH (not with -i/--inventory or --host).")(func)


def resolve(request: TargetRequest) -> Resolution:
    """The command's targets; discovery's warnings are shown on stderr, escaped: they name guests as the
    Proxmox API (a node) reported them."""
    from fleetfix.inventory.resolve import resolve_targets

    resolution = resolve_targets(request)
    for warning in resolution.warnings:
        click.echo(f"fleetfix: warning: {safe_line(str(warning))}", err=True)
    return resolution


# --- rollout (apply, audit --remediate) ---------------------------------------------------------------

@dataclass(frozen=True)
class RolloutOptions:
    """How a playbook is rolled out: the options `apply` and `audit --remediate` share."""

    var_items: tuple[str, ...] = ()
    var_files: tuple[str, ...] = ()
    check: bool = False
    serial: int | None = None
    max_fail: float | None = None
    state_dir: str | None = None
    snapshot: bool = False
    rollback_on_failure: bool = False
    keep_snapshots: int | None = None
    allow_no_snapshot: bool = False
    record_output: int | None = None  # None: DEFAULT_RECORD_OUTPUT
    wheel_cache: str | None = None
    wheelhouses: tuple[str, ...] = ()
    rebuild: bool = False
    wheel_lock: str | None = None
    allow_unverified_wheels: bool = False

    def given(self) -> list[str]:
        """The options set on the command line, by their option names (for error messages)."""
        return [_ROLLOUT_FLAGS[f.name] for f in fields(self) if _is_set(getattr(self, f.name))]

    def variables(self) -> dict[str, Any]:
        """The vars, references resolved (`--var-file` first, then `--var` in order: later wins)."""
        return self.secret_vars()[0]

    def secret_vars(self) -> tuple[dict[str, Any], list[str]]:
        """The vars, and the values that came through the secret channel (an @env:/@file: reference or a
        --var-file), which are masked wherever they would be shown or recorded, whatever their names."""
        from fleetfix.secrets import load_var_file

        values: dict[str, Any] = {}
        secrets: list[str] = []
        for path in self.var_files:
            loaded = load_var_file(path)
            values.update(loaded)
            secrets.extend(_scalars(loaded))
        for name, value in parse_var(self.var_items).items():
            if is_reference(value):
                value = resolve_reference(value, f"--var {name}")
                secrets.append(value)
            values[name] = value
        return values, secrets

    def snapshot_policy(self) -> SnapshotPolicy:
        from fleetfix.playbook.snapshots import SnapshotPolicy

        return SnapshotPolicy(
            take=self.snapshot or self.rollback_on_failure or self.keep_snapshots is not None,
            rollback_on_failure=self.rollback_on_failure, keep=self.keep_snapshots,
            allow_no_snapshot=self.allow_no_snapshot,
        )

    def wheel_options(self) -> WheelOptions:
        """The wheel cache of `wheels` steps (docs/extensions.md): --wheel-cache, else <state dir>/wheels;
        upstream's release wheels are fetched by this controller for items whose playbook names them, each
        checked against its sha256 from --wheel-lock or GitHub's API (unverified only when allowed)."""
        from fleetfix.guests.transfer import DEFAULT_MAX_BYTES
        from fleetfix.playbook.wheels import WheelOptions
        from fleetfix.wheels.archive import archive_problem
        from fleetfix.wheels.cache import WheelCache, default_cache_dir
        from fleetfix.wheels.httpfetch import Fetcher
        from fleetfix.wheels.lock import load_wheel_lock
        from fleetfix.wheels.release import ReleaseDigests
        from fleetfix.wheels.source import Sources

        lock = load_wheel_lock(self.wheel_lock) if self.wheel_lock else None
        root = self.wheel_cache or default_cache_dir(self.records_dir())
        fetcher = Fetcher(authenticator=ReleaseDigests(lock), allow_unverified=self.allow_unverified_wheels,
                          inspect=archive_problem)
        def lock_pin(url: str) -> tuple[str, str] | None:
            pin = lock.pin(url) if lock is not None else None
            return (pin.sha256, pin.where) if pin is not None else None

        return WheelOptions(WheelCache(root, wheelhouses=self.wheelhouses), rebuild=self.rebuild,
                            upstream=fetcher, sources=Sources(DEFAULT_MAX_BYTES, lock_pin))

    def records_dir(self) -> str | Path:
        from fleetfix.paths import default_state_dir

        return self.state_dir or default_state_dir()


def _scalars(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in _scalars(item)]
    if isinstance(value, list):
        return [text for item in value for text in _scalars(item)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


def _is_set(value: object) -> bool:
    # Not `value in (None, False, ())`: --max-fail 0 is set, and 0.0 == False.
    return value is not None and value is not False and value != ()


_ROLLOUT_FLAGS = {
    "var_items": "--var", "var_files": "--var-file", "check": "--check", "serial": "--serial",
    "max_fail": "--max-fail",
    "state_dir": "--state-dir", "snapshot": "--snapshot", "rollback_on_failure": "--rollback-on-failure",
    "keep_snapshots": "--keep-snapshots", "allow_no_snapshot": "--allow-no-snapshot",
    "record_output": "--record-output",
    "wheel_cache": "--wheel-cache", "wheelhouses": "--wheelhouse", "rebuild": "--rebuild",
    "wheel_lock": "--wheel-lock", "allow_unverified_wheels": "--allow-unverified-wheels",
}


def _rollout_click_options(help_prefix: str) -> list[Callable[[F], F]]:
    def text(help_text: str) -> str:  # "With --remediate: set a ..." reads as one sentence
        return help_prefix + help_text[0].lower() + help_text[1:] if help_prefix else help_text

    return [
        click.option("--var", "var_items", multiple=True, metavar="NAME=VALUE",
                     help=text("Set a playbook var (repeatable). VALUE may be a reference, @env:NAME or "
                               "@file:PATH, resolved at run time and masked everywhere.")),
        click.option("--var-file", "var_files", multiple=True, metavar="FILE",
                     type=click.Path(dir_okay=False),
                     help=text("Vars from a YAML/JSON mapping (repeatable; refused if group or others may "
                               "read it). Its values are secrets: masked everywhere.")),
        click.option("--check", is_flag=True,
                     help=text("Run only `when` and `check`: report what would change, change nothing.")),
        click.option("--serial", type=click.IntRange(1, 1_000_000), default=None,
                     help=text("Roll out in batches of N targets.")),
        click.option("--max-fail", "max_fail", type=click.FloatRange(0, 100), default=None, metavar="PCT",
                     help=text("Stop starting new batches once more than PCT% of targets failed.")),
        click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                     help=text("Where run records go (default: $FLEETFIX_STATE_DIR or "
                               "~/.local/state/fleetfix).")),
        click.option("--snapshot", is_flag=True,
                     help=text("Snapshot each guest (`pct`/`qm snapshot`) before its first change (never in "
                               "--check mode).")),
        click.option("--rollback-on-failure", is_flag=True,
                     help=text("Roll back a guest whose apply failed (implies --snapshot).")),
        click.option("--keep-snapshots", type=click.IntRange(1, 1000), default=None, metavar="N",
                     help=text("Keep only the N newest fleetfix-* snapshots per guest (implies "
                               "--snapshot).")),
        click.option("--allow-no-snapshot", is_flag=True,
                     help=text("Change guests whose storage cannot snapshot (and nodes) anyway.")),
        click.option("--record-output", type=ByteSize(1024, 1024**3), default=None, metavar="SIZE",
                     help=text("Output kept per script and stream in the run record (e.g. 256k); the "
                               "middle of more is dropped, and a marker line says how much.  "
                               "[default: 256k]")),
        click.option("--wheel-cache", type=click.Path(file_okay=False), default=None, metavar="DIR",
                     help=text("The wheel cache of `wheels` steps (default: <state dir>/wheels); see "
                               "docs/extensions.md.")),
        click.option("--wheelhouse", "wheelhouses", multiple=True, metavar="DIR",
                     type=click.Path(file_okay=False, exists=True),
                     help=text("A read-only wheel directory in the cache's layout (e.g. from CI), looked up "
                               "after the cache (repeatable).")),
        click.option("--rebuild", is_flag=True,
                     help=text("`wheels` steps build on every target that lacks the item, ignoring the "
                               "wheel cache, wheelhouses and upstream's release wheels, and replace the "
                               "cached entries.")),
        click.option("--wheel-lock", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help=text("YAML of the sha256 each upstream release wheel must have ({name: {url: "
                               "sha256}}); checked before GitHub's API digest. See docs/extensions.md.")),
        click.option("--allow-unverified-wheels", is_flag=True,
                     help=text("Install upstream release wheels that have no sha256 in the lock or GitHub's "
                               "API (still https only). Off by default: such a wheel is built instead.")),
    ]


def rollout_options(help_prefix: str = "") -> Callable[[F], F]:
    """Add the rollout options to a command; it receives them as one `rollout: RolloutOptions` argument.
    help_prefix (e.g. "With --remediate: ") is put in front of every help text."""

    def decorate(func: F) -> F:
        names = [f.name for f in fields(RolloutOptions)]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, rollout=RolloutOptions(**_collect(names, kwargs)), **kwargs)

        return _decorate(cast(F, wrapper), _rollout_click_options(help_prefix))

    return decorate


def parse_var(values: Sequence[str]) -> dict[str, str]:
    """--var k=v, kept as strings (YAML would read 12.10 as the float 12.1)."""
    parsed: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            # The name only: what follows `=` may be a secret typed with a mistake before it.
            shown = key if sep and key.isprintable() and len(key) <= 64 else "…"
            raise ConfigError(f"--var {shown!r}: expected NAME=VALUE with NAME a plain identifier")
        parsed[key.strip()] = value
    return parsed


# --- reports -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReportChoice:
    """Where a command's report goes: one format on stdout, and any file formats to their files."""

    stdout: ReportFormat = TEXT
    files: tuple[tuple[ReportFormat, str], ...] = ()
    groups: tuple[tuple[ReportFormat, str], ...] = ()  # --NAME-group GROUP, as given

    @property
    def facts(self) -> FactsNeed:
        """What the chosen formats show of the targets' facts (ReportFormat.facts): what to load."""
        return facts_needed([self.stdout, *(report_format for report_format, _ in self.files)])

    @property
    def as_json(self) -> bool:
        """Machine-readable stdout: live output and progress bars stay off."""
        return self.stdout.name != "text"

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules of the chosen formats' renderers: for a command to import them ahead, while its
        network work is under way (fleetfix.importahead)."""
        return tuple(dict.fromkeys(f.module for f in (self.stdout, *(f for f, _ in self.files))))

    def file_groups(self) -> dict[str, int]:
        """Each file's group (ReportFormat.group) by format name, checked as far as can be before the
        report is written: the group exists, this user may give files to it, it may read them there.
        A command calls it before its work, so that a mistake fails before the audit, not after it."""
        paths = {report_format.name: path for report_format, path in self.files}
        groups = {}
        for report_format, name in self.groups:
            option = f"--{report_format.name}-group"
            if report_format.name not in paths:
                raise ConfigError(f"{option} {name}: needs --{report_format.name} FILE")
            groups[report_format.name] = gid = group_id(name, option)
            check_shared_file(Path(paths[report_format.name]), gid, option)
        return groups

    def emit(self, run: Any, **options: Any) -> None:
        """Write the file reports, then print the stdout report. A reader that went away (`| head`)
        is not the command's failure: the rest of the output is dropped and its exit code stands."""
        groups = self.file_groups()
        for report_format, path in self.files:
            write_report(path, report_format.pieces(run, **options), group=groups.get(report_format.name),
                         group_option=f"--{report_format.name}-group")
        try:
            for piece in self.stdout.pieces(run, **options):
                sys.stdout.write(piece)
            sys.stdout.flush()
        except BrokenPipeError:
            stdout_gone()


def stdout_gone() -> None:
    """The reader of stdout has gone: send whatever is still written there to /dev/null, so that
    neither a later write nor the interpreter's final flush raises (Python docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def report_options(kind: str) -> Callable[[F], F]:
    """The report options of a command producing runs of `kind`, one per registered format that renders
    it (`--json`, `--html FILE`, ...); the command receives `report: ReportChoice`."""
    formats = [f for f in formats_for(kind) if f is not TEXT]

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chosen = [(f, kwargs.pop(f"report_{f.name}")) for f in formats]
            stdout = next((f for f, value in chosen if value and not f.to_file), TEXT)
            files = tuple((f, str(value)) for f, value in chosen if value and f.to_file)
            groups = tuple((f, str(value)) for f, value in
                           ((f, kwargs.pop(f"report_{f.name}_group")) for f in formats if f.group) if value)
            return func(*args, report=ReportChoice(stdout, files, groups), **kwargs)

        options = [
            click.option(f"--{f.name}", f"report_{f.name}", type=click.Path(dir_okay=False), default=None,
                         help=f.help) if f.to_file
            else click.option(f"--{f.name}", f"report_{f.name}", is_flag=True, help=f.help)
            for f in formats
        ] + [
            click.option(f"--{f.name}-group", f"report_{f.name}_group", metavar="GROUP", default=None,
                         help=f"Make the --{f.name} file 0640 with this group (default: 0600): for a reader "
                              f"running as another user (node_exporter).")
            for f in formats if f.group
        ]
        return _decorate(cast(F, wrapper), options)

    return decorate


# --- errors and interrupts ---------------------------------------------------------------------------

def verbose() -> bool:
    """Whether the root command got -v."""
    return bool(click.get_current_context().find_root().params.get("verbose"))


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
            os._exit(ExitCode.INTERRUPTED)
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
    """Expected failures become one line on stderr (with the error's hint) and their exit code; -v keeps
    the traceback. A command returns its run's ExitCode, which becomes the process's. Ctrl-C is handled
    as `graceful_interrupts` says: exit 130 once the command has wrapped up."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with graceful_interrupts() as interrupts:
            try:
                code = func(*args, **kwargs)
            except FleetfixError as exc:
                if verbose():
                    raise
                # One line, escaped: the message may quote a target's output.
                click.echo(f"fleetfix: error: {safe_line(exc.with_hint())}", err=True)
                sys.exit(ExitCode.INTERRUPTED if interrupts.interrupted else exc.exit_code)
            except KeyboardInterrupt:
                click.echo("fleetfix: interrupted", err=True)
                sys.exit(ExitCode.INTERRUPTED)
            except BrokenPipeError:  # stdout closed early, outside a report: no traceback for that
                stdout_gone()
                click.echo("fleetfix: error: output closed early (broken pipe)", err=True)
                sys.exit(ExitCode.FAILED)
            if interrupts.interrupted:  # the command wrapped up after a Ctrl-C: say so in the exit code
                click.echo("fleetfix: interrupted", err=True)
                sys.exit(ExitCode.INTERRUPTED)
            if code:
                sys.exit(int(code))
            return None

    return wrapper  # type: ignore[return-value]
