"""Audit history in SQLite (or PostgreSQL: fleetfix.audit.backend): one row per run, a small row per
target result, facts and findings stored once per change (the layout, and why: fleetfix.audit.layout).

Durability model: a run row is inserted as `incomplete` when the audit starts; each target's result is one
transaction, committed as the result arrives; the run becomes `complete` only at the end. So a killed audit
leaves a consistent database whose run says `incomplete` and keeps every target that had finished. WAL mode
lets `audit history` read while an audit writes, and a process killed mid-write leaves the WAL to be
recovered by the next open.

The dashboard's history (the trend of the last N runs, since when each target has shown each finding code)
must stay cheap at 10,000 targets x 365 runs: a finished run keeps its health counts in its row (the trend
and `audit history` read no results), and since is carried forward at write time into the result's state
(one or two index seeks per recorded target; reading it back is one range scan of the run).

Retention (`prune`): results older than a cutoff are deleted, except each target's newest result, newest
probed result and newest result in a complete run, which drift, since and staleness go on from; the run
rows stay, with their counts, so `audit history` and the trend still show them.

Sites: each run records its site (the scope a controller audits; "default") and its controller (who ran
it). A target is its site and name: drift, since, staleness and the trend of a run look only at runs of
its own site, so one site's run is never another's baseline, and the same node name at two sites never
shares a history. Readers filter by site where asked (`--site`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

from fleetfix.audit import backend
from fleetfix.audit.backend import DEFAULT_SITE
from fleetfix.audit.layout import (
    MIGRATIONS,
    PROBED_HEALTHS,
    SCHEMA_VERSION,
    State,
    blob,
    carry_since,
    digest,
    dumps,
    facts_rows,
    health_counts,
    intern_blob,
    migrate,
    on_base,
    pack_for,
    previous,
    rebuild_facts,
    upsert_target,
    upsert_target_sql,
)
from fleetfix.audit.layout import migrate as migrate_sqlite
from fleetfix.audit.model import FactsNeed, RunInfo, StoredRun, TargetResult, TrendPoint
from fleetfix.errors import ConfigError, StoreError
from fleetfix.paths import default_state_dir, private_dir, private_file
from fleetfix.probe import Finding

DB_ENV = "FLEETFIX_AUDIT_DB"
DB_FILE = "audit.db"
DAY = 86400.0

SITE_ENV = "FLEETFIX_AUDIT_SITE"
CONTROLLER_ENV = "FLEETFIX_AUDIT_CONTROLLER"

__all__ = ["DB_ENV", "MIGRATIONS", "SCHEMA_VERSION", "AuditStore", "Pruned", "default_db", "default_db_path",
           "migrate"]


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_AUDIT_DB, else <state dir>/audit.db (the state dir of `apply`'s run records)."""
    env = os.environ if environ is None else environ
    if env.get(DB_ENV):
        return Path(env[DB_ENV])
    return default_state_dir(env) / DB_FILE


def default_db(db: str | Path | None = None, environ: Mapping[str, str] | None = None) -> str | Path:
    """The history --db names: a postgresql:// URL as it is, else an SQLite file's path (default:
    default_db_path); $FLEETFIX_AUDIT_DB may be either."""
    env = os.environ if environ is None else environ
    chosen = db if db else env.get(DB_ENV)
    if chosen and backend.is_url(str(chosen)):
        return str(chosen)
    return Path(chosen) if chosen else default_db_path(env)


