"""Audit history in SQLite: one row per run, per target result, per finding.

Durability model: a run row is inserted as `incomplete` when the audit starts; each target's result (its
row and its findings) is one transaction, committed as the result arrives; the run becomes `complete`
only at the end. So a killed audit leaves a consistent database whose run says `incomplete` and keeps
every target that had finished. WAL mode lets `audit history` read while an audit writes, and a process
killed mid-write leaves the WAL to be recovered by the next open.

Schema changes go in MIGRATIONS: entry N turns a version N-1 database into version N (`PRAGMA
user_version`), each in its own transaction, so an old database is upgraded in place on open.

The dashboard's history (the trend of the last N runs, since when each target has shown each finding code)
must stay cheap at 10,000 targets x 365 runs. So "since" is not searched for at read time (that would walk
every target's whole history); it is carried forward at write time: a finding row's `since` is the `since`
of the same code in the target's previous result, or the start of its own run when the code is new. One
indexed lookup per recorded target; reading it back is one range scan of the run.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

from fleetfix.audit.model import RunInfo, StoredRun, TargetResult, TrendPoint
from fleetfix.errors import ConfigError, StoreError
from fleetfix.paths import default_state_dir, private_dir, private_file
from fleetfix.probe import Finding

DB_ENV = "FLEETFIX_AUDIT_DB"
DB_FILE = "audit.db"

# How a finding's `since` is carried forward (see the module docstring). The target's previous result is
# its newest earlier *probed* result when this one was probed (a night it was unreachable does not end a
# streak: its problem did not go away), else its newest earlier result of any kind (STALE_AUDIT is raised
# on unprobed targets). Appended to: a WHERE clause choosing the rows of `findings` to fill in.
_SINCE_UPDATE = """
UPDATE findings SET since = COALESCE(
    (SELECT MIN(p.since) FROM findings p
      WHERE p.run = (
        CASE (SELECT c.status FROM target_results c WHERE c.run = findings.run AND c.target = findings.target)
        WHEN 'ok' THEN (SELECT MAX(t.run) FROM target_results t
                         WHERE t.target = findings.target AND t.status = 'ok' AND t.run < findings.run)
        ELSE (SELECT MAX(t.run) FROM target_results t
               WHERE t.target = findings.target AND t.run < findings.run)
        END)
      -- unary + keeps the planner on the primary key (run, target): findings_by_code (code, run)
      -- would scan every target of that run with the code
      AND p.target = findings.target AND +p.code = findings.code),
    (SELECT r.started FROM runs r WHERE r.id = findings.run))
