"""The history's tables, their migrations, and how one target's result becomes rows (and back).

Layout (schema v5; v6 adds each run's site and controller, and makes a target's identity its site and
name, so the same node name at two sites never shares a history). What a nightly audit of 10,000
targets adds is one small row per target:

    runs            one row per run: when, args, status, and (once finished) its health counts
    targets         one row per target name ever seen: first_seen, last_probed (kept through pruning)
    blobs           content-addressed JSON documents (facts, node facts, a target's findings list),
                    zlib-compressed when that is smaller; stored once, shared by every result using them
    states          a target's result less what moves every night: node, status, health, error, its
                    findings (a blob), since when it shows each code, its facts base (a blob); shared by
                    every night the target looked the same
    target_results  per run and target: the state, the duration, and the facts leaves that differ from
                    the state's facts base (fleetfix.audit.delta), usually none. ~25 bytes.

So a night when a target did not change adds one target_results row and nothing else, and a night when it
did adds a state (and a blob for what is new in its facts or findings). Up to v4 every result stored its
facts (~3-5 KB) and every finding its summary, evidence and fix, every night: ~1 MB per 200 targets.

Schema changes go in MIGRATIONS: entry N turns a version N-1 database into version N (`PRAGMA
user_version`), each in its own transaction. They are never applied silently: a store older than the
code refuses to open until `fleetfix audit migrate` upgrades it in place (a shared or backed-up history
is upgraded when its operator says so, not by whichever cron job runs first). PostgreSQL's own list is
fleetfix.audit.backend.PG_MIGRATIONS. Never edit an
entry once released: append a new one. Entries 1-4 are the old layout, kept so that any old database can be
brought up to date; entry 5 converts it (`_convert_to_v5`).

"Since" (since when a target has shown a finding code without a break, for the dashboard) is carried
forward at write time, as since v4: the code's since in the target's previous result, or the start of the
result's own run when the code is new. The previous result is the target's newest earlier *probed* result
when this one was probed (a night it was unreachable does not end a streak), else its newest earlier
result of any kind. It lives in the state, so pruning old runs never changes it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fleetfix.audit.delta import Delta, apply_delta, leaf_delta
from fleetfix.errors import ConfigError

# The healths of a probed target (model.worst_health): a run's other targets were not probed.
PROBED_HEALTHS = ("healthy", "info", "warning", "error")

# v4's since, filled in by SQL (kept for the v3 -> v4 step of an old database's upgrade).
_V4_SINCE_UPDATE = """
UPDATE findings SET since = COALESCE(
    (SELECT MIN(p.since) FROM findings p
      WHERE p.run = (
        CASE (SELECT c.status FROM target_results c WHERE c.run = findings.run AND c.target = findings.target)
        WHEN 'ok' THEN (SELECT MAX(t.run) FROM target_results t
                         WHERE t.target = findings.target AND t.status = 'ok' AND t.run < findings.run)
        ELSE (SELECT MAX(t.run) FROM target_results t
               WHERE t.target = findings.target AND t.run < findings.run)
        END)
      AND p.target = findings.target AND +p.code = findings.code),
    (SELECT r.started FROM runs r WHERE r.id = findings.run))
"""

Migration = str | Callable[[sqlite3.Connection], None]


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


class Conn(Protocol):
    """What the layout needs of a connection: sqlite3's, or fleetfix.audit.backend.PgConnection (which
    takes the same `?` SQL)."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...


def _backfill_since(conn: Conn) -> None:
    """v4: fill in `since` for the findings recorded before it, run by run in order."""
    for (run_id,) in conn.execute("SELECT id FROM runs ORDER BY id").fetchall():
        conn.execute(_V4_SINCE_UPDATE + " WHERE run = ?", (run_id,))


# -- encoding ----------------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    """The one JSON spelling of stored documents (compact, key order kept: reports print it as stored)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def digest(text: str) -> bytes:
    """A document's identity: 128 bits of its SHA-256, plenty against accidental collisions."""
    return hashlib.sha256(text.encode()).digest()[:16]


def pack(text: str) -> str | bytes:
    """zlib when it saves space (facts: ~5 KB -> ~1.3 KB), else the text itself; the column's type says
    which (TEXT or BLOB)."""
    packed = zlib.compress(text.encode(), 6)
    return packed if len(packed) < len(text) else text


def pack_for(conn: Conn, text: str) -> str | bytes:
    """pack(text) as the connection's blobs.data column takes it: PostgreSQL's is bytea, so the text is
    stored as its UTF-8 (fleetfix.audit.backend)."""
    packed = pack(text)
    return packed.encode() if isinstance(packed, str) and getattr(conn, "bytes_only", False) else packed


