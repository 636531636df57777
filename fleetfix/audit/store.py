"""Audit history in SQLite: one row per run, a small row per target result, facts and findings stored
once per change (the layout, and why: fleetfix.audit.layout).

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
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

from fleetfix.audit.layout import (
    MIGRATIONS,
    PROBED_HEALTHS,
    SCHEMA_VERSION,
    State,
    blob,
    carry_since,
    dumps,
    facts_rows,
    health_counts,
    intern_blob,
    migrate,
    previous,
    rebuild_facts,
    upsert_target,
)
from fleetfix.audit.model import FactsNeed, RunInfo, StoredRun, TargetResult, TrendPoint
from fleetfix.errors import ConfigError, StoreError
from fleetfix.paths import default_state_dir, private_dir, private_file
from fleetfix.probe import Finding

DB_ENV = "FLEETFIX_AUDIT_DB"
DB_FILE = "audit.db"
DAY = 86400.0

__all__ = ["DB_ENV", "MIGRATIONS", "SCHEMA_VERSION", "AuditStore", "Pruned", "default_db_path", "migrate"]


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_AUDIT_DB, else <state dir>/audit.db (the state dir of `apply`'s run records)."""
    env = os.environ if environ is None else environ
    if env.get(DB_ENV):
        return Path(env[DB_ENV])
    return default_state_dir(env) / DB_FILE


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


