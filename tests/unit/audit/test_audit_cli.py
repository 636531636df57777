"""`fleetfix audit` / `fleetfix schedule` through click, registered on the real main group."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from audit_testkit import FakeWorld, edited, interrupt_dpkg, make_target
from click.testing import CliRunner

from fleetfix.audit import DEFAULT_POLICY, AuditStore, run_audit
from fleetfix.cli import main
from fleetfix.cli.audit import audit_group
from fleetfix.cli.schedule import schedule_group

ROOT = Path(__file__).resolve().parents[3]

main.add_command(audit_group)
main.add_command(schedule_group)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A history of two runs: the second has a new DPKG_INTERRUPTED on pve1/201."""
    path = tmp_path / "audit.db"
    world = FakeWorld({200: "healthy", 201: "healthy"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    with AuditStore(path) as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        world.cts[201] = edited("healthy", interrupt_dpkg)
        run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
    return path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_history_lists_runs_newest_first(db: Path) -> None:
    code, out, _ = invoke("audit", "history", "--db", str(db))
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["RUN", "STARTED", "STATUS"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "1"]
    code, out, _ = invoke("audit", "history", "--db", str(db), "--json")
    assert [run["errors"] for run in json.loads(out)] == [1, 0]


def test_show_re_renders_with_drift_and_writes_files(db: Path, tmp_path: Path) -> None:
    html, junit, prom = tmp_path / "r.html", tmp_path / "r.xml", tmp_path / "r.prom"
    code, out, _ = invoke("audit", "show", "last", "--db", str(db), "--html", str(html),
                          "--junit", str(junit), "--prometheus", str(prom))
    assert code == 0
    assert out.splitlines()[1] == "drift since run 1:" and "NEW       pve1/201" in out
    assert "DPKG_INTERRUPTED" in html.read_text() and "<testsuites" in junit.read_text()
    assert "fleetfix_audit_findings{code=\"DPKG_INTERRUPTED\"} 1" in prom.read_text()


def test_diff_between_two_runs_both_ways(db: Path) -> None:
    code, out, _ = invoke("audit", "diff", "1", "2", "--db", str(db), "--json")
    assert code == 0 and [c["code"] for c in json.loads(out)["new_findings"]] == ["DPKG_INTERRUPTED"]
    code, out, _ = invoke("audit", "diff", "2", "1", "--db", str(db))
    assert "RESOLVED  pve1/201: DPKG_INTERRUPTED" in out


def test_unknown_run_is_one_line_exit_2(db: Path) -> None:
    code, _, err = invoke("audit", "show", "7", "--db", str(db))
    assert code == 2 and err.strip().endswith("run 7 not found") and len(err.strip().splitlines()) == 1


def test_bad_policy_is_one_line_exit_2(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("severity:\n  DPKG_INTERRUPTED: fatal\n")
    code, _, err = invoke("audit", "--policy", str(policy), "--db", str(tmp_path / "a.db"),
                          "--host", "127.0.0.1")
    assert code == 2 and "p.yaml:2: severity.DPKG_INTERRUPTED" in err and len(err.strip().splitlines()) == 1


def test_unreachable_target_exits_4_and_is_recorded(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = tmp_path / "a.db"
    code, out, _ = invoke("audit", "--db", str(db), "--host", "127.0.0.1", "--port", str(port),
                          "--connect-timeout", "2", "--json")
    data = json.loads(out)
    assert code == 4 and data["exit_code"] == 4 and data["targets"][0]["status"] == "unreachable"
    with AuditStore(db) as store:
        [run] = store.runs()
    assert run.status == "complete" and run.unreachable_count == 1


def test_schedule_dry_run_and_cron(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes: [{name: pve1, address: 10.1.2.6}]\n")
    units = tmp_path / "units"
    code, out, _ = invoke("schedule", "install", "--dry-run", "--unit-dir", str(units), "--",
                          "-i", str(inventory), "--json")
    assert code == 0 and "[Timer]" in out and "ExecStart=" in out and "--json" in out
    assert not units.exists()  # dry run wrote nothing
    monkeypatch.chdir(tmp_path)  # ./inventory.yaml, the audit's default
    code, out, _ = invoke("schedule", "install", "--cron", "--at", "04:15", "--", "--limit", "tag:gpu")
    assert code == 0 and out.startswith("15 4 * * * ")
    assert f"--inventory {inventory}" in out  # named: cron would not start in this folder


def test_schedule_refuses_audit_options_that_do_not_parse(tmp_path: Path) -> None:
    code, _, err = invoke("schedule", "install", "--dry-run", "--", "--no-such-option")
    assert code == 2 and "audit options" in err and "--no-such-option" in err
    code, _, err = invoke("schedule", "install", "--dry-run", "--", "history")
    assert code == 2 and "unexpected extra argument" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--check"], "need --remediate PLAYBOOK"),
    (["--var", "a=b"], "need --remediate PLAYBOOK"),
    (["--remediate", "nope.yaml"], "nope.yaml"),
    (["--remediate", str(ROOT / "playbooks/cuda-toolkit.yaml"), "--var", "not an identifier=1"], "--var"),
])
def test_remediate_options_are_checked_before_anything_is_probed(
    tmp_path: Path, args: list[str], message: str,
) -> None:
    db = tmp_path / "a.db"
    with socket.socket() as sock:  # nothing listens: had it probed, it would have recorded a run
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = invoke("audit", "--db", str(db), "--host", "127.0.0.1", "--port", str(port), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    with AuditStore(db) as store:
        assert store.runs() == []


@pytest.mark.parametrize(("args", "message"), [
    (["--prometheus", "m.prom", "--prometheus-group", "no-such-group"],
     "fleetfix: error: --prometheus-group 'no-such-group': no such group on this host "
     "(getent group no-such-group)"),
    (["--prometheus-group", "daemon"], "fleetfix: error: --prometheus-group daemon: needs --prometheus FILE"),
])
def test_the_textfile_group_is_checked_before_anything_is_probed(
    tmp_path: Path, args: list[str], message: str,
) -> None:
    db = tmp_path / "a.db"
    code, _, err = invoke("audit", "--db", str(db), "--host", "127.0.0.1", "--port", "1", *args)
    assert code == 2 and err == message + "\n"
    with AuditStore(db) as store:
        assert store.runs() == []


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_second_audit_of_the_same_history_exits_instead_of_interleaving(
    tmp_path: Path, closed_port: int,
) -> None:
    """The guard docs/audit.md states: one audit per history at a time (a flock on `<db>.lock`); a cron
    line firing while last night's audit still hangs exits 1 at once, recording nothing."""
    from fleetfix.audit.lock import exclusive_audit

    db = tmp_path / "audit.db"
    with AuditStore(db):  # an existing history (reading never creates one)
        pass
    audit = ("audit", "--db", str(db), "--host", "127.0.0.1", "--port", str(closed_port),
             "--connect-timeout", "2")
    with exclusive_audit(db):  # the running audit (a lock is per open file: this process counts)
        code, out, err = invoke(*audit)
        assert code == 1 and out == ""
        assert err.startswith(f"fleetfix: error: {db}: another audit of this history is running (pid ")
        assert "TimeoutStartSec=" in err  # the hint
        assert invoke("audit", "history", "--db", str(db))[0] == 0  # readers take no lock
    with AuditStore(db) as store:
        assert store.runs() == []
    code, _, _ = invoke(*audit)  # released with the holder: the next audit runs
    assert code == 4
    with AuditStore(db) as store:
        assert len(store.runs()) == 1
