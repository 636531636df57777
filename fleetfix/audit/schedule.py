"""The schedule: a systemd service + timer (or a cron line) that runs `fleetfix audit` daily.

Every value that reaches a unit file or a crontab is validated (no control characters: a newline would
start a new directive) and quoted once, for the reader that parses it: systemd's own word splitting for
ExecStart= (with `%` specifiers and `$` expansion escaped), POSIX sh (shlex.quote) plus cron's `%` for
the cron line.

The service exits with `fleetfix audit`'s code, so 3 (error findings) and 4 (unreachable) leave the unit
"failed": `systemctl --failed` and an OnFailure= hook then alert, which is the point of a nightly audit.

What runs at night runs elsewhere than where it was installed: systemd starts it in `/` with an empty
environment, cron in the user's home. So every path in it is absolute (the CLI pins and checks them at
install time) and the unit also names its WorkingDirectory=; a hung audit is stopped after `timeout`
(TimeoutStartSec=, or coreutils `timeout` on the cron line) so runs cannot pile up behind it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleetfix.audit.backend import check_url, is_url
from fleetfix.audit.report import write_atomic
from fleetfix.audit.store import DB_ENV
from fleetfix.errors import ConfigError
from fleetfix.secrets import is_reference, is_secret_name

_UNIT_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,200}")
_AT = re.compile(r"([01]?[0-9]|2[0-3]):([0-5][0-9])")
_CALENDAR = re.compile(r"[A-Za-z0-9 ,.:*/~+-]{1,200}")
_SPAN_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)")
_SPAN_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
               "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400,
               "days": 86400}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
DEFAULT_TIMEOUT = "3h"
# After the timeout, the audit gets SIGTERM (its run stays incomplete, never a baseline), then SIGKILL.
_KILL_AFTER_S = 60
# Words systemd takes literally: no quotes, whitespace, specifiers (%), variables ($) or escapes (\).
_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_+=:,./@-]+")

Systemctl = Callable[[Sequence[str]], str]


def _no_control(value: str, what: str) -> str:
    if _CONTROL.search(value):
        raise ConfigError(f"{what}: control characters (newline, tab, ...) are not allowed: {value!r}")
    return value


def _refuse_secret_values(audit_args: Sequence[str]) -> None:
    """A unit file or crontab line holds references only, never a secret (such files are often readable
    by others): a secret-named `--var NAME=VALUE` must be `@env:NAME`/`@file:PATH` (or come from a
    --var-file), and a become password is a reference anyway (checked by the audit's own options)."""
    for index, arg in enumerate(audit_args):
        if arg == "--var" and index + 1 < len(audit_args):
            item = audit_args[index + 1]
        elif arg.startswith("--var="):
            item = arg[len("--var="):]
        else:
            continue
        name, _, value = item.partition("=")
        if is_secret_name(name) and not is_reference(value):
            raise ConfigError(f"--var {name}: a scheduled run keeps its options in a unit file or crontab; "
                              f"give the value as @file:PATH or @env:NAME, or in a --var-file")


def timespan_seconds(span: str, option: str = "--randomized-delay") -> int:
    """A systemd time span ("15min", "1h 30min", "90") in seconds; ConfigError if it is not one."""
    text, total, position = span.strip(), 0.0, 0
    if not text:
        raise ConfigError(f"{option} {span!r}: expected a time span such as 15min or 1h")
    while position < len(text):
        part = _SPAN_PART.match(text, position)
        if part is None or part.group(2) not in _SPAN_UNITS:
            raise ConfigError(f"{option} {span!r}: expected a time span such as 15min or 1h")
        total += float(part.group(1)) * _SPAN_UNITS[part.group(2)]
        position = part.end()
    return int(total)


@dataclass(frozen=True)
class ScheduleRequest:
    """What `schedule install` was asked for: the unit's name, when (--at, or --on-calendar), the audit's
    own options, the history database, the interpreter and directory it runs with (default: this one's),
    how long it may run, and the file its secrets come from."""

    name: str
    at: str = "03:00"
    on_calendar: str | None = None
    randomized_delay: str = "15min"
    audit_args: Sequence[str] = ()
    db: str | None = None
    python: str | None = None
    working_directory: str | None = None
    timeout: str = DEFAULT_TIMEOUT
    env_file: str | None = None


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    on_calendar: str
    cron_time: str  # "MM HH" of the crontab line
    randomized_delay_s: int
    argv: tuple[str, ...]  # what runs: python -m fleetfix audit ...
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str = "/"  # absolute; where it was installed from
    timeout: str = DEFAULT_TIMEOUT  # a systemd time span: TimeoutStartSec=, and `timeout` on the cron line
    timeout_s: int = 3 * 3600
    # EnvironmentFile= (absolute, private): where the `@env:NAME` secrets of a scheduled run come from, so
    # the unit itself names them and never holds them.
    env_file: str | None = None

    @classmethod
    def build(cls, request: ScheduleRequest) -> ScheduleSpec:
        """The units' contents for what was asked, every value checked (ConfigError names the option)."""
        name, at, on_calendar, audit_args = request.name, request.at, request.on_calendar, request.audit_args
        db, python, timeout, env_file = request.db, request.python, request.timeout, request.env_file
        if not _UNIT_NAME.fullmatch(name):
            raise ConfigError(f"--name {name!r}: letters, digits and _ . @ - only")
        at_match = _AT.fullmatch(at)
        if at_match is None:
            raise ConfigError(f"--at {at!r}: expected HH:MM (24h)")
        hour, minute = int(at_match.group(1)), int(at_match.group(2))
        if on_calendar is not None and not _CALENDAR.fullmatch(on_calendar):
            raise ConfigError(f"--on-calendar {on_calendar!r}: not a calendar expression")
        for arg in audit_args:
            _no_control(arg, "audit option")
        timeout_s = timespan_seconds(timeout, "--timeout")
        if timeout_s < 1:
            raise ConfigError(f"--timeout {timeout!r}: expected a time span of at least 1s")
        _refuse_secret_values(audit_args)
        environment = {}
        if db and is_url(db):
            check_url(db)  # a password only as a reference, never in the unit
        if db:
            environment[DB_ENV] = _no_control(db if is_url(db) else os.path.abspath(db), "--db")
        # The interpreter running now: the scheduled audit uses the same install (venv included).
        interpreter = os.path.abspath(python or sys.executable)
        return cls(
            name=name, on_calendar=on_calendar or f"*-*-* {hour:02d}:{minute:02d}:00",
            cron_time=f"{minute} {hour}", randomized_delay_s=timespan_seconds(request.randomized_delay),
            argv=(interpreter, "-m", "fleetfix", "audit", *audit_args), environment=environment,
            working_directory=_no_control(os.path.abspath(request.working_directory or os.getcwd()),
                                          "working directory"),
            timeout=" ".join(timeout.split()), timeout_s=timeout_s,
            env_file=None if env_file is None else _no_control(os.path.abspath(env_file), "--env-file"),
        )


def systemd_quote(word: str) -> str:
    """One ExecStart= word, so systemd's parser gives back exactly `word` (systemd.service, "Command
    lines"): plain words as they are, others double-quoted with \\ and " escaped, % and $ doubled."""
    _no_control(word, "unit value")
    if _SYSTEMD_PLAIN.fullmatch(word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _environment_line(name: str, value: str) -> str:
    # Environment= does no $ expansion but does expand % specifiers; the whole assignment is one word.
    assignment = f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'Environment="{assignment}"'


def _unit_path(path: str) -> str:
    # A path setting is one value (no word splitting), but % specifiers are expanded in it.
    return _no_control(path, "unit value").replace("%", "%%")


def service_unit(spec: ScheduleSpec) -> str:
    lines = [
        "[Unit]",
        "Description=fleetfix audit of the GPU software stacks (probe, policy, history, drift)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=oneshot",
        # Where it was installed from; every path in ExecStart= is absolute anyway (systemd starts in /).
        f"WorkingDirectory={_unit_path(spec.working_directory)}",
        *(_environment_line(name, value) for name, value in spec.environment.items()),
        *([f"EnvironmentFile={_unit_path(spec.env_file)}"] if spec.env_file else []),
        "ExecStart=" + " ".join(systemd_quote(word) for word in spec.argv),
        # A hung audit must not block tomorrow's: a running oneshot is not started again by its timer.
        f"TimeoutStartSec={spec.timeout}",
        f"TimeoutStopSec={_KILL_AFTER_S}",
        "Nice=10",
    ]
    return "\n".join(lines) + "\n"


def timer_unit(spec: ScheduleSpec) -> str:
    lines = [
        "[Unit]",
        f"Description=Run {spec.name}.service daily",
        "",
        "[Timer]",
        f"OnCalendar={spec.on_calendar}",
        "Persistent=true",  # a run missed while the machine was off happens at the next boot
        f"RandomizedDelaySec={spec.randomized_delay_s}",
        f"Unit={spec.name}.service",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return "\n".join(lines) + "\n"


def units(spec: ScheduleSpec) -> dict[str, str]:
    return {f"{spec.name}.service": service_unit(spec), f"{spec.name}.timer": timer_unit(spec)}


def cron_line(spec: ScheduleSpec) -> str:
    """A crontab line (sh syntax; cron turns an unescaped % into a newline, so every % is escaped)."""
    words = [f"{name}={shlex.quote(value)}" for name, value in spec.environment.items()]
    # coreutils timeout: cron has no TimeoutStartSec=, and a hung audit must not pile up night after night
    words += ["timeout", f"--kill-after={_KILL_AFTER_S}", str(spec.timeout_s)]
    words += [shlex.quote(word) for word in spec.argv]
    command = f"cd {shlex.quote(spec.working_directory)} && " + " ".join(words)
    if spec.randomized_delay_s > 0:  # cron has no RandomizedDelaySec: sleep a random part of it first
        command = (f"sleep $(( $(od -An -N2 -tu2 /dev/urandom) % {spec.randomized_delay_s} )) && "
                   + command)
    return f"{spec.cron_time} * * * {command.replace('%', chr(92) + '%')}"


# ---------------------------------------------------------------- install / show / remove


def default_systemctl() -> Systemctl | None:
    """systemctl, when systemd is the running init; None otherwise (containers, CI)."""
    binary = shutil.which("systemctl")
    if binary is None or not Path("/run/systemd/system").is_dir():
        return None

    def run(args: Sequence[str]) -> str:
        done = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"systemctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    return run


def install(spec: ScheduleSpec, unit_dir: Path, systemctl: Systemctl | None = None,
            *, detect: bool = True) -> list[str]:
    """Write both units, then reload systemd and enable the timer. Returns what was done, line by line."""
    ctl = systemctl if systemctl is not None or not detect else default_systemctl()
    done = []
    for filename, text in units(spec).items():
        path = unit_dir / filename
        write_atomic(path, text)
        done.append(f"wrote {path}")
    if ctl is None:
        done.append(f"systemd is not running here: enable it later with `systemctl enable --now "
                    f"{spec.name}.timer`")
        return done
    ctl(["daemon-reload"])
    ctl(["enable", "--now", f"{spec.name}.timer"])
    done.append(f"enabled and started {spec.name}.timer")
    return done


@dataclass(frozen=True)
class InstalledService:
    """What an installed service runs, read back from its unit file (as it is now, edits included)."""

    path: Path
    argv: tuple[str, ...]
    working_directory: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    timeout: str | None = None

    @property
    def audit_args(self) -> tuple[str, ...] | None:
        """The options given to `fleetfix audit`, when that is what it runs."""
        if len(self.argv) >= 4 and self.argv[1:4] == ("-m", "fleetfix", "audit"):
            return self.argv[4:]
        return None

    def command_line(self) -> str:
        """The same as one sh command line: what a person would type to run it by hand."""
        words = [f"{name}={shlex.quote(value)}" for name, value in self.environment.items()]
        words += [shlex.quote(word) for word in self.argv]
        command = " ".join(words)
        return f"cd {shlex.quote(self.working_directory)} && {command}" if self.working_directory else command


def unit_words(value: str, *, dollar: bool) -> list[str]:
    """systemd's splitting of a command line or an Environment= value into words ("Command lines" in
    systemd.service): quotes, backslash escapes, `%%` for `%` and (ExecStart=) `$$` for `$`."""
    words: list[str] = []
    i = 0
    while i < len(value):
        if value[i].isspace():
            i += 1
            continue
        word, quote = "", None
        while i < len(value) and (quote is not None or not value[i].isspace()):
            char = value[i]
            if char == "\\" and i + 1 < len(value):
                word, i = word + value[i + 1], i + 2
                continue
            if quote is None and char in "\"'":
                quote = char
            elif char == quote:
                quote = None
            else:
                word += char
            i += 1
        word = word.replace("%%", "%")
        words.append(word.replace("$$", "$") if dollar else word)
    return words


def installed_service(name: str, unit_dir: Path) -> InstalledService | None:
    """The installed NAME.service, read back; None when there is none."""
    path = unit_dir / f"{name}.service"
    if not path.is_file():
        return None
    argv: list[str] = []
    working_directory = timeout = None
    environment: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            argv = unit_words(value, dollar=True)
            if argv:
                argv[0] = argv[0].lstrip("-@:+!")  # systemd's prefixes, not part of the path
        elif key == "WorkingDirectory":
            working_directory = value.strip().lstrip("-").replace("%%", "%")
        elif key == "Environment":
            for assignment in unit_words(value, dollar=False):
                env_name, _, env_value = assignment.partition("=")
                environment[env_name] = env_value
        elif key == "TimeoutStartSec":
            timeout = value.strip()
    return InstalledService(path, tuple(argv), working_directory, environment, timeout)


def show(name: str, unit_dir: Path, systemctl: Systemctl | None = None, *, detect: bool = True) -> str:
    paths = [unit_dir / f"{name}.service", unit_dir / f"{name}.timer"]
    if not any(path.exists() for path in paths):
        raise ConfigError(f"no {name} units in {unit_dir}: see `fleetfix schedule install --help`")
    parts = [f"# {path}\n{path.read_text(encoding='utf-8')}" for path in paths if path.exists()]
    ctl = systemctl if systemctl is not None or not detect else default_systemctl()
    if ctl is not None:
        parts.append(ctl(["list-timers", "--all", "--no-pager", f"{name}.timer"]))
    return "\n".join(parts)


def remove(name: str, unit_dir: Path, systemctl: Systemctl | None = None, *, detect: bool = True
           ) -> list[str]:
    paths = [unit_dir / f"{name}.timer", unit_dir / f"{name}.service"]
    if not any(path.exists() for path in paths):
        return [f"no {name} units in {unit_dir}: nothing to remove"]
    ctl = systemctl if systemctl is not None or not detect else default_systemctl()
    done = []
    if ctl is not None:
        ctl(["disable", "--now", f"{name}.timer"])
        done.append(f"stopped and disabled {name}.timer")
    for path in paths:
        if path.exists():
            path.unlink()
            done.append(f"removed {path}")
    if ctl is not None:
        ctl(["daemon-reload"])
    return done