def unpack(data: str | bytes) -> Any:
    """A stored document: text, or bytes that are zlib (its header's first byte is 0x78, "x", which no
    JSON text starts with) or UTF-8 JSON (PostgreSQL's bytea)."""
    if isinstance(data, str):
        return json.loads(data)
    data = bytes(data)
    return json.loads(zlib.decompress(data) if data[:1] == b"x" else data)


def _interned(conn: Conn, table: str, key: bytes, insert: str, values: tuple[Any, ...]) -> int:
    """The id of the row of `table` with this digest, inserted now if there is none. Two writers may
    insert the same content at once (PostgreSQL, two controllers): the second finds the first's row."""
    row = conn.execute(f"SELECT id FROM {table} WHERE digest = ?", (key,)).fetchone()
    if row is None:
        row = conn.execute(insert + " ON CONFLICT (digest) DO NOTHING RETURNING id",
                           (key, *values)).fetchone()
    if row is None:
        row = conn.execute(f"SELECT id FROM {table} WHERE digest = ?", (key,)).fetchone()
    return int(row[0])


def intern_blob(conn: Conn, value: Any) -> int:
    """The id of this JSON document in `blobs`, stored now if it is new."""
    text = dumps(value)
    return _interned(conn, "blobs", digest(text), "INSERT INTO blobs (digest, data) VALUES (?, ?)",
                     (pack_for(conn, text),))


def blob(conn: Conn, blob_id: int) -> Any:
    row = conn.execute("SELECT data FROM blobs WHERE id = ?", (blob_id,)).fetchone()
    if row is None:
        raise ConfigError(f"audit database is inconsistent: blob {blob_id} is missing")
    return unpack(row[0])


@dataclass(frozen=True)
class State:
    """The rows a result is stored as, before their ids exist (see the module docstring)."""

    node: str
    ctid: int | None
    status: str
    health: str
    error: str | None
    facts: int | None  # blob id of the facts base
    node_facts: int | None  # blob id
    findings: int | None  # blob id of the findings list; None: no findings
    ignored: str  # JSON list
    since: str  # JSON object, code -> epoch

    def fields(self) -> tuple[Any, ...]:
        return (self.node, self.ctid, self.status, self.health, self.error, self.facts, self.node_facts,
                self.findings, self.ignored, self.since)

    def digest(self) -> bytes:
        return digest(dumps(self.fields()))

    def intern(self, conn: Conn) -> int:
        fields = self.fields()
        return _interned(conn, "states", digest(dumps(fields)),
                         "INSERT INTO states (digest, node, ctid, status, health, error, facts, node_facts,"
                         " findings, ignored, since) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", fields)


@dataclass(frozen=True)
class Previous:
    """What a new result takes from the target's earlier ones: since per code, and a facts base."""

    since: Mapping[str, float]
    facts: int | None  # the facts base of its newest earlier probed result


def previous(conn: Conn, target_id: int, run_id: int, *, probed: bool) -> Previous:
    """The target's previous result as the module docstring defines it (one or two index seeks backwards
    from run_id on target_results_by_target)."""
    newest = conn.execute(
        "SELECT s.status, s.since, s.facts FROM target_results t JOIN states s ON s.id = t.state"
        " WHERE t.target = ? AND t.run < ? ORDER BY t.run DESC LIMIT 1", (target_id, run_id)).fetchone()
    if newest is None:
        return Previous({}, None)
    ok = newest if newest[0] == "ok" else conn.execute(
        "SELECT s.status, s.since, s.facts FROM target_results t JOIN states s ON s.id = t.state"
        " WHERE t.target = ? AND t.run < ? AND s.status = 'ok' ORDER BY t.run DESC LIMIT 1",
        (target_id, run_id)).fetchone()
    carried = ok if probed else newest
    since = {} if carried is None else json.loads(carried[1])
    return Previous(since, None if ok is None else ok[2])


def carry_since(codes: Sequence[str], before: Mapping[str, float], started: float) -> str:
    """The since of each code: carried from the previous result, else this run's start."""
    return dumps({code: before.get(code, started) for code in dict.fromkeys(codes)})


# A delta larger than this share of the facts is not worth it: a new base is stored instead.
DELTA_SHARE = 8


def facts_rows(conn: Conn, facts: Mapping[str, Any] | None, base_id: int | None
               ) -> tuple[int | None, str | None]:
    """(facts base blob id, delta JSON or None) for these facts, against the target's earlier base."""
    if facts is None:
        return None, None
    base_row = None if base_id is None else conn.execute(
        "SELECT digest, data FROM blobs WHERE id = ?", (base_id,)).fetchone()
    kept = on_base(facts, base_id, base_row)
    return kept if kept is not None else (intern_blob(conn, facts), None)


