"""The schedule: units and cron line, quoting, install/remove with a recorded systemctl."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from fleetfix.audit import schedule
from fleetfix.audit.schedule import ScheduleSpec, systemd_quote
from fleetfix.errors import ConfigError

NASTY = ["-i", "/etc/fleet fix/inv.yaml", "--limit", "tag:gpu,!pve1/1*", "--html", "/srv/r_100%_$HOME.html",
         "--prometheus", 'a"b\\c;d']


def spec(**kwargs: object) -> ScheduleSpec:
    return ScheduleSpec.build(name="fleetfix-audit", audit_args=NASTY, db="/var/lib/fleetfix/a.db",
                              **kwargs)  # type: ignore[arg-type]


def test_timer_defaults_daily_at_3_persistent_randomized() -> None:
    timer = schedule.timer_unit(spec())
    assert "OnCalendar=*-*-* 03:00:00\n" in timer and "Persistent=true\n" in timer
    assert "RandomizedDelaySec=900\n" in timer and "Unit=fleetfix-audit.service\n" in timer
    assert "OnCalendar=*-*-* 02:30:00\n" in schedule.timer_unit(spec(at="2:30"))
    assert "OnCalendar=Mon *-*-* 01:00:00\n" in schedule.timer_unit(spec(on_calendar="Mon *-*-* 01:00:00"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"at": "25:00"}, "--at"), ({"on_calendar": "daily\nExecStart=/bin/evil"}, "--on-calendar"),
    ({"randomized_delay": "soon"}, "--randomized-delay"), ({"name": "../etc/x"}, "--name"),
    ({"audit_args": ["--limit", "a\nExecStartPre=/bin/evil"]}, "control characters"),
])
def test_bad_values_are_refused(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"name": "fleetfix-audit"}
    with pytest.raises(ConfigError, match=message):
        ScheduleSpec.build(**{**base, **kwargs})  # type: ignore[arg-type]


def unquote_systemd(line: str) -> list[str]:
    """Just enough of systemd's ExecStart= word splitting to check systemd_quote round-trips."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word = ""
        if line[i] == '"':
            i += 1
            while line[i] != '"':
                if line[i] == "\\":
                    i += 1
                word += line[i]
                i += 1
            i += 1
        else:
            while i < len(line) and line[i] != " ":
                word += line[i]
                i += 1
        words.append(word.replace("%%", "%").replace("$$", "$"))
    return words


def test_exec_start_round_trips_every_word() -> None:
    service = schedule.service_unit(spec())
    [exec_start] = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    assert unquote_systemd(exec_start.removeprefix("ExecStart=")) == [
        sys.executable, "-m", "fleetfix", "audit", *NASTY]
    assert systemd_quote("plain/word-1.0") == "plain/word-1.0"
    assert 'Environment="FLEETFIX_AUDIT_DB=/var/lib/fleetfix/a.db"' in service


def test_cron_line_is_sh_words_with_percent_escaped() -> None:
    line = schedule.cron_line(spec(randomized_delay="0"))
    assert line.startswith("0 3 * * * ")
    command = line.removeprefix("0 3 * * * ")
    assert "%" not in command.replace("\\%", "")
    words = shlex.split(command.replace("\\%", "%"))
    assert words == ["FLEETFIX_AUDIT_DB=/var/lib/fleetfix/a.db", sys.executable, "-m", "fleetfix", "audit",
                     *NASTY]
    assert "sleep $((" in schedule.cron_line(spec())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    for name, text in schedule.units(spec()).items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", *(str(p) for p in sorted(tmp_path.iterdir()))],
                          capture_output=True, text=True, check=False)
    mine = [line for line in done.stderr.splitlines() if "fleetfix-audit" in line]
    assert done.returncode == 0 and not mine, done.stderr


def test_install_show_remove_with_a_recorded_systemctl(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def systemctl(args: Sequence[str]) -> str:
        calls.append(list(args))
        return "NEXT LEFT\n"

    done = schedule.install(spec(), tmp_path, systemctl)
    assert (tmp_path / "fleetfix-audit.timer").read_text() == schedule.timer_unit(spec())
    assert calls == [["daemon-reload"], ["enable", "--now", "fleetfix-audit.timer"]]
    assert done[-1] == "enabled and started fleetfix-audit.timer"
    shown = schedule.show("fleetfix-audit", tmp_path, systemctl)
    assert "OnCalendar=" in shown and "ExecStart=" in shown and "NEXT LEFT" in shown
    calls.clear()
    schedule.remove("fleetfix-audit", tmp_path, systemctl)
    assert calls == [["disable", "--now", "fleetfix-audit.timer"], ["daemon-reload"]]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="no fleetfix-audit units"):
        schedule.show("fleetfix-audit", tmp_path, systemctl)


def test_install_without_systemd_writes_units_and_says_how_to_enable(tmp_path: Path) -> None:
    done = schedule.install(spec(), tmp_path, None, detect=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleetfix-audit.service", "fleetfix-audit.timer"]
    assert "systemctl enable --now fleetfix-audit.timer" in done[-1]
