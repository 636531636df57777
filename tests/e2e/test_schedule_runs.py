"""The scheduled audit survives the night: `schedule install` run from a fleet folder with relative paths
writes a unit and a cron line that really run from `/`, with the environment systemd or cron gives them,
against a container of the test bed (issue 23: relative paths went into ExecStart= unchanged, and the
unit, started in `/`, failed on its first night)."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.scenarios import problem_case
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.unit.audit.test_audit_schedule import unquote_systemd

REPO = Path(__file__).resolve().parents[2]
# What systemd gives a system service without User= (no HOME), and what cron gives a job.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CRON_PATH = "/usr/bin:/bin"
BOOK = "name: marker\nsteps:\n  - name: marker present\n    check: test -e /root/scheduled\n" \
       "    apply: touch /root/scheduled\n"


def fleetfix(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def runs_in(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        count: int = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return count


@pytest.mark.slow
def test_unit_and_cron_line_installed_from_a_relative_folder_run_from_slash(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    where = subprocess.run([sys.executable, "-c", "import fleetfix; print(fleetfix.__file__)"], cwd="/",
                           capture_output=True, text=True, check=False).stdout.strip()
    if not where.startswith(str(REPO)):
        pytest.skip(f"{sys.executable} does not import this checkout from / (it imports {where!r}): the "
                    "unit would run another fleetfix")
    ct = make_ct(setup=problem_case)
    node = lab.node(None)
    fleet = tmp_path / "fleet"  # a user's folder: inventory, keys, policy, playbook, reports
    (fleet / "out").mkdir(parents=True)
    shutil.copy(lab.client_key, fleet / "client_key")
    shutil.copy(lab.known_hosts, fleet / "known_hosts")
    (fleet / "inventory.yaml").write_text(yaml.safe_dump({
        "defaults": {"identity_file": "client_key", "known_hosts": "known_hosts"},  # relative to the file
        "nodes": [{"name": node.name, "address": node.address, "port": node.port,
                   "containers": [{"ctid": ct.ctid, "name": "train-a"}]}],
    }))
    (fleet / "policy.yaml").write_text("severity: {GPU_NOT_VISIBLE: ignore}\n")
    (fleet / "book.yaml").write_text(BOOK)
    home = tmp_path / "home"
    home.mkdir()
    user_env = {"PATH": os.environ["PATH"], "HOME": str(home), "NO_COLOR": "1"}
    audit_options = ["--", "-i", "inventory.yaml", "--policy", "policy.yaml", "--db", "audit.db",
                     "--html", "out/report.html", "--junit", "out/junit.xml",
                     "--prometheus", "out/fleet.prom", "--remediate", "book.yaml", "--check"]

    # systemd: the unit as `install` would write it, its ExecStart= run from / with the unit's environment
    dry = fleetfix("schedule", "install", "--dry-run", "--unit-dir", "units", *audit_options,
                   cwd=fleet, env=user_env)
    assert dry.returncode == 0, dry.stderr
    unit = {key: value for key, _, value in (line.partition("=") for line in dry.stdout.splitlines()
                                             if "=" in line and not line.startswith("#"))}
    assert unit["WorkingDirectory"] == str(fleet) and unit["TimeoutStartSec"] == "3h"
    assert "Environment" not in unit  # --db was given: nothing else to pin
    argv = unquote_systemd(unit["ExecStart"])
    assert argv[:4] == [sys.executable, "-m", "fleetfix", "audit"]
    for option in ("--inventory", "--policy", "--db", "--html", "--junit", "--prometheus", "--remediate"):
        assert argv[argv.index(option) + 1].startswith(f"{fleet}/"), (option, argv)
    assert argv[argv.index("--state-dir") + 1] == str(home / ".local" / "state" / "fleetfix")
    night = subprocess.run(argv, cwd="/", env={"PATH": SYSTEMD_PATH}, text=True, capture_output=True,
                           timeout=300, check=False)
    assert night.returncode == 3, night.stdout + night.stderr  # the problem case: error findings
    assert "train-a  error" in night.stdout and "1 ignored by policy" in night.stdout
    assert "remediation --check of run 1" in night.stdout
    for report in ("report.html", "junit.xml", "fleet.prom"):
        assert (fleet / "out" / report).stat().st_size > 0, report
    assert runs_in(fleet / "audit.db") == 1
    records = home / ".local" / "state" / "fleetfix" / "runs"  # pinned: the unit has no HOME
    assert len(list(records.iterdir())) == 1

    # cron: the line as printed, run by sh from / with cron's environment
    cron = fleetfix("schedule", "install", "--cron", "--randomized-delay", "0", *audit_options,
                    cwd=fleet, env=user_env)
    assert cron.returncode == 0, cron.stderr
    fields = cron.stdout.strip().split(" ", 5)
    assert fields[:5] == ["0", "3", "*", "*", "*"]
    command = fields[5].replace("\\%", "%")  # what cron hands to sh
    assert shlex.split(command)[:3] == ["cd", str(fleet), "&&"]
    night = subprocess.run(["/bin/sh", "-c", command], cwd="/", text=True, capture_output=True,
                           env={"PATH": CRON_PATH, "HOME": str(home), "SHELL": "/bin/sh"}, timeout=300,
                           check=False)
    assert night.returncode == 3, night.stdout + night.stderr
    assert "drift since run 1: none" in night.stdout
    assert runs_in(fleet / "audit.db") == 2