def describe_failure(path: Path, error: sqlite3.Error) -> StoreError:
    """One line for what SQLite said, with what to do for the cases an operator meets."""
    text = " ".join(str(error).split())
    kind = failure_kind(error)
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
        except sqlite3.DatabaseError as exc:
            if failure_kind(exc) in (LOCKED, FULL):  # the file is fine: try again later, or free space
                raise describe_failure(self.path, exc) from None
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
    def set_notification(self, run_id: int, outcome: Mapping[str, Any]) -> None:
        """Record what the run's notification did (fleetfix.audit.notify) in its args, as `notification`:
        it is sent after the run is complete, so start_run could not record it."""
        with self._lock:
            row = self._conn.execute("SELECT args FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise ConfigError(f"run {run_id} not found", path=str(self.path))
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
        with self._lock:
            started = self._started(run_id)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for result in results:
                    self._write(run_id, started, result)
                # the run's stored counts (set when it finished) no longer hold: count again when asked
                self._conn.execute("UPDATE runs SET counts = NULL WHERE id = ? AND counts IS NOT NULL",
                                   (run_id,))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _started(self, run_id: int) -> float:
        row = self._conn.execute("SELECT started FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise ConfigError(f"run {run_id} not found", path=str(self.path))
        return float(row[0])

    def _write(self, run_id: int, started: float, result: TargetResult) -> None:
        conn = self._conn
        probed = result.status == "ok"
        target_id = upsert_target(conn, result.target, started, probed)
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
            "INSERT OR REPLACE INTO target_results (run, target, state, duration, delta)"
            " VALUES (?, ?, ?, ?, ?)",
            (run_id, target_id, state.intern(conn), float(result.duration), delta))

    @_guarded
    def finish_run(self, run_id: int, *, finished: float | None = None) -> None:
        """Mark the run complete, keeping its health counts in its row (history and trend read those)."""
        with self._lock:
            end = time.time() if finished is None else finished
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute(
                    "UPDATE runs SET status = 'complete', finished = ?, duration = ? - started, counts = ?"
                    " WHERE id = ?", (end, end, dumps(health_counts(self._conn, run_id)), run_id),
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- retention -------------------------------------------------------------------------------------

    @_guarded
    def prune(self, *, keep_days: float, now: float | None = None) -> Pruned:
        """Delete the results of runs started more than keep_days ago, except what later runs go on from:
        each target's newest result, newest probed result and newest result in a complete run (drift's
        baseline, since, staleness). The newest complete run, anything after it and the audit run a kept
        re-probe run remediated are never pruned. Run rows stay (marked pruned, their counts kept), then
        states and blobs no result uses any more are deleted. The file keeps its size (SQLite reuses the
        free pages for the next runs) unless vacuum() is called."""
        cutoff = (time.time() if now is None else now) - keep_days * DAY
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                newest = conn.execute("SELECT MAX(id) FROM runs WHERE status = 'complete'").fetchone()[0]
                old = [int(run) for (run,) in conn.execute(
                    "SELECT id FROM runs WHERE started < ? AND id < ? AND pruned IS NULL"
                    " AND id NOT IN (SELECT parent FROM runs WHERE parent IS NOT NULL AND started >= ?)"
                    " ORDER BY id", (cutoff, newest if newest is not None else -1, cutoff))]
                rows = 0
                if old:
                    conn.execute("CREATE TEMP TABLE IF NOT EXISTS keep (target INTEGER, run INTEGER,"
                                 " PRIMARY KEY (target, run)) WITHOUT ROWID")
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
    def runs(self, *, limit: int | None = None) -> list[RunInfo]:
        """Runs, newest first, with per-run counts."""
        query = f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC"
        params: tuple[int, ...] = ()
        if limit is not None:
            query += " LIMIT ?"
            params = (limit,)
        with self._lock:
            rows = self._conn.execute(query, params).fetchall()
            return [self._run_info(row) for row in rows]

    @_guarded
    def resolve(self, ref: str) -> int:
        """A run id from what a user typed: a number, or "last" / "latest" (newest run)."""
        if ref in ("last", "latest"):
            with self._lock:
                row = self._conn.execute("SELECT MAX(id) FROM runs").fetchone()
            if row is None or row[0] is None:
                raise ConfigError("no audit runs recorded yet", path=str(self.path))
            return int(row[0])
        if not ref.isdigit():
            raise ConfigError(f"run {ref!r}: expected a run number or 'last'")
        return int(ref)

    @_guarded
    def info(self, run_id: int) -> RunInfo:
        with self._lock:
            row = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise ConfigError(f"run {run_id} not found", path=str(self.path))
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
                              path=str(self.path))
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
                "SELECT MAX(id) FROM runs WHERE id < ? AND status = 'complete' AND pruned IS NULL", (run_id,)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @_guarded
    def latest_complete_runs(self, before: int, targets: Iterable[str]) -> dict[str, int]:
        """Each of these targets' newest complete run before `before` (drift's per-target baseline): one
        index walk per target, backwards from `before`, usually one step."""
        found: dict[str, int] = {}
        with self._lock:
            for name in targets:
                row = self._conn.execute(
                    "SELECT t.run FROM targets n JOIN target_results t ON t.target = n.id"
                    " JOIN runs r ON r.id = t.run WHERE n.name = ? AND t.run < ? AND r.status = 'complete'"
                    " ORDER BY t.run DESC LIMIT 1", (name, before)).fetchone()
                if row is not None:
                    found[name] = int(row[0])
        return found

    @_guarded
    def last_probed(self, target: str) -> float | None:
        """When `target` was last probed successfully (the start of that run), in any run: a result
        committed as `ok` is a real observation even if its run was later killed."""
        return self._scalar("SELECT last_probed FROM targets WHERE name = ?", target)

    @_guarded
    def first_seen(self, target: str) -> float | None:
        """When `target` first appears in the history at all (probed or not)."""
        return self._scalar("SELECT first_seen FROM targets WHERE name = ?", target)

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
        """Targets per health in the last `limit` complete runs up to run_id (and run_id itself, complete or
        not), oldest first. Incomplete runs are left out: a killed audit's few targets read as a dip."""
        with self._lock:
            runs = self._conn.execute(
                "SELECT id, started, status, parent, counts, finished FROM runs"
                " WHERE id <= ? AND (status = 'complete' OR id = ?) ORDER BY id DESC LIMIT ?",
                (run_id, run_id, limit),
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
         pruned) = row
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
            pruned=pruned,
        )

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


_RUN_COLUMNS = "id, started, finished, status, args, duration, parent, remediation, counts, pruned"
_RESULT_COLUMNS = ("n.name, s.node, s.ctid, s.status, s.error, t.duration, s.facts, t.delta, s.ignored,"
                   " s.node_facts, s.findings")

# Per target, the results later runs go on from (see prune): its newest, its newest probed, its newest in
# a complete run. Each is a walk backwards on target_results_by_target, one per target.
_KEEPERS = """
INSERT OR IGNORE INTO keep (target, run)
SELECT id, (SELECT t.run FROM target_results t WHERE t.target = n.id ORDER BY t.run DESC LIMIT 1)
  FROM targets n
UNION
SELECT id, (SELECT t.run FROM target_results t JOIN states s ON s.id = t.state
             WHERE t.target = n.id AND s.status = 'ok' ORDER BY t.run DESC LIMIT 1) FROM targets n
UNION
SELECT id, (SELECT t.run FROM target_results t JOIN runs r ON r.id = t.run
             WHERE t.target = n.id AND r.status = 'complete' ORDER BY t.run DESC LIMIT 1) FROM targets n
"""


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted."""

    runs: int  # runs whose results were pruned (their rows stay, with their counts)
    results: int
    states: int
    blobs: int