def on_base(facts: Mapping[str, Any], base_id: int | None, base_row: Sequence[Any] | None
            ) -> tuple[int, str | None] | None:
    """(base_id, delta JSON or None) when these facts are stored as the target's earlier base (its blob's
    digest and data: base_row) plus a small delta; None when they need a base of their own."""
    if base_id is None or base_row is None or base_row[0] is None:
        return None
    text = dumps(facts)
    if bytes(base_row[0]) == digest(text):
        return base_id, None
    delta = leaf_delta(unpack(base_row[1]), facts)
    if delta is not None:
        delta_text = dumps(delta)
        if len(delta_text) * DELTA_SHARE <= len(text):
            return base_id, delta_text
    return None


def rebuild_facts(base: dict[str, Any] | None, delta: str | None) -> dict[str, Any] | None:
    if base is None:
        return None
    return base if delta is None else apply_delta(base, _delta(delta))


def _delta(text: str) -> Delta:
    value: Delta = json.loads(text)
    return value


def upsert_target(conn: Conn, site: str, name: str, started: float, probed: bool) -> int:
    """The id of the target `name` at `site`; first_seen and last_probed moved to take in this result.
    (CASE, not SQLite's two-argument min/max: PostgreSQL has none.)"""
    row = conn.execute(_UPSERT_TARGET, (site, name, started, started if probed else None)).fetchone()
    return int(row[0])


def upsert_target_sql() -> str:
    """upsert_target's statement (parameters: site, name, started, started if probed else None)."""
    return _UPSERT_TARGET


_UPSERT_TARGET = (
    "INSERT INTO targets (site, name, first_seen, last_probed) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (site, name) DO UPDATE SET"
    " first_seen = CASE WHEN excluded.first_seen < targets.first_seen THEN excluded.first_seen"
    "  ELSE targets.first_seen END,"
    " last_probed = CASE"
    "  WHEN excluded.last_probed IS NULL THEN targets.last_probed"
    "  WHEN targets.last_probed IS NULL OR targets.last_probed < excluded.last_probed"
    "  THEN excluded.last_probed ELSE targets.last_probed END"
    " RETURNING id")


def _upsert_target_v5(conn: Conn, name: str, started: float, probed: bool) -> int:
    """upsert_target as v5's conversion needs it (v5's targets have no site)."""
    row = conn.execute(
        "INSERT INTO targets (name, first_seen, last_probed) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE"
        " SET first_seen = min(first_seen, excluded.first_seen), last_probed = CASE"
        "  WHEN excluded.last_probed IS NULL THEN last_probed"
        "  WHEN last_probed IS NULL THEN excluded.last_probed"
        "  ELSE max(last_probed, excluded.last_probed) END"
        " RETURNING id", (name, started, started if probed else None)).fetchone()
    return int(row[0])


def health_counts(conn: Conn, run_id: int, *, table: str = "target_results") -> dict[str, int]:
    """Targets per health in one run, counted from its rows (`table`: the conversion's temporary name)."""
    return {str(health): int(count) for health, count in conn.execute(
        f"SELECT s.health, COUNT(*) FROM {table} t JOIN states s ON s.id = t.state WHERE t.run = ?"
        " GROUP BY s.health", (run_id,))}


# -- v4 -> v5 ----------------------------------------------------------------------------------------

_V5_TABLES = (
    """CREATE TABLE targets (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        first_seen REAL NOT NULL,  -- the start of the first run it is recorded in
        last_probed REAL           -- the start of the newest run it was probed in (status ok)
    )""",
    """CREATE TABLE blobs (
        id INTEGER PRIMARY KEY,
        digest BLOB NOT NULL UNIQUE,
        data NOT NULL  -- JSON text, or its zlib (BLOB) when that is smaller
    )""",
    """CREATE TABLE states (
        id INTEGER PRIMARY KEY,
        digest BLOB NOT NULL UNIQUE,
        node TEXT NOT NULL,
        ctid INTEGER,
        status TEXT NOT NULL,
        health TEXT NOT NULL,
        error TEXT,
        facts INTEGER,       -- blobs.id: the facts base (target_results.delta applies to it)
        node_facts INTEGER,  -- blobs.id
        findings INTEGER,    -- blobs.id of the findings list; NULL: none
        ignored TEXT NOT NULL,
        since TEXT NOT NULL  -- {code: epoch}: since when the target has shown each code
    )""",
    # WITHOUT ROWID: the primary key is the table, so a row costs its ~25 bytes once, not twice.
    # No foreign keys: checking them costs every insert two lookups, and the store is the only writer.
    """CREATE TABLE target_results_v5 (
        run INTEGER NOT NULL,
        target INTEGER NOT NULL,
        state INTEGER NOT NULL,
        duration REAL NOT NULL,
        delta TEXT,  -- facts leaves that differ from the state's facts base; NULL: none
        PRIMARY KEY (run, target)
    ) WITHOUT ROWID""",
)


