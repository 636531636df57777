"""The SQLite history: schema and migrations, round trips, and what a killed audit leaves behind."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from audit_testkit import finding

from fleetfix.audit import AuditStore, TargetResult, default_db_path
from fleetfix.audit.store import MIGRATIONS, SCHEMA_VERSION, migrate
from fleetfix.errors import ConfigError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def test_db_path_from_env_then_state_dir() -> None:
    assert default_db_path({"FLEETFIX_AUDIT_DB": "/x/h.db", "FLEETFIX_STATE_DIR": "/s"}) == Path("/x/h.db")
    assert default_db_path({"FLEETFIX_STATE_DIR": "/s"}) == Path("/s/audit.db")
    assert default_db_path({"HOME": "/home/u"}) == Path("/home/u/.local/state/fleetfix/audit.db")


def test_new_database_is_wal_and_at_the_current_schema(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "sub" / "a.db"):
        pass
    conn = sqlite3.connect(tmp_path / "sub" / "a.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)


def test_old_database_is_migrated_in_place_keeping_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=1)
    conn.execute("INSERT INTO runs (started, status) VALUES (1.0, 'complete')")
    conn.execute("INSERT INTO target_results (run, target, node, status, health) "
                 "VALUES (1, 'pve1/200', 'pve1', 'ok', 'healthy')")
    conn.close()
    with AuditStore(path) as store:
        run = store.load(1)
    assert [t.target for t in run.targets] == ["pve1/200"]
    assert run.targets[0].ignored == ()  # the v2 column, defaulted for old rows
    assert run.info.parent is None and run.info.remediation is None  # the v3 columns
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_database_is_refused_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    sqlite3.connect(path).execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match=r"newer than this fleetfix"):
        AuditStore(path)


def test_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError, match=r"junk.db: cannot open audit database"):
        AuditStore(path)


def test_round_trip_of_results_and_findings(tmp_path: Path) -> None:
    result = TargetResult(
        target="pve1/200", node="pve1", ctid=200, status="ok",
        findings=(finding("DPKG_INTERRUPTED", pending_updates=3),
                  finding("EXTENSION_MISSING", "warning", extension="fla")),
        facts={"hostname": "ct200"}, duration=1.5, ignored=("TORCH_CPU_ONLY",),
    )
    down = TargetResult(target="pve2/300", node="pve2", ctid=300, status="unreachable", error="refused")
    with AuditStore(tmp_path / "a.db") as store:
        run_id = store.start_run({"limit": "tag:gpu"}, started=100.0)
        store.record_target(run_id, result)
        store.record_target(run_id, down)
        store.finish_run(run_id, finished=112.5)
        loaded = store.load(run_id)
        [info] = store.runs()
    assert loaded.target("pve1/200") == result
    assert loaded.target("pve2/300") == down
    assert (info.status, info.duration, info.args["limit"]) == ("complete", 12.5, "tag:gpu")
    assert (info.target_count, info.error_count, info.unreachable_count) == (2, 1, 1)


def test_resolve_run_references(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "a.db") as store:
        with pytest.raises(ConfigError, match="no audit runs"):
            store.resolve("last")
        first, second = store.start_run(), store.start_run()
        assert store.resolve("last") == second
        assert store.resolve(str(first)) == first
        with pytest.raises(ConfigError, match="expected a run number"):
            store.resolve("yesterday")
        with pytest.raises(ConfigError, match="run 99 not found"):
            store.load(99)


def test_previous_complete_skips_incomplete_runs(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "a.db") as store:
        first = store.start_run()
        store.finish_run(first)
        store.start_run()  # never finished
        third = store.start_run()
        assert store.previous_complete(third) == first
        assert store.previous_complete(first) is None


KILLED_AUDIT = textwrap.dedent("""
    import os, signal, sys
    from audit_testkit import FakeWorld, make_target
    from fleetfix.audit import DEFAULT_POLICY, AuditStore, run_audit
    from fleetfix.fleet import Fleet

    world = FakeWorld({200: "healthy", 201: "problem_case", 202: "healthy", 203: "healthy"})
    targets = [make_target("pve1", ctid) for ctid in (200, 201, 202, 203)]
    done = []

    def progress(report):
        done.append(report.target.name)
        if len(done) == 2:  # two results committed: die the hard way, no cleanup, no finally
            os.kill(os.getpid(), signal.SIGKILL)

    store = AuditStore(sys.argv[1])
    fleet = Fleet(connect=world.connect, channels_per_node=1)  # one at a time: a known cut point
    run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, on_progress=progress)
""")


def test_killed_audit_leaves_an_incomplete_run_with_its_finished_targets(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    child = subprocess.run([sys.executable, "-c", KILLED_AUDIT, str(db)], env=env, capture_output=True,
                           text=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with AuditStore(db) as store:
        [info] = store.runs()
        run = store.load(info.id)
    assert info.status == "incomplete" and info.finished is None
    assert [t.target for t in run.targets] == ["pve1/200", "pve1/201"]
    problem = run.target("pve1/201")
    assert problem is not None and "CUDA_RUNTIME_WITHOUT_TOOLKIT" in {f.code for f in problem.findings}
