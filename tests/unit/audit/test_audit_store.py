"""The SQLite history: schema and migrations, round trips, and what a killed audit leaves behind."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_testkit import finding

from fleetfix.audit import AuditStore, TargetResult, default_db_path
from fleetfix.audit.store import (
    CORRUPT,
    FULL,
    LOCKED,
    MIGRATIONS,
    SCHEMA_VERSION,
    describe_failure,
    failure_kind,
    migrate,
)
from fleetfix.errors import ConfigError, StoreError

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
    with pytest.raises(ConfigError, match=r"schema v1, this fleetfix needs v\d+: run `fleetfix audit"):
        AuditStore(path)  # never upgraded silently
    with pytest.raises(ConfigError, match=r"fleetfix audit migrate"):
        AuditStore(path, readonly=True)
    with AuditStore(path, migrate=True) as store:
        assert store.migrated_from == 1
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


def test_round_trip_of_results_and_findings(history: str | Path) -> None:
    result = TargetResult(
        target="pve1/200", node="pve1", ctid=200, status="ok",
        findings=(finding("DPKG_INTERRUPTED", pending_updates=3),
                  finding("EXTENSION_MISSING", "warning", extension="fla")),
        facts={"hostname": "ct200"}, duration=1.5, ignored=("TORCH_CPU_ONLY",),
        node_facts={"kernel_module_version": "570.124.06"},
    )
    down = TargetResult(target="pve2/300", node="pve2", ctid=300, status="unreachable", error="refused")
    with AuditStore(history) as store:
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


def test_resolve_run_references(history: str | Path) -> None:
    with AuditStore(history) as store:
        with pytest.raises(ConfigError, match="no audit runs"):
            store.resolve("last")
        first, second = store.start_run(), store.start_run()
        assert store.resolve("last") == second
        assert store.resolve(str(first)) == first
        with pytest.raises(ConfigError, match="expected a run number"):
            store.resolve("yesterday")
        with pytest.raises(ConfigError, match="run 99 not found"):
            store.load(99)


def test_previous_complete_skips_incomplete_runs(history: str | Path) -> None:
    with AuditStore(history) as store:
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


# ---------------------------------------------------------------- the dashboard's history


def _result(target: str, *codes: str, status: str = "ok") -> TargetResult:
    return TargetResult(target=target, node=target.split("/")[0], ctid=None, status=status,
                        findings=tuple(finding(code) for code in codes))


def _record_run(store: AuditStore, started: float, *results: TargetResult, complete: bool = True) -> int:
    run_id = store.start_run(started=started)
    for result in results:
        store.record_target(run_id, result)
    if complete:
        store.finish_run(run_id, finished=started + 1)
    return run_id


def test_since_is_carried_while_a_code_stays_and_restarts_when_it_went_away(history: str | Path) -> None:
    with AuditStore(history) as store:
        _record_run(store, 100.0, _result("pve1/200", "DPKG_INTERRUPTED"), _result("pve1/201"))
        _record_run(store, 200.0, _result("pve1/200", "DPKG_INTERRUPTED", "DISK_LOW"),
                    _result("pve1/201", "DISK_LOW"))
        # 201 unreachable for a night: its problem did not go away, so its streak goes on
        _record_run(store, 300.0, _result("pve1/200", "DISK_LOW"), _result("pve1/201", status="unreachable"))
        killed = _record_run(store, 350.0, _result("pve1/200"), complete=False)  # a real observation
        fourth = _record_run(store, 400.0, _result("pve1/200", "DPKG_INTERRUPTED", "DISK_LOW"),
                             _result("pve1/201", "DISK_LOW"))
        assert store.since(fourth) == {
            ("pve1/200", "DPKG_INTERRUPTED"): 400.0,  # gone in run 3: it came back, a new streak
            ("pve1/200", "DISK_LOW"): 400.0,          # the killed run saw 200 without it
            ("pve1/201", "DISK_LOW"): 200.0,
        }
        assert store.since(killed) == {}


def test_since_of_stale_audit_follows_unprobed_results(history: str | Path) -> None:
    with AuditStore(history) as store:
        _record_run(store, 100.0, _result("pve1/200", status="unreachable"))
        _record_run(store, 200.0, _result("pve1/200", "STALE_AUDIT", status="unreachable"))
        third = _record_run(store, 300.0, _result("pve1/200", "STALE_AUDIT", status="unreachable"))
        assert store.since(third) == {("pve1/200", "STALE_AUDIT"): 200.0}


def test_trend_counts_health_per_run_for_the_last_complete_runs(history: str | Path) -> None:
    with AuditStore(history) as store:
        first = _record_run(store, 100.0, _result("pve1/200"), _result("pve1/201", "DISK_LOW"))
        second = _record_run(store, 200.0, _result("pve1/200", status="unreachable"),
                             _result("pve1/201", "DPKG_INTERRUPTED"), _result("pve1/202"))
        _record_run(store, 250.0, _result("pve1/200", "DISK_LOW"), complete=False)  # killed: left out
        third = _record_run(store, 300.0, _result("pve1/200"), _result("pve1/201"))
        current = _record_run(store, 400.0, _result("pve1/200", "DPKG_INTERRUPTED"), complete=False)
        later = _record_run(store, 500.0, _result("pve1/200"))
        points = store.trend(current, limit=3)
        assert [p.run for p in points] == [second, third, current]  # oldest first; the current run kept
        assert [p.started for p in points] == [200.0, 300.0, 400.0]
        assert points[0].counts == {"unreachable": 1, "error": 1, "healthy": 1}
        assert (points[0].count("error", "unreachable"), points[0].total) == (2, 3)
        assert points[-1].status == "incomplete" and points[-1].counts == {"error": 1}
        assert [p.run for p in store.trend(later, limit=10)] == [first, second, third, later]
        assert store.trend(first, limit=1)[0].counts == {"healthy": 1, "error": 1}
        assert store.trend(0, limit=5) == []


def test_history_queries_use_indexes_not_scans(tmp_path: Path) -> None:
    """At 10,000 targets x 365 runs a scan of target_results is millions of rows: every query that
    recording, loading, drift's baseline, the dashboard's history and staleness make must be an index
    search. The statements are the ones the store really runs (traced), each explained by SQLite."""
    from fleetfix.audit import load_audit

    with AuditStore(tmp_path / "a.db") as store:
        conn = store._conn
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        _record_run(store, 100.0, _result("pve1/200", "DPKG_INTERRUPTED"), _result("pve1/201"))
        _record_run(store, 200.0, _result("pve1/200", "DISK_LOW"), _result("pve1/201", status="unreachable"))
        third = _record_run(store, 300.0, _result("pve1/200", "DISK_LOW"), _result("pve1/202"),
                            complete=False)
        load_audit(store, third)
        store.runs(limit=5)
        store.last_probed("pve1/201")
        store.first_seen("pve1/201")
        conn.set_trace_callback(None)
        queries = sorted({s for s in statements
                          if s.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE"))})
        assert len(queries) > 10
        for query in queries:
            plan = " | ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + query))
            assert not re.search(r"\bSCAN (target_results|states|blobs|targets|t|s|n)\b(?! USING)", plan), (
                query, plan)
        # a target's previous result: backwards on (target, run), not its whole history
        previous = [q for q in queries if "t.target = " in q and "ORDER BY t.run DESC" in q]
        assert previous
        for query in previous:
            plan = " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + query))
            assert "target_results_by_target" in plan, plan


def test_v3_database_gets_since_backfilled_from_its_history(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=3)
    for run, started in ((1, 100.0), (2, 200.0), (3, 300.0)):
        conn.execute("INSERT INTO runs (id, started, status) VALUES (?, ?, 'complete')", (run, started))
        conn.execute("INSERT INTO target_results (run, target, node, status, health)"
                     " VALUES (?, 'pve1/200', 'pve1', 'ok', 'error')", (run,))
        codes = ["DPKG_INTERRUPTED"] + (["DISK_LOW"] if run == 3 else [])
        for seq, code in enumerate(codes):
            conn.execute("INSERT INTO findings (run, target, seq, code, severity, summary)"
                         " VALUES (?, 'pve1/200', ?, ?, 'error', 's')", (run, seq, code))
    conn.close()
    with AuditStore(path, migrate=True) as store:
        assert store.since(3) == {("pve1/200", "DPKG_INTERRUPTED"): 100.0, ("pve1/200", "DISK_LOW"): 300.0}
        assert store.since(1) == {("pve1/200", "DPKG_INTERRUPTED"): 100.0}


# ---------------------------------------------------------------- SQLite's failures, by result code


def raised(action: Callable[[], object]) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        action()
    return caught.value


def test_a_busy_database_is_locked_by_its_code(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with AuditStore(db):
        pass
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing
    try:
        other = sqlite3.connect(db, timeout=0, isolation_level=None)
        error = raised(lambda: other.execute("BEGIN IMMEDIATE"))
        other.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (error.sqlite_errorname, failure_kind(error)) == ("SQLITE_BUSY", LOCKED)
    assert "locked by another process" in str(describe_failure(db, error))


def test_a_full_database_is_full_by_its_code(tmp_path: Path) -> None:
    """SQLITE_FULL for real: the database may not grow past the pages it has (as on a full disk)."""
    db = tmp_path / "a.db"
    with AuditStore(db) as store:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StoreError, match=r"^\S+a\.db: the disk is full: the audit database cannot be "
                                             r"written \(database or disk is full\)$"):
            store.start_run({"padding": "x" * 100_000})
        error = raised(lambda: store._conn.execute("INSERT INTO runs (started, status, args) VALUES "
                                                   "(0, 'incomplete', ?)", ("x" * 100_000,)))
    assert (error.sqlite_errorname, failure_kind(error)) == ("SQLITE_FULL", FULL)


def test_a_damaged_file_is_corrupt_by_its_code(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with AuditStore(db) as store:
        store.finish_run(store.start_run({}))
        page_size = store._conn.execute("PRAGMA page_size").fetchone()[0]
    with db.open("r+b") as raw:  # the tables' pages trashed, the schema kept
        raw.seek(page_size)
        raw.write(b"\xff" * page_size * 3)
    conn = sqlite3.connect(db)
    malformed = raised(lambda: conn.execute("SELECT * FROM runs").fetchall())
    conn.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 1000)
    conn = sqlite3.connect(junk)
    not_a_db = raised(lambda: conn.execute("SELECT * FROM sqlite_master").fetchall())
    conn.close()
    assert (malformed.sqlite_errorname, failure_kind(malformed)) == ("SQLITE_CORRUPT", CORRUPT)
    assert (not_a_db.sqlite_errorname, failure_kind(not_a_db)) == ("SQLITE_NOTADB", CORRUPT)
    assert "audit database is corrupt" in str(describe_failure(db, not_a_db))


def test_any_other_failure_is_said_as_sqlite_says_it(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with AuditStore(db):
        pass
    with AuditStore(db, readonly=True) as store:
        with pytest.raises(StoreError, match=r"audit database error: attempt to write a readonly database$"):
            store.start_run({})
        readonly = raised(lambda: store._conn.execute("DELETE FROM runs"))
    assert readonly.sqlite_errorname == "SQLITE_READONLY" and failure_kind(readonly) is None
    closed = sqlite3.connect(":memory:")
    closed.close()
    no_code = raised(lambda: closed.execute("SELECT 1"))  # the module's own error: no SQLite code
    assert failure_kind(no_code) is None
    assert str(describe_failure(db, no_code)).endswith("audit database error: Cannot operate on a closed "
                                                       "database.")


def test_the_code_decides_not_the_wording(tmp_path: Path) -> None:
    """A message that happens to say "locked" or "full" is not taken for those failures."""
    error = sqlite3.IntegrityError("UNIQUE constraint failed: locked.full")
    error.sqlite_errorcode = sqlite3.SQLITE_CONSTRAINT_UNIQUE
    assert failure_kind(error) is None
    assert str(describe_failure(tmp_path, error)).endswith("audit database error: UNIQUE constraint failed: "
                                                           "locked.full")


def test_audit_migrate_upgrades_what_every_other_command_refuses(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from fleetfix.cli import main

    path = tmp_path / "v5.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=5)
    conn.execute("INSERT INTO runs (started, status) VALUES (1.0, 'complete')")
    conn.close()
    for command in (["history"], ["show", "last"], ["prune", "--keep-days", "1"]):
        refused = CliRunner().invoke(main, ["audit", *command, "--db", str(path)])
        assert refused.exit_code == 2, refused.output
        assert "schema v5, this fleetfix needs v6: run `fleetfix audit migrate`" in refused.output
    done = CliRunner().invoke(main, ["audit", "migrate", "--db", str(path)])
    assert done.exit_code == 0 and "upgraded from v5 to v6" in done.stdout, done.output
    again = CliRunner().invoke(main, ["audit", "migrate", "--db", str(path)])
    assert "v6: up to date" in again.stdout
    history = CliRunner().invoke(main, ["audit", "history", "--db", str(path), "--json"])
    assert [(r["id"], r["site"], r["controller"]) for r in json.loads(history.stdout)] == [
        (1, "default", None)]
