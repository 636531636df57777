"""The schedule: units and cron line, quoting, install/remove with a recorded systemctl."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetfix.audit import schedule
from fleetfix.audit.schedule import ScheduleRequest, ScheduleSpec, systemd_quote
from fleetfix.cli import main
from fleetfix.cli.audit import audit_group
from fleetfix.cli.schedule import INPUT_DIRS, INPUT_FILES, OUTPUT_DIRS, OUTPUT_FILES, pin_audit_args
from fleetfix.errors import ConfigError

NASTY = ["-i", "/etc/fleet fix/inv.yaml", "--limit", "tag:gpu,!pve1/1*", "--html", "/srv/r_100%_$HOME.html",
         "--prometheus", 'a"b\\c;d']


def spec(**kwargs: object) -> ScheduleSpec:
    request = ScheduleRequest(name="fleetfix-audit", audit_args=NASTY, db="/var/lib/fleetfix/a.db",
                              **kwargs)  # type: ignore[arg-type]
    return ScheduleSpec.build(request)


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
        ScheduleSpec.build(ScheduleRequest(**{**base, **kwargs}))  # type: ignore[arg-type]


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
    line = schedule.cron_line(spec(randomized_delay="0", working_directory="/srv/fleet 100%"))
    assert line.startswith("0 3 * * * ")
    command = line.removeprefix("0 3 * * * ")
    assert "%" not in command.replace("\\%", "")
    words = shlex.split(command.replace("\\%", "%"))
    assert words == ["cd", "/srv/fleet 100%", "&&", "FLEETFIX_AUDIT_DB=/var/lib/fleetfix/a.db",
                     "timeout", "--kill-after=60", "10800", sys.executable, "-m", "fleetfix", "audit", *NASTY]
    assert "sleep $((" in schedule.cron_line(spec())


def test_the_unit_runs_where_it_was_installed_and_is_stopped_after_its_timeout() -> None:
    service = schedule.service_unit(spec(working_directory="/srv/fleet 100%", timeout="90min"))
    assert "WorkingDirectory=/srv/fleet 100%%\n" in service  # one value; only % is special there
    assert "TimeoutStartSec=90min\n" in service
    assert " 5400 " in schedule.cron_line(spec(timeout="90min"))
    with pytest.raises(ConfigError, match="--timeout"):
        spec(timeout="all night")


def test_an_installed_service_reads_back_as_what_runs(tmp_path: Path) -> None:
    built = spec(working_directory="/srv/fleet 100%")
    schedule.install(built, tmp_path, None, detect=False)
    service = schedule.installed_service("fleetfix-audit", tmp_path)
    assert service is not None
    assert service.argv == built.argv and service.audit_args == tuple(NASTY)
    assert service.working_directory == "/srv/fleet 100%"
    assert service.environment == {"FLEETFIX_AUDIT_DB": "/var/lib/fleetfix/a.db"}
    assert service.timeout == "3h"
    words = shlex.split(service.command_line())
    assert words[:4] == ["cd", "/srv/fleet 100%", "&&", "FLEETFIX_AUDIT_DB=/var/lib/fleetfix/a.db"]
    assert words[4:] == list(built.argv)
    assert schedule.installed_service("other", tmp_path) is None


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


# ---------------------------------------------------------------- paths, as the night will see them


def test_every_path_valued_audit_option_is_pinned_at_install() -> None:
    """A new path option of `fleetfix audit` must say what has to exist at install time, or the nightly
    run would get it relative to wherever systemd or cron starts it."""
    paths = {param.name for param in audit_group.params if isinstance(param.type, click.Path)}
    assert paths == set(INPUT_FILES) | set(INPUT_DIRS) | set(OUTPUT_FILES) | set(OUTPUT_DIRS)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with what an audit reads, entered as a user would before `schedule install`."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "inventory.yaml").write_text("nodes: [{name: pve1, address: 10.1.2.6}]\n")
    (work / "policy.yaml").write_text("severity: {}\n")
    (work / "book.yaml").write_text("name: b\nsteps: [{name: s, apply: 'true'}]\n")
    (work / "key").write_text("")
    monkeypatch.chdir(work)
    monkeypatch.delenv("FLEETFIX_INVENTORY", raising=False)
    monkeypatch.setenv("FLEETFIX_STATE_DIR", str(tmp_path / "state"))
    return work


def test_relative_paths_become_absolute_and_flags_and_values_survive(workdir: Path) -> None:
    pinned = pin_audit_args(
        ["-i", "inventory.yaml", "--policy", "./policy.yaml", "--db", "audit.db", "--html", "out/r.html",
         "--junit=out/j.xml", "--prometheus", "out/m.prom", "--remediate", "book.yaml", "--check",
         "--limit", "tag:x,!pve1/1*", "--var", "a=b", "--var", "c=d", "--deep", "--forks", "4"], workdir)
    assert pinned == [
        "--inventory", f"{workdir}/inventory.yaml", "--limit", "tag:x,!pve1/1*", "--forks", "4",
        "--policy", f"{workdir}/policy.yaml", "--db", f"{workdir}/audit.db", "--deep",
        "--html", f"{workdir}/out/r.html", "--junit", f"{workdir}/out/j.xml",
        "--prometheus", f"{workdir}/out/m.prom", "--remediate", f"{workdir}/book.yaml",
        "--var", "a=b", "--var", "c=d", "--check",
        "--state-dir", str(workdir.parent / "state"),  # the run records, named: the unit has no env
    ]


def test_the_implicit_inventory_is_named(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pin_audit_args([], workdir) == ["--inventory", f"{workdir}/inventory.yaml"]
    other = workdir / "out" / "fleet.yaml"
    other.write_text("nodes: [{name: pve1, address: 10.1.2.6}]\n")
    monkeypatch.setenv("FLEETFIX_INVENTORY", str(other))  # the unit would not have this variable
    assert pin_audit_args([], workdir) == ["--inventory", str(other)]
    assert pin_audit_args(["--host", "10.1.2.6", "--identity", "key"], workdir) == [
        "--host", "10.1.2.6", "--identity", f"{workdir}/key"]  # no inventory with --host


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "nope.yaml"], r"--policy \(policy\): .*/work/nope.yaml: no such file"),
    (["--remediate", "missing.yaml"], r"--remediate \(playbook\): .*/missing.yaml: no such file"),
    (["--html", "reports/r.html"], r"--html \(HTML report\): .*/reports/r.html: no such folder .*/reports"),
    (["--prometheus", "out"], r"--prometheus.*'out' is a directory"),  # click's own check, also now
    (["--db", "gone/a.db"], r"--db \(history database\): .*: no such folder"),
    (["--remediate", "book.yaml", "--state-dir", "policy.yaml"], r"--state-dir.*'policy.yaml' is a file"),
    (["--host", "10.1.2.6", "--identity", "id_nope"], r"--identity \(SSH key\): .*: no such file"),
    (["--no-such-option"], r"audit options: .*--no-such-option"),
    (["--prometheus", "out/m.prom", "--prometheus-group", "no-such-group"],
     r"^audit option --prometheus-group 'no-such-group': no such group on this host"),
    (["--prometheus-group", "daemon"], r"^audit option --prometheus-group daemon: needs --prometheus FILE$"),
])
def test_what_would_fail_tonight_fails_now(workdir: Path, args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        pin_audit_args(args, workdir)


def test_the_textfile_group_reaches_the_unit(workdir: Path) -> None:
    units = workdir / "units"
    install = CliRunner().invoke(main, ["schedule", "install", "--unit-dir", str(units), "--",
                                        "--prometheus", "out/m.prom", "--prometheus-group", "daemon"])
    assert install.exit_code == 0, install.output
    [exec_start] = [line for line in (units / "fleetfix-audit.service").read_text().splitlines()
                    if line.startswith("ExecStart=")]
    assert exec_start.endswith(f" --prometheus {workdir}/out/m.prom --prometheus-group daemon "
                               f"--inventory {workdir}/inventory.yaml")


def test_no_inventory_at_all_fails_at_install(workdir: Path) -> None:
    (workdir / "inventory.yaml").unlink()
    with pytest.raises(ConfigError, match="inventory file not found"):
        pin_audit_args([], workdir)


def test_schedule_show_prints_what_runs_and_what_would_fail(workdir: Path) -> None:
    units = workdir / "units"
    install = CliRunner().invoke(main, ["schedule", "install", "--unit-dir", str(units), "--",
                                        "-i", "inventory.yaml", "--html", "out/r.html"])
    assert install.exit_code == 0, install.output
    shown = CliRunner().invoke(main, ["schedule", "show", "--unit-dir", str(units)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"# what runs (from {units}/fleetfix-audit.service):"
    assert shlex.split(lines[1])[:3] == ["cd", str(workdir), "&&"]
    assert shlex.split(lines[1])[-5:] == ["audit", "--inventory", f"{workdir}/inventory.yaml",
                                         "--html", f"{workdir}/out/r.html"]
    assert lines[2] == "# stopped after 3h (TimeoutStartSec=)"
    assert "warning" not in shown.stdout and "[Timer]" in shown.stdout
    (workdir / "inventory.yaml").unlink()
    shown = CliRunner().invoke(main, ["schedule", "show", "--unit-dir", str(units)])
    assert f"# warning: it would fail: audit option --inventory (inventory): {workdir}/inventory.yaml: " \
           "no such file" in shown.stdout


def test_a_postgresql_history_goes_into_the_unit_as_given_and_never_with_a_password(workdir: Path) -> None:
    url = "postgresql://audit@127.0.0.1:5433/fleet?password=@file:/etc/fleetfix/pg-password"
    build = ScheduleSpec.build
    service = schedule.service_unit(build(ScheduleRequest(name="fleetfix-audit", audit_args=[], db=url)))
    assert f"FLEETFIX_AUDIT_DB={url}" in service and "/fleet?" in service  # not made a path
    with pytest.raises(ConfigError, match="a password in the URL") as refused:
        build(ScheduleRequest(name="fleetfix-audit", audit_args=[], db="postgresql://audit:hunter2@127.0.0.1/fleet"))
    assert "hunter2" not in str(refused.value)
    units = workdir / "units"
    plain = "postgresql://audit@127.0.0.1/fleet?password=plain"
    cli = CliRunner().invoke(main, ["schedule", "install", "--unit-dir", str(units), "--",
                                    "-i", "inventory.yaml", "--db", plain, "--site", "east"])
    assert cli.exit_code == 2 and "must be a reference" in cli.output and "plain" not in cli.output
    assert not units.exists() or not list(units.iterdir())
    cli = CliRunner().invoke(main, ["schedule", "install", "--unit-dir", str(units), "--",
                                    "-i", "inventory.yaml", "--db", url, "--site", "east"])
    assert cli.exit_code == 0, cli.output
    unit = (units / "fleetfix-audit.service").read_text()
    assert url in unit and "--site east" in unit