def _convert_to_v5(conn: Conn) -> None:
    """Rewrite a v4 history in the v5 layout, run by run in order, keeping every value: facts, findings,
    since (as recorded, not recomputed), first_seen and last_probed (from the runs' starts)."""
    for statement in _V5_TABLES:
        conn.execute(statement)
    conn.execute("ALTER TABLE runs ADD COLUMN counts TEXT")  # {health: targets}, set when it finishes
    conn.execute("ALTER TABLE runs ADD COLUMN pruned REAL")  # when its results were pruned
    runs = conn.execute("SELECT id, started FROM runs ORDER BY id").fetchall()
    bases: dict[int, int] = {}  # target id -> its newest facts base: deltas follow the target
    for run_id, started in runs:
        findings: dict[str, list[tuple[Any, ...]]] = {}
        for target, code, severity, summary, evidence, fix, since in conn.execute(
            "SELECT target, code, severity, summary, evidence, fix, since FROM findings WHERE run = ?"
            " ORDER BY target, seq", (run_id,),
        ):
            findings.setdefault(target, []).append((code, severity, summary, evidence, fix, since))
        rows = conn.execute(
            "SELECT target, node, ctid, status, health, error, duration, facts, ignored, node_facts"
            " FROM target_results WHERE run = ?", (run_id,)).fetchall()
        for name, node, ctid, status, health, error, duration, facts, ignored, node_facts in rows:
            target_id = _upsert_target_v5(conn, name, float(started), status == "ok")
            listed = findings.get(name, [])
            streaks: dict[str, float] = {}
            for code, *_, value in listed:
                if value is not None:
                    streaks[code] = min(streaks.get(code, value), value)
            base, delta = facts_rows(conn, None if facts is None else json.loads(facts), bases.get(target_id))
            if base is not None:
                bases[target_id] = base
            state = State(
                node=node, ctid=ctid, status=status, health=health, error=error, facts=base,
                node_facts=None if node_facts is None else intern_blob(conn, json.loads(node_facts)),
                findings=intern_blob(conn, [
                    {"code": code, "severity": severity, "summary": summary, "evidence": json.loads(evidence),
                     "fix": json.loads(fix)} for code, severity, summary, evidence, fix, _ in listed
                ]) if listed else None,
                ignored=dumps(json.loads(ignored)), since=dumps(streaks),
            )
            conn.execute("INSERT INTO target_results_v5 (run, target, state, duration, delta)"
                         " VALUES (?, ?, ?, ?, ?)",
                         (run_id, target_id, state.intern(conn), float(duration or 0.0), delta))
    for (run_id,) in conn.execute("SELECT id FROM runs WHERE status = 'complete'").fetchall():
        counts = health_counts(conn, run_id, table="target_results_v5")
        conn.execute("UPDATE runs SET counts = ? WHERE id = ?", (dumps(counts), run_id))
    conn.execute("DROP TABLE findings")  # first: it refers to target_results
    conn.execute("DROP TABLE target_results")
    conn.execute("ALTER TABLE target_results_v5 RENAME TO target_results")



# MIGRATIONS[n - 1] upgrades version n - 1 to n. An entry is SQL statements, or a function for a data
# migration SQL alone cannot express.
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
        "ALTER TABLE target_results ADD COLUMN node_facts TEXT",
        "CREATE INDEX target_results_by_target_run ON target_results(target, status, run)",
        "CREATE INDEX target_results_by_run_health ON target_results(run, health)",
        _backfill_since,
    ),
    (  # 5: facts and findings stored once per change; per-run rows of ~25 bytes (the module docstring)
        _convert_to_v5,
        # a target's results newest first: its previous result, drift's per-target baseline, pruning
        "CREATE INDEX target_results_by_target ON target_results(target, run)",
    ),
    (  # 6: several controllers, one history: each run's site and controller; a target is (site, name)
        "ALTER TABLE runs ADD COLUMN site TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE runs ADD COLUMN controller TEXT",  # NULL: recorded before v6, by whoever ran it
        "CREATE INDEX runs_by_site ON runs(site, status, id)",
        """CREATE TABLE targets_v6 (
            id INTEGER PRIMARY KEY,
            site TEXT NOT NULL,
            name TEXT NOT NULL,
            first_seen REAL NOT NULL,
            last_probed REAL,
            UNIQUE (site, name)
        )""",
        "INSERT INTO targets_v6 (id, site, name, first_seen, last_probed)"
        " SELECT id, 'default', name, first_seen, last_probed FROM targets",
        "DROP TABLE targets",
        "ALTER TABLE targets_v6 RENAME TO targets",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


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