"""

Migration = str | Callable[[sqlite3.Connection], None]


def _backfill_since(conn: sqlite3.Connection) -> None:
    """Fill in `since` for the findings recorded before v4, run by run in order (each run reads the one
    before it): once, when an old database is opened, one statement per run."""
    for (run_id,) in conn.execute("SELECT id FROM runs ORDER BY id").fetchall():
        conn.execute(_SINCE_UPDATE + " WHERE run = ?", (run_id,))


# MIGRATIONS[n - 1] upgrades version n - 1 to n. Never edit an entry once released: append a new one.
# An entry is SQL statements, or a function for a data migration SQL alone cannot express.
MIGRATIONS: tuple[tuple[Migration, ...], ...] = (
    (  # 1: the tables
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            started REAL NOT NULL,
            finished REAL,
            status TEXT NOT NULL CHECK (status IN ('complete', 'incomplete')),
            args TEXT NOT NULL DEFAULT '{}',
            duration REAL
        )""",
        """CREATE TABLE target_results (
            run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            target TEXT NOT NULL,
            node TEXT NOT NULL,
            ctid INTEGER,
            status TEXT NOT NULL,
            health TEXT NOT NULL,
            error TEXT,
            duration REAL NOT NULL DEFAULT 0,
            facts TEXT,
            PRIMARY KEY (run, target)
        )""",
        """CREATE TABLE findings (
            run INTEGER NOT NULL,
            target TEXT NOT NULL,
            seq INTEGER NOT NULL,
            code TEXT NOT NULL,
            severity TEXT NOT NULL,
            summary TEXT NOT NULL,
            evidence TEXT NOT NULL DEFAULT '{}',
            fix TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (run, target, seq),
            FOREIGN KEY (run, target) REFERENCES target_results(run, target) ON DELETE CASCADE
        )""",
    ),
    (  # 2: codes the policy ignored, per target; an index for "since when has this code been seen"
        "ALTER TABLE target_results ADD COLUMN ignored TEXT NOT NULL DEFAULT '[]'",
        "CREATE INDEX findings_by_code ON findings(code, run)",
    ),
    (  # 3: `audit --remediate`: the re-probe run links to the audit run it remediated; what was done
        "ALTER TABLE runs ADD COLUMN parent INTEGER REFERENCES runs(id)",
        "ALTER TABLE runs ADD COLUMN remediation TEXT",
        "CREATE INDEX target_results_by_target ON target_results(target, status)",
    ),
    (  # 4: the dashboard's history: since when a target has shown a finding code; health counts per run
        "ALTER TABLE findings ADD COLUMN since REAL",
        "ALTER TABLE target_results ADD COLUMN node_facts TEXT",  # the host driver, for the version matrix
        # the target's previous (probed) result: one seek, where (target, status) alone scans its history
        "CREATE INDEX target_results_by_target_run ON target_results(target, status, run)",
        # the trend counts health per run from the index alone, never reading the facts-heavy rows
        "CREATE INDEX target_results_by_run_health ON target_results(run, health)",
        _backfill_since,
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_AUDIT_DB, else <state dir>/audit.db (the state dir of `apply`'s run records)."""
    env = os.environ if environ is None else environ
    if env.get(DB_ENV):
        return Path(env[DB_ENV])
    return default_state_dir(env) / DB_FILE


def migrate(conn: sqlite3.Connection, *, target_version: int = SCHEMA_VERSION) -> int:
    """Bring the schema up to target_version; returns the version found. Refuses a newer database."""
    found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise ConfigError(f"audit database schema v{found} is newer than this fleetfix (v{SCHEMA_VERSION})")
    for version in range(found + 1, target_version + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version - 1]:
                if isinstance(statement, str):
                    conn.execute(statement)
                else:
                    statement(conn)
            conn.execute(f"PRAGMA user_version = {version:d}")  # PRAGMA takes no parameters
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return found


def describe_failure(path: Path, error: sqlite3.Error) -> StoreError:
    """One line for what SQLite said, with what to do: the cases an operator meets (issue 18)."""
    text = " ".join(str(error).split())
    if "locked" in text or "busy" in text:
        return StoreError(f"{path}: the audit database is locked by another process (an audit or a reader "
                          "still running?); try again when it has finished")
    if "full" in text:
        return StoreError(f"{path}: the disk is full: the audit database cannot be written ({text})")
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return StoreError(f"{path}: the audit database is corrupt ({text}); move it aside to start a new "
                          "history (sqlite3's .recover may save the old one)")
    return StoreError(f"{path}: audit database error: {text}")


F = TypeVar("F", bound=Callable[..., Any])


def _guarded(method: F) -> F:
    """SQLite's errors out of a store method as one-line StoreErrors, never tracebacks."""

    @functools.wraps(method)
    def wrapper(self: AuditStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as error:
            raise describe_failure(self.path, error) from None

    return wrapper  # type: ignore[return-value]


class AuditStore:
    """The history database. Thread-safe: one connection, one lock (results arrive from worker threads).

    readonly: for commands that only read (history, show, diff): the file must exist (a mistyped --db is
    an error, never a new empty database) and is opened read-only. Written, it is 0600 in a 0700 state
    dir whatever the umask; SQLite gives its -wal and -shm files the database's own permissions.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.is_file():
            raise ConfigError("no audit database here (a typo in --db? `fleetfix audit` creates it)",
                              path=str(self.path))
        try:
            if not readonly:
                private_dir(self.path.parent)
                private_file(self.path)
            # isolation_level=None: transactions are explicit (BEGIN/COMMIT below), never implicit.
            target = f"file:{quote(str(self.path.resolve()))}?mode=ro" if readonly else str(self.path)
            self._conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                         timeout=30.0, uri=readonly)
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable against a killed process in WAL mode (only power loss can drop the
            # last commits, never corrupt): the case the audit must survive.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            if readonly:
                found = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
                if found != SCHEMA_VERSION:
                    raise ConfigError(f"audit database schema v{found}, this fleetfix reads v{SCHEMA_VERSION}"
                                      " (an audit run upgrades an older one)", path=str(self.path))
            else:
                migrate(self._conn)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc) or "full" in str(exc):
                raise describe_failure(self.path, exc) from None
            raise ConfigError(f"cannot open audit database: {exc}", path=str(self.path)) from None
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot open audit database: {exc}", path=str(self.path)) from None
        except OSError as exc:
            raise ConfigError(f"cannot create audit database: {exc.strerror or exc}",
                              path=str(self.path)) from None
        self._lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------------------

    @_guarded
    def start_run(self, args: Mapping[str, Any] | None = None, *, started: float | None = None,
                  parent: int | None = None, remediation: Mapping[str, Any] | None = None) -> int:
        with self._lock:
            cursor = self._conn.execute(
                "INSERT INTO runs (started, status, args, parent, remediation)"
                " VALUES (?, 'incomplete', ?, ?, ?)",
                (time.time() if started is None else started, json.dumps(dict(args or {}), default=str),
                 parent, None if remediation is None else json.dumps(dict(remediation), default=str)),
            )
            return int(cursor.lastrowid or 0)

    @_guarded
    def set_remediation(self, run_id: int, remediation: Mapping[str, Any]) -> None:
        """Attach what a remediation did to a run whose results it did not change (check mode, nothing
        to remediate, an aborted apply): there is no re-probe run to carry it."""
        with self._lock:
            self._conn.execute("UPDATE runs SET remediation = ? WHERE id = ?",
                               (json.dumps(dict(remediation), default=str), run_id))

    @_guarded
    def record_target(self, run_id: int, result: TargetResult) -> None:
        """One target's result and findings, in one transaction, committed before returning."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO target_results (run, target, node, ctid, status, health, error,"
                    " duration, facts, ignored, node_facts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, result.target, result.node, result.ctid, result.status, result.health,
                     result.error, result.duration,
                     None if result.facts is None else json.dumps(result.facts),
                     json.dumps(list(result.ignored)),
                     None if result.node_facts is None else json.dumps(result.node_facts)),
                )
                self._conn.executemany(
                    "INSERT INTO findings (run, target, seq, code, severity, summary, evidence, fix)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(run_id, result.target, seq, f.code, f.severity.value, f.summary,
                      json.dumps(f.model_dump(mode="json")["evidence"]),
                      json.dumps(f.fix.model_dump(mode="json")))
                     for seq, f in enumerate(result.findings)],
                )
                if result.findings:
                    self._conn.execute(_SINCE_UPDATE + " WHERE run = ? AND target = ?",
                                       (run_id, result.target))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @_guarded
    def finish_run(self, run_id: int, *, finished: float | None = None) -> None:
        with self._lock:
            end = time.time() if finished is None else finished
            self._conn.execute(
                "UPDATE runs SET status = 'complete', finished = ?, duration = ? - started WHERE id = ?",
                (end, end, run_id),
            )

    # -- reading ---------------------------------------------------------------------------------------

    @_guarded
    def runs(self, *, limit: int | None = None) -> list[RunInfo]:
        """Runs, newest first, with per-run counts."""
        query = (
            f"SELECT {_RUN_COLUMNS}"
            " FROM runs r LEFT JOIN target_results t ON t.run = r.id GROUP BY r.id ORDER BY r.id DESC"
        )
        params: tuple[int, ...] = ()
        if limit is not None:
            query += " LIMIT ?"
            params = (limit,)
        with self._lock:
            rows = self._conn.execute(query, params).fetchall()
        return [_run_info(row) for row in rows]

    @_guarded
    def resolve(self, ref: str) -> int:
        """A run id from what a user typed: a number, or "last" / "latest" (newest run)."""
        if ref in ("last", "latest"):
            newest = self.runs(limit=1)
            if not newest:
                raise ConfigError("no audit runs recorded yet", path=str(self.path))
            return newest[0].id
        if not ref.isdigit():
            raise ConfigError(f"run {ref!r}: expected a run number or 'last'")
        return int(ref)

    @_guarded
    def load(self, run_id: int) -> StoredRun:
        with self._lock:
            info = [_run_info(row) for row in self._conn.execute(
                f"SELECT {_RUN_COLUMNS}"
                " FROM runs r LEFT JOIN target_results t ON t.run = r.id WHERE r.id = ? GROUP BY r.id",
                (run_id,),
            )]
            if not info:
                raise ConfigError(f"run {run_id} not found", path=str(self.path))
            targets = self._conn.execute(
                "SELECT target, node, ctid, status, error, duration, facts, ignored, node_facts"
                " FROM target_results"
                " WHERE run = ? ORDER BY target", (run_id,),
            ).fetchall()
            findings: dict[str, list[Finding]] = {}
            for target, code, severity, summary, evidence, fix in self._conn.execute(
                "SELECT target, code, severity, summary, evidence, fix FROM findings WHERE run = ?"
                " ORDER BY target, seq", (run_id,),
            ):
                findings.setdefault(target, []).append(Finding.model_validate({
                    "code": code, "severity": severity, "summary": summary,
                    "evidence": json.loads(evidence), "fix": json.loads(fix),
                }))
        results = tuple(
            TargetResult(target=name, node=node, ctid=ctid, status=status, error=error,
                         findings=tuple(findings.get(name, ())), duration=duration or 0.0,
                         facts=None if facts is None else json.loads(facts),
                         ignored=tuple(json.loads(ignored)),
                         node_facts=None if node_facts is None else json.loads(node_facts))
            for name, node, ctid, status, error, duration, facts, ignored, node_facts in targets
        )
        return StoredRun(info[0], results)

    @_guarded
    def previous_complete(self, run_id: int) -> int | None:
        """The newest complete run before run_id: the baseline drift is measured against."""
        with self._lock:
            row = self._conn.execute(
                "SELECT MAX(id) FROM runs WHERE id < ? AND status = 'complete'", (run_id,)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @_guarded
    def latest_complete_runs(self, before: int) -> dict[str, int]:
        """Each target's newest complete run before `before` (drift's per-target baseline)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT t.target, MAX(t.run) FROM target_results t JOIN runs r ON r.id = t.run"
                " WHERE r.status = 'complete' AND t.run < ? GROUP BY t.target", (before,)).fetchall()
        return {str(target): int(run) for target, run in rows}

    @_guarded
    def last_probed(self, target: str) -> float | None:
        """When `target` was last probed successfully (the start of that run), in any run: a result
        committed as `ok` is a real observation even if its run was later killed."""
        return self._scalar(
            "SELECT MAX(r.started) FROM runs r JOIN target_results t ON t.run = r.id"
            " WHERE t.target = ? AND t.status = 'ok'", target)

    @_guarded
    def first_seen(self, target: str) -> float | None:
        """When `target` first appears in the history at all (probed or not)."""
        return self._scalar(
            "SELECT MIN(r.started) FROM runs r JOIN target_results t ON t.run = r.id WHERE t.target = ?",
            target)

    def since(self, run_id: int) -> dict[tuple[str, str], float]:
        """(target, finding code) -> since when the target has shown that code without a break (the start
        of the first run of the streak), for every finding of run_id. See the module docstring."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT target, code, MIN(since) FROM findings WHERE run = ? AND since IS NOT NULL"
                " GROUP BY target, code", (run_id,),
            ).fetchall()
        return {(target, code): float(since) for target, code, since in rows}

    def trend(self, run_id: int, *, limit: int) -> list[TrendPoint]:
        """Targets per health in the last `limit` complete runs up to run_id (and run_id itself, complete or
        not), oldest first. Incomplete runs are left out: a killed audit's few targets read as a dip."""
        with self._lock:
            runs = self._conn.execute(
                "SELECT id, started, status, parent FROM runs"
                " WHERE id <= ? AND (status = 'complete' OR id = ?) ORDER BY id DESC LIMIT ?",
                (run_id, run_id, limit),
            ).fetchall()
            counts: dict[int, dict[str, int]] = {row[0]: {} for row in runs}
            if runs:
                oldest = min(counts)
                for run, health, count in self._conn.execute(
                    "SELECT run, health, COUNT(*) FROM target_results WHERE run BETWEEN ? AND ?"
                    " GROUP BY run, health", (oldest, run_id),
                ):
                    if run in counts:
                        counts[run][health] = int(count)
        return [TrendPoint(run=int(run), started=float(started), status=status,
                           parent=None if parent is None else int(parent), counts=counts[run])
                for run, started, status, parent in reversed(runs)]

    def _scalar(self, query: str, *params: Any) -> float | None:
        with self._lock:
            row = self._conn.execute(query, params).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # -- lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_RUN_COLUMNS = (
    "r.id, r.started, r.finished, r.status, r.args, r.duration, r.parent, r.remediation, COUNT(t.target),"
    " COALESCE(SUM(t.health = 'error'), 0), COALESCE(SUM(t.status != 'ok'), 0)"
)


def _run_info(row: Sequence[Any]) -> RunInfo:
    run_id, started, finished, status, args, duration, parent, remediation, count, errors, unreachable = row
    return RunInfo(
        id=int(run_id), started=float(started), finished=finished, status=status,
        args=json.loads(args or "{}"), duration=duration, target_count=int(count),
        error_count=int(errors), unreachable_count=int(unreachable),
        parent=None if parent is None else int(parent),
        remediation=None if remediation is None else json.loads(remediation),
    )