def default_site(site: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """--site, else $FLEETFIX_AUDIT_SITE, else "default"."""
    env = os.environ if environ is None else environ
    return site or env.get(SITE_ENV) or DEFAULT_SITE


def default_controller(controller: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """--controller, else $FLEETFIX_AUDIT_CONTROLLER, else this machine's host name."""
    env = os.environ if environ is None else environ
    return controller or env.get(CONTROLLER_ENV) or backend.default_controller()


# SQLite's primary result codes (an extended code's low byte) for the failures an operator meets, each with
# what to do; the code says what happened whatever the message's wording, in any SQLite version.
LOCKED = "locked"
FULL = "full"
CORRUPT = "corrupt"
_KIND_OF_CODE = {sqlite3.SQLITE_BUSY: LOCKED, sqlite3.SQLITE_LOCKED: LOCKED, sqlite3.SQLITE_FULL: FULL,
                 sqlite3.SQLITE_CORRUPT: CORRUPT, sqlite3.SQLITE_NOTADB: CORRUPT}


def failure_kind(error: sqlite3.Error) -> str | None:
    """LOCKED, FULL or CORRUPT by the error's SQLite result code; None for any other (or none: an error
    the sqlite3 module raised itself, such as a closed connection, carries no code)."""
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else _KIND_OF_CODE.get(code & 0xFF)


def describe_failure(path: Path | str, error: BaseException, kind: str | None = None) -> StoreError:
    """One line for what SQLite (or PostgreSQL, its kind given) said, with what to do for the cases an
    operator meets."""
    text = " ".join(str(error).split())
    if isinstance(error, sqlite3.Error):
        kind = failure_kind(error)
    if kind == backend.LOST:
        return StoreError(f"{path}: lost the connection to the audit database ({text}); this run is left "
                          "incomplete, the results committed before are kept")
    if kind == LOCKED:
        return StoreError(f"{path}: the audit database is locked by another process (an audit or a reader "
                          "still running?); try again when it has finished")
    if kind == FULL:
        return StoreError(f"{path}: the disk is full: the audit database cannot be written ({text})")
    if kind == CORRUPT:
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
        except self._errors as error:
            raise describe_failure(self.where, error, backend.pg_failure_kind(error)) from None

    return wrapper  # type: ignore[return-value]


class AuditStore:
    """The history database. Thread-safe: one connection, one lock (results arrive from worker threads).

    db: an SQLite file's path, or a postgresql:// URL (fleetfix.audit.backend). site, controller: what
    the runs this store starts record (default_site, default_controller); the site also scopes what
    a writer reads of a target's past (last_probed, first_seen).

    readonly: for commands that only read (history, show, diff): the database must exist (a mistyped --db
    is an error, never a new empty database) and SQLite's is opened read-only. Written, an SQLite file is
    0600 in a 0700 state dir whatever the umask; SQLite gives its -wal and -shm files the database's own
    permissions.

    The schema is checked on open: a new database is created at the current version, an older one is
    refused until `fleetfix audit migrate` (migrate=True) upgrades it, a newer one is refused.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False, migrate: bool = False,
                 site: str | None = None, controller: str | None = None, create: bool = True) -> None:
        self.readonly = readonly
        self.create = create and not readonly
        self.site = default_site(site)
        self.controller = default_controller(controller)
        self.migrated_from: int | None = None  # with migrate=True: the version found
        self._errors: tuple[type[BaseException], ...] = ()
        self._lock = threading.Lock()
        self._runs_started: dict[int, tuple[float, str]] = {}
        self._pipelined = False
        if backend.is_url(path):
            self.postgres = True
            self.where = backend.shown(str(path))
            self.path = Path(self.where)  # for messages only
            self._open_postgres(str(path), migrate=migrate)
            return
        self.postgres = False
        self.path = Path(path)
        self.where = str(self.path)
        if readonly and not self.path.is_file():
            raise ConfigError("no audit database here (a typo in --db? `fleetfix audit` creates it)",
                              path=self.where)
        try:
            if not readonly:
                private_dir(self.path.parent)
                private_file(self.path)
            # isolation_level=None: transactions are explicit (BEGIN/COMMIT below), never implicit.
            target = f"file:{quote(str(self.path.resolve()))}?mode=ro" if readonly else str(self.path)
            self._conn: Any = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                              timeout=30.0, uri=readonly)
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable against a killed process in WAL mode (only power loss can drop the
            # last commits, never corrupt): the case the audit must survive.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            found = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            self._check_version(found, SCHEMA_VERSION, migrate=migrate)
            if migrate or (found == 0 and self.create):
                self.migrated_from = migrate_sqlite(self._conn)
        except sqlite3.DatabaseError as exc:
            if failure_kind(exc) in (LOCKED, FULL):  # the file is fine: try again later, or free space
                raise describe_failure(self.path, exc) from None
            raise ConfigError(f"cannot open audit database: {exc}", path=self.where) from None
        except OSError as exc:
            raise ConfigError(f"cannot create audit database: {exc.strerror or exc}",
                              path=self.where) from None

    def _check_version(self, found: int, current: int, *, migrate: bool) -> None:
        """Refuse a schema this code cannot use: newer, or older and not being migrated (0: a new
        database, which a writer creates)."""
        if found > current:
            raise ConfigError(f"audit database schema v{found} is newer than this fleetfix (v{current})",
                              path=self.where)
        if migrate or found == current:
            return
        if found == 0 and self.create:
            return
        if found == 0 and self.postgres:
            raise ConfigError("no audit history in this database yet (`fleetfix audit` creates it)",
                              path=self.where)
        raise ConfigError(f"audit database schema v{found}, this fleetfix needs v{current}: run "
                          "`fleetfix audit migrate` to upgrade it (back it up first)", path=self.where)

    def _open_postgres(self, url: str, *, migrate: bool) -> None:
        import psycopg

        self._errors = backend.pg_errors()
        # pipeline mode needs libpq 14 or later (psycopg[binary] carries its own); else a statement at a time
        self._pipelined = psycopg.Pipeline.is_supported()
        try:
            self._conn = backend.connect(url)
            if self.readonly:  # history, show, diff: the server refuses any write of theirs
                self._conn.execute("SET default_transaction_read_only = on")
            found = backend.pg_version(self._conn)
            self._check_version(found, backend.PG_SCHEMA_VERSION, migrate=migrate)
            if migrate or (found == 0 and self.create):
                self.migrated_from = backend.pg_migrate(self._conn)
        except psycopg.Error as exc:
            kind = backend.pg_failure_kind(exc)
            if kind is not None:
                raise describe_failure(self.where, exc, kind) from None
            raise ConfigError(f"cannot open audit database: {' '.join(str(exc).split())}",
                              path=self.where) from None

    @property
    def schema_version(self) -> int:
        return backend.PG_SCHEMA_VERSION if self.postgres else SCHEMA_VERSION

    @contextlib.contextmanager
    def audit_lock(self) -> Iterator[None]:
        """One audit per site of a PostgreSQL history at a time (an advisory lock, dropped with the
        connection however the process ends): AuditBusyError for a second one. SQLite's is the
        file lock the CLI takes before opening the file (fleetfix.audit.lock)."""
        if not self.postgres:
            yield
            return
        from fleetfix.errors import AuditBusyError

        key = backend.advisory_key("site", self.site)
        with self._lock:
            taken = self._guard(lambda: backend.try_lock(self._conn, key))
        if not taken:
            raise AuditBusyError(f"another audit of site {self.site!r} is running on this history; not "
                                 "starting a second one", path=self.where)
        try:
            yield
        finally:
            with contextlib.suppress(Exception), self._lock:
                backend.unlock(self._conn, key)

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._errors as error:
            raise describe_failure(self.where, error, backend.pg_failure_kind(error)) from None

    # -- writing ---------------------------------------------------------------------------------------

    @_guarded
    def start_run(self, args: Mapping[str, Any] | None = None, *, started: float | None = None,
                  parent: int | None = None, remediation: Mapping[str, Any] | None = None) -> int:
        with self._lock:
            row = self._conn.execute(
                "INSERT INTO runs (started, status, args, parent, remediation, site, controller)"
                " VALUES (?, 'incomplete', ?, ?, ?, ?, ?) RETURNING id",
                (time.time() if started is None else started, json.dumps(dict(args or {}), default=str),
                 parent, None if remediation is None else json.dumps(dict(remediation), default=str),
                 self.site, self.controller),
            ).fetchone()
            return int(row[0])

    @_guarded
    def set_remediation(self, run_id: int, remediation: Mapping[str, Any]) -> None:
        """Attach what a remediation did to a run whose results it did not change (check mode, nothing
        to remediate, an aborted apply): there is no re-probe run to carry it."""
        with self._lock:
            self._conn.execute("UPDATE runs SET remediation = ? WHERE id = ?",
                               (json.dumps(dict(remediation), default=str), run_id))

    @_guarded
    def set_notification(self, run_id: int, outcome: Mapping[str, Any]) -> None:
        """Record what the run's notification did (fleetfix.audit.notify) in its args, as `notification`:
        it is sent after the run is complete, so start_run could not record it."""
        with self._lock:
            row = self._conn.execute("SELECT args FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise ConfigError(f"run {run_id} not found", path=self.where)
            args = {**json.loads(row[0] or "{}"), "notification": dict(outcome)}
            self._conn.execute("UPDATE runs SET args = ? WHERE id = ?",
                               (json.dumps(args, default=str), run_id))

    @_guarded
    def record_target(self, run_id: int, result: TargetResult) -> None:
        """One target's result, in one transaction, committed before returning."""
        self.record_targets(run_id, (result,))

    @_guarded
    def record_targets(self, run_id: int, results: Iterable[TargetResult]) -> None:
        """Several results in one transaction: for results that are all at hand at once (a remediation's
        carried-over targets, an import, the benchmarks' synthetic history). An audit records each result
        as it arrives (record_target), so a kill loses none that had finished."""
        results = list(results)
        if self.postgres and self._pipelined:
            self._record_pg(run_id, results)
            return
        with self._lock:
            started, site = self._started(run_id)
            for attempt in range(_RETRIES):
                self._conn.execute(self._begin)
                try:
                    for result in results:
                        self._write(run_id, started, site, result)
                    # the run's stored counts (set when it finished) no longer hold: count again when asked
                    self._conn.execute("UPDATE runs SET counts = NULL WHERE id = ? AND counts IS NOT NULL",
                                       (run_id,))
                except BaseException as error:
                    with contextlib.suppress(*self._errors):  # a lost connection has nothing to roll back
                        self._conn.execute("ROLLBACK")
                    if attempt + 1 < _RETRIES and self._retryable(error):
                        continue
                    raise
                self._conn.execute("COMMIT")
                return

    def _record_pg(self, run_id: int, results: Sequence[TargetResult]) -> None:
        """record_targets on PostgreSQL: the same rows in the same one transaction, its statements sent
        in pipeline mode, so that a result costs two round trips (three when its facts need a new base)
        instead of one per statement. What is read first (the target's previous results, the interned
        node facts and findings) goes in one batch; the state and the result row in one statement; the
        commit in the pipeline's sync."""
        conn = self._conn
        with self._lock:
            started, site = self._run_started(run_id)
            for attempt in range(_RETRIES):
                try:
                    with conn.raw.pipeline():
                        conn.execute("BEGIN")
                        for result in results:
                            self._write_pg(run_id, started, site, result)
                        conn.execute("UPDATE runs SET counts = NULL WHERE id = ? AND counts IS NOT NULL",
                                     (run_id,))
                        conn.execute("COMMIT")
                except BaseException as error:
                    with contextlib.suppress(*self._errors):  # a lost connection has nothing to roll back
                        conn.execute("ROLLBACK")
                    if attempt + 1 < _RETRIES and self._retryable(error):
                        continue
                    raise
                return

    def _run_started(self, run_id: int) -> tuple[float, str]:
        """_started, remembered: a run's start and site never change."""
        if run_id not in self._runs_started:
            self._runs_started[run_id] = self._started(run_id)
        return self._runs_started[run_id]

    def _write_pg(self, run_id: int, started: float, site: str, result: TargetResult) -> None:
        """_write's rows, in pipeline mode: at most two waits for the server (the batch of reads, a new
        facts base); the last statement's outcome comes with the commit."""
        conn = self._conn
        probed = result.status == "ok"
        target = conn.execute(upsert_target_sql(),
                              (site, result.target, started, started if probed else None))
        newest = conn.execute(backend.PREVIOUS_NEWEST, (site, result.target, run_id))
        ok = conn.execute(backend.PREVIOUS_PROBED if result.facts is None else backend.PREVIOUS_PROBED_BASE,
                          (site, result.target, run_id))
        node_facts = None if result.node_facts is None else self._intern_pg(result.node_facts)
        listed = [finding.model_dump(mode="json") for finding in result.findings]
        findings = self._intern_pg(listed) if listed else None
        target_id = int(target.fetchone()[0])  # the one wait for this batch
        newest_row, ok_row = newest.fetchone(), ok.fetchone()
        carried = ok_row if probed else newest_row
        base_id = None if ok_row is None else ok_row[2]
        facts: int | None = None
        delta: str | None = None
        if result.facts is not None:
            kept = on_base(result.facts, base_id, None if ok_row is None else ok_row[3:5])
            if kept is None:
                facts = int(self._intern_pg(result.facts).fetchone()[0])
            else:
                facts, delta = kept
        state = State(
            node=result.node, ctid=result.ctid, status=result.status, health=result.health,
            error=result.error, facts=facts,
            node_facts=None if node_facts is None else int(node_facts.fetchone()[0]),
            findings=None if findings is None else int(findings.fetchone()[0]),
            ignored=dumps(list(result.ignored)),
            since=carry_since([finding.code for finding in result.findings],
                              {} if carried is None else json.loads(carried[1]), started),
        )
        key = state.digest()
        conn.execute(backend.RECORD_RESULT, (key, key, *state.fields(), run_id, target_id,
                                             float(result.duration), delta))

    def _intern_pg(self, value: Any) -> Any:
        """intern_blob's statement queued in the pipeline: its cursor, whose row is the blob's id."""
        text = dumps(value)
        key = digest(text)
        return self._conn.execute(backend.INTERN_BLOB, (key, key, pack_for(self._conn, text)))

    @property
    def _begin(self) -> str:
        # SQLite: take the write lock now, not at the first write (no deadlock between two upgraders).
        return "BEGIN" if self.postgres else "BEGIN IMMEDIATE"

    def _retryable(self, error: BaseException) -> bool:
        """PostgreSQL: two controllers interning the same documents in opposite orders deadlock, and one
        is told to try again (40P01, 40001)."""
        return self.postgres and getattr(error, "sqlstate", None) in ("40P01", "40001")

    def _started(self, run_id: int) -> tuple[float, str]:
        row = self._conn.execute("SELECT started, site FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise ConfigError(f"run {run_id} not found", path=self.where)
        return float(row[0]), str(row[1])

    def _write(self, run_id: int, started: float, site: str, result: TargetResult) -> None:
        conn = self._conn
        probed = result.status == "ok"
        target_id = upsert_target(conn, site, result.target, started, probed)
        before = previous(conn, target_id, run_id, probed=probed)
        facts, delta = facts_rows(conn, result.facts, before.facts)
        findings = [finding.model_dump(mode="json") for finding in result.findings]
        state = State(
            node=result.node, ctid=result.ctid, status=result.status, health=result.health,
            error=result.error,
            facts=facts,
            node_facts=None if result.node_facts is None else intern_blob(conn, result.node_facts),
            findings=intern_blob(conn, findings) if findings else None,
            ignored=dumps(list(result.ignored)),
            since=carry_since([finding.code for finding in result.findings], before.since, started),
        )
        conn.execute(
            "INSERT INTO target_results (run, target, state, duration, delta) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (run, target) DO UPDATE SET state = excluded.state, duration = excluded.duration,"
            " delta = excluded.delta",
            (run_id, target_id, state.intern(conn), float(result.duration), delta))

    @_guarded
    def finish_run(self, run_id: int, *, finished: float | None = None) -> None:
        """Mark the run complete, keeping its health counts in its row (history and trend read those)."""
        with self._lock:
            end = time.time() if finished is None else finished
            self._conn.execute(self._begin)
            try:
                self._conn.execute(
                    "UPDATE runs SET status = 'complete', finished = ?, duration = ? - started, counts = ?"
                    " WHERE id = ?", (end, end, dumps(health_counts(self._conn, run_id)), run_id),
                )
            except BaseException:
                with contextlib.suppress(*self._errors):
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- retention -------------------------------------------------------------------------------------

    @_guarded
    def prune(self, *, keep_days: float, now: float | None = None) -> Pruned:
        """Delete the results of runs started more than keep_days ago, except what later runs go on from:
        each target's newest result, newest probed result and newest result in a complete run (drift's
        baseline, since, staleness). The newest complete run, anything after it and the audit run a kept
        re-probe run remediated are never pruned (each per site). Run rows stay (marked pruned, their
        counts kept), then
        states and blobs no result uses any more are deleted. The file keeps its size (SQLite reuses the
        free pages for the next runs) unless vacuum() is called."""
        cutoff = (time.time() if now is None else now) - keep_days * DAY
        with self._lock:
            conn = self._conn
            conn.execute(self._begin)
            try:
                old = [int(run) for (run,) in conn.execute(
                    "SELECT id FROM runs WHERE started < ? AND pruned IS NULL AND id < COALESCE((SELECT"
                    " MAX(c.id) FROM runs c WHERE c.status = 'complete' AND c.site = runs.site), -1)"
                    " AND id NOT IN (SELECT parent FROM runs WHERE parent IS NOT NULL AND started >= ?)"
                    " ORDER BY id", (cutoff, cutoff))]
                rows = 0
                if old:
                    conn.execute("CREATE TEMP TABLE IF NOT EXISTS keep (target BIGINT, run BIGINT,"
                                 " PRIMARY KEY (target, run))" + ("" if self.postgres else " WITHOUT ROWID"))
                    conn.execute("DELETE FROM keep")
                    conn.execute(_KEEPERS)
                    for run_id in old:
                        rows += conn.execute(
                            "DELETE FROM target_results WHERE run = ? AND NOT EXISTS (SELECT 1 FROM keep k"
                            " WHERE k.target = target_results.target AND k.run = target_results.run)",
                            (run_id,)).rowcount
                    conn.executemany("UPDATE runs SET pruned = ? WHERE id = ?",
                                     [(cutoff + keep_days * DAY, run_id) for run_id in old])
                    conn.execute("DELETE FROM keep")
                states = conn.execute(
                    "DELETE FROM states WHERE id NOT IN (SELECT state FROM target_results)").rowcount
                blobs = conn.execute(
                    "DELETE FROM blobs WHERE id NOT IN (SELECT facts FROM states WHERE facts IS NOT NULL"
                    " UNION SELECT node_facts FROM states WHERE node_facts IS NOT NULL"
                    " UNION SELECT findings FROM states WHERE findings IS NOT NULL)").rowcount
            except BaseException:
                with contextlib.suppress(*self._errors):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return Pruned(runs=len(old), results=rows, states=states, blobs=blobs)

    @_guarded
    def vacuum(self) -> None:
        """Give the free pages back to the file system (rewrites the whole file: run it after a prune)."""
        with self._lock:
            self._conn.execute("VACUUM")

    # -- reading ---------------------------------------------------------------------------------------

    @_guarded
    def runs(self, *, limit: int | None = None, site: str | None = None) -> list[RunInfo]:
        """Runs, newest first, with per-run counts (of one site, if given)."""
        query = f"SELECT {_RUN_COLUMNS} FROM runs"
        params: tuple[Any, ...] = ()
        if site is not None:
            query += " WHERE site = ?"
            params = (site,)
        query += " ORDER BY id DESC"
        if limit is not None:
            query += " LIMIT ?"
            params = (*params, limit)
        with self._lock:
            rows = self._conn.execute(query, params).fetchall()
            return [self._run_info(row) for row in rows]

    @_guarded
    def newest_per_site(self) -> list[int]:
        """The newest run of each site, in site order (one query, whatever the history's size)."""
        with self._lock:
            rows = self._conn.execute("SELECT MAX(id), site FROM runs GROUP BY site ORDER BY site").fetchall()
        return [int(row[0]) for row in rows]

    @_guarded
    def resolve(self, ref: str, *, site: str | None = None) -> int:
        """A run id from what a user typed: a number, or "last" / "latest" (newest run, of `site` if
        given; a numbered run of another site is an error then)."""
        if ref in ("last", "latest"):
            with self._lock:
                if site is None:
                    row = self._conn.execute("SELECT MAX(id) FROM runs").fetchone()
                else:
                    row = self._conn.execute("SELECT MAX(id) FROM runs WHERE site = ?", (site,)).fetchone()
            if row is None or row[0] is None:
                where = "" if site is None else f" at site {site!r}"
                raise ConfigError(f"no audit runs recorded yet{where}", path=self.where)
            return int(row[0])
        if not ref.isdigit():
            raise ConfigError(f"run {ref!r}: expected a run number or 'last'")
        if site is not None and self.info(int(ref)).site != site:
            raise ConfigError(f"run {ref} is not of site {site!r}", path=self.where)
        return int(ref)

    @_guarded
    def info(self, run_id: int) -> RunInfo:
        with self._lock:
            row = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise ConfigError(f"run {run_id} not found", path=self.where)
            return self._run_info(row)

    @_guarded
    def load(self, run_id: int, *, facts: FactsNeed = True) -> StoredRun:
        """A run and every target's result, by target name. facts=False leaves facts out (None): drift
        and the text report do not read them, and decoding them is most of the cost at 10,000 targets. A
        projection keeps of each target's facts only what it returns (FactsNeed)."""
        info = self.info(run_id)
        if info.pruned is not None:
            day = time.strftime("%Y-%m-%d", time.localtime(info.pruned))
            raise ConfigError(f"run {run_id} was pruned on {day}: only its summary is kept (`audit history`)",
                              path=self.where)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_RESULT_COLUMNS} FROM target_results t JOIN targets n ON n.id = t.target"
                " JOIN states s ON s.id = t.state WHERE t.run = ?", (run_id,)).fetchall()
            results = self._results(rows, facts=facts)
        return StoredRun(info, tuple(sorted(results, key=lambda result: result.target)))

    @_guarded
    def results_at(self, wanted: Mapping[str, int], *, facts: FactsNeed = False) -> list[TargetResult]:
        """The result of each target in the run given for it (pruned runs included: they keep what
        later runs go on from)."""
        rows = []
        with self._lock:
            for name, run_id in wanted.items():
                rows += self._conn.execute(
                    f"SELECT {_RESULT_COLUMNS} FROM targets n JOIN target_results t ON t.target = n.id"
                    " JOIN states s ON s.id = t.state WHERE n.name = ? AND t.run = ?",
                    (name, run_id)).fetchall()
            return self._results(rows, facts=facts)

    def facts_of(self, run_id: int, target: str) -> dict[str, Any] | None:
        """One target's facts in one run (None: not recorded): what drift reads, for the few findings a
        policy change may explain, instead of loading every target's facts."""
        found = self.results_at({target: run_id}, facts=True)
        return found[0].facts if found else None

    def _results(self, rows: Sequence[Sequence[Any]], *, facts: FactsNeed) -> list[TargetResult]:
        """Rows of _RESULT_COLUMNS as results. Each blob is decoded once per call: a findings list is
        shared by every target showing the same findings (Finding is immutable), a facts base by every
        result of its target (the delta copies what it changes). With a projection, a base is kept only
        as projected: a fleet's bases held whole would be most of the HTML report's memory."""
        documents: dict[int, Any] = {}
        findings: dict[int, tuple[Finding, ...]] = {}
        projected: dict[int, dict[str, Any] | None] = {}

        def target_facts(facts_id: int | None, delta: str | None) -> dict[str, Any] | None:
            if facts is False or facts_id is None:
                return None
            if facts is True:
                return rebuild_facts(document(facts_id), delta)
            if delta is not None:  # rare (a few leaves changed): its base decoded for it alone
                whole = rebuild_facts(blob(self._conn, facts_id), delta)
                return None if whole is None else facts(whole)
            if facts_id not in projected:
                base = blob(self._conn, facts_id)
                projected[facts_id] = None if base is None else facts(base)
            return projected[facts_id]

        def document(blob_id: int | None) -> Any:
            if blob_id is None:
                return None
            if blob_id not in documents:
                documents[blob_id] = blob(self._conn, blob_id)
            return documents[blob_id]

        def finding_list(blob_id: int | None) -> tuple[Finding, ...]:
            if blob_id is None:
                return ()
            if blob_id not in findings:
                findings[blob_id] = tuple(Finding.model_validate(item) for item in blob(self._conn, blob_id))
            return findings[blob_id]

        return [
            TargetResult(
                target=name, node=node, ctid=ctid, status=status, error=error,
                findings=finding_list(findings_id), duration=duration,
                facts=target_facts(facts_id, delta),
                ignored=tuple(json.loads(ignored)), node_facts=document(node_facts_id),
            )
            for (name, node, ctid, status, error, duration, facts_id, delta, ignored, node_facts_id,
                 findings_id) in rows
        ]

    @_guarded
    def previous_complete(self, run_id: int) -> int | None:
        """The newest complete run before run_id: the baseline drift is measured against. A pruned run
        is no baseline (its results are gone): for an old run shown again, drift is then measured against
        the newest complete run before it that is still whole (a new run's never is: prune keeps it)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT MAX(id) FROM runs WHERE id < ? AND status = 'complete' AND pruned IS NULL"
                " AND site = (SELECT site FROM runs WHERE id = ?)", (run_id, run_id)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @_guarded
    def latest_complete_runs(self, before: int, targets: Iterable[str]) -> dict[str, int]:
        """Each of these targets' newest complete run before `before` (drift's per-target baseline): one
        index walk per target, backwards from `before`, usually one step. The targets are those of
        `before`'s site."""
        found: dict[str, int] = {}
        with self._lock:
            site_row = self._conn.execute("SELECT site FROM runs WHERE id = ?", (before,)).fetchone()
            site = self.site if site_row is None else site_row[0]
            for name in targets:
                row = self._conn.execute(
                    "SELECT t.run FROM targets n JOIN target_results t ON t.target = n.id"
                    " JOIN runs r ON r.id = t.run WHERE n.site = ? AND n.name = ? AND t.run < ?"
                    " AND r.status = 'complete' ORDER BY t.run DESC LIMIT 1", (site, name, before)).fetchone()
                if row is not None:
                    found[name] = int(row[0])
        return found

    @_guarded
    def last_probed(self, target: str) -> float | None:
        """When `target` (of this store's site) was last probed successfully (the start of that run), in
        any run: a result committed as `ok` is a real observation even if its run was later killed."""
        return self._scalar("SELECT last_probed FROM targets WHERE site = ? AND name = ?", self.site, target)

    @_guarded
    def first_seen(self, target: str) -> float | None:
        """When `target` (of this store's site) first appears in the history at all (probed or not)."""
        return self._scalar("SELECT first_seen FROM targets WHERE site = ? AND name = ?", self.site, target)

    @_guarded
    def since(self, run_id: int) -> dict[tuple[str, str], float]:
        """(target, finding code) -> since when the target has shown that code without a break (the start
        of the first run of the streak), for every finding of run_id. See fleetfix.audit.layout."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT n.name, s.since FROM target_results t JOIN targets n ON n.id = t.target"
                " JOIN states s ON s.id = t.state WHERE t.run = ? AND s.since != '{}'", (run_id,)).fetchall()
        return {(name, code): float(since) for name, text in rows for code, since in json.loads(text).items()}

    @_guarded
    def trend(self, run_id: int, *, limit: int) -> list[TrendPoint]:
        """Targets per health in the last `limit` complete runs of its site up to run_id (and run_id itself,
        complete or not), oldest first. Incomplete runs are left out: a killed audit's few targets read as
        a dip."""
        with self._lock:
            runs = self._conn.execute(
                "SELECT id, started, status, parent, counts, finished FROM runs WHERE id <= ?"
                " AND site = (SELECT site FROM runs WHERE id = ?) AND (status = 'complete' OR id = ?)"
                " ORDER BY id DESC LIMIT ?", (run_id, run_id, run_id, limit),
            ).fetchall()
            points = [TrendPoint(run=int(run), started=float(started), status=status,
                                 parent=None if parent is None else int(parent),
                                 counts=self._counts(int(run), counts),
                                 finished=None if finished is None else float(finished))
                      for run, started, status, parent, counts, finished in reversed(runs)]
        return points

    def _counts(self, run_id: int, stored: str | None) -> dict[str, int]:
        """A run's targets per health: as stored when it finished, else counted now (with the lock held)."""
        if stored is not None:
            counts: dict[str, int] = json.loads(stored)
            return counts
        return health_counts(self._conn, run_id)

    def _run_info(self, row: Sequence[Any]) -> RunInfo:
        (run_id, started, finished, status, args, duration, parent, remediation, counts_text,
         pruned, site, controller) = row
        counts = self._counts(int(run_id), counts_text)
        total = sum(counts.values())
        return RunInfo(
            id=int(run_id), started=float(started), finished=finished, status=status,
            args=json.loads(args or "{}"), duration=duration, target_count=total,
            error_count=counts.get("error", 0),
            # not probed: every health that is not a probed one is the status itself (unreachable, failed)
            unreachable_count=total - sum(counts.get(health, 0) for health in PROBED_HEALTHS),
            parent=None if parent is None else int(parent),
            remediation=None if remediation is None else json.loads(remediation),
            pruned=pruned, site=site, controller=controller,
        )

    def _scalar(self, query: str, *params: Any) -> float | None:
        with self._lock:
            row = self._conn.execute(query, params).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # -- lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock, contextlib.suppress(*self._errors):  # a lost connection is closed already
            self._conn.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_RUN_COLUMNS = ("id, started, finished, status, args, duration, parent, remediation, counts, pruned, site,"
                " controller")
_RETRIES = 3
_RESULT_COLUMNS = ("n.name, s.node, s.ctid, s.status, s.error, t.duration, s.facts, t.delta, s.ignored,"
                   " s.node_facts, s.findings")

# Per target, the results later runs go on from (see prune): its newest, its newest probed, its newest in
# a complete run. Each is a walk backwards on target_results_by_target, one per target.
_KEEPERS = """
INSERT INTO keep (target, run) SELECT target, run FROM (
SELECT id AS target,
       (SELECT t.run FROM target_results t WHERE t.target = n.id ORDER BY t.run DESC LIMIT 1) AS run
  FROM targets n
UNION
SELECT id, (SELECT t.run FROM target_results t JOIN states s ON s.id = t.state
             WHERE t.target = n.id AND s.status = 'ok' ORDER BY t.run DESC LIMIT 1) FROM targets n
UNION
SELECT id, (SELECT t.run FROM target_results t JOIN runs r ON r.id = t.run
             WHERE t.target = n.id AND r.status = 'complete' ORDER BY t.run DESC LIMIT 1) FROM targets n
) AS keepers WHERE run IS NOT NULL
"""


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted."""

    runs: int  # runs whose results were pruned (their rows stay, with their counts)
    results: int
    states: int
    blobs: int

