"""The audit history over a year: its size, and how fast `audit history` / `show` / `diff` answer on it.

    python -m benchmarks.history --targets 10000 --nights 365 --churn 0.01 [--volatile] [--json FILE]
    python -m benchmarks.history --audit-writes --targets 1000 --nights 5 --volatile [--db URL|lab]

Writes a synthetic year through the store's own API (AuditStore.start_run / record_targets / finish_run,
the code an audit runs), nightly runs of N targets of which a share `churn` change state each night (a
problem appears or is fixed: their findings and facts change). Every target has facts of its own (its
hostname), made from the probe's recorded fixtures diagnosed by the real rules (benchmarks/dashboard.py's
fleet). --volatile also moves the leaves real facts move every night (`build.mem_available_mb`, a
`disk_free_mb` entry) on every target, which content addressing alone would store again each night.

A night is recorded in one transaction (record_targets) so that a year takes minutes: an audit commits each
target as it arrives (record_target), whose cost is measured apart on one extra night ("audit write",
per-target transactions, as `fleetfix audit` does). Then, on the year's database: the CLI commands as a
user runs them (a fresh process each: start-up included), `load_audit` in this process, and a prune to 90
days. Sizes are the database file after a checkpoint (WAL folded in).

--audit-writes measures only what an audit's writing costs: `nights` nights of `targets` results, each
committed on its own (record_target), into a new SQLite file, or with --db into PostgreSQL (a
postgresql:// URL whose history is new, or `lab`: a throwaway cluster on a Unix socket, tests/lab/
pgserver.py). Per result: wall and CPU of this process; on PostgreSQL also the server's CPU (its
backend's, when it runs on this machine) and the round trips (the points
the client, having sent, reads the server's answers: libpq's trace).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.dashboard import Fleet
from fleetfix.audit import AuditStore, load_audit
from fleetfix.audit.model import TargetResult

REPO = Path(__file__).resolve().parents[1]
DAY = 86400.0


class Year:
    """The synthetic fleet: per target a profile (its facts and findings), changed for `churn` of them
    each night."""

    def __init__(self, targets: int, churn: float, volatile: bool, seed: int = 21) -> None:
        self.fleet = Fleet(targets, seed)
        self.fleet.random = random.Random(seed)
        self.churn = churn
        self.volatile = volatile
        self.random = random.Random(seed + 1)

    def night(self) -> None:
        for name in self.fleet.state:
            if self.random.random() < self.churn:
                self.fleet.state[name] = (
                    "healthy" if self.random.random() < 0.6 else self.fleet._pick())

    def results(self) -> Iterator[TargetResult]:
        for result in self.fleet.results(with_facts=True):
            if result.facts is None:
                yield result
                continue
            facts = {**result.facts, "hostname": result.target.replace("/", "-")}
            if self.volatile:
                build = dict(facts["build"])
                build["mem_available_mb"] = self.random.randrange(1000, 60000)
                build["disk_free_mb"] = {**build["disk_free_mb"], "/": self.random.randrange(1000, 60000)}
                facts["build"] = build
            yield TargetResult(result.target, result.node, result.ctid, result.status, result.error,
                               result.findings, facts, round(self.random.uniform(0.2, 2.0), 3),
                               result.ignored, result.node_facts)


def file_size(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db.stat().st_size


def cli_seconds(db: Path, *args: str, repeat: int = 3) -> float:
    """Median wall time of `fleetfix audit ARGS --db DB` as a user runs it (output to /dev/null)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fleetfix", "audit", *args, "--db", str(db)], cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(db: Path, targets: int, nights: int, churn: float, volatile: bool) -> dict[str, Any]:
    year = Year(targets, churn, volatile)
    start = time.time() - (nights + 1) * DAY
    sizes: dict[int, int] = {}
    night_cpu: list[float] = []
    with AuditStore(db) as store:
        for night in range(nights):
            if night:
                year.night()
            started = start + night * DAY
            run_id = store.start_run({"inventory": "/etc/fleetfix/inventory.yaml", "targets": targets},
                                     started=started)
            before = cpu()
            store.record_targets(run_id, year.results())
            store.finish_run(run_id, finished=started + 600)
            night_cpu.append(cpu() - before)
            if night + 1 in (1, 7, 30, 90, 180, 365) or night + 1 == nights:
                sizes[night + 1] = file_size(db)
                print(f"[history] night {night + 1}: {sizes[night + 1] / 1e6:.1f} MB, "
                      f"{night_cpu[-1]:.2f} s CPU", file=sys.stderr, flush=True)
        # One more night the way `fleetfix audit` records: a transaction per target as it arrives.
        year.night()
        started = start + nights * DAY
        run_id = store.start_run({"inventory": "/etc/fleetfix/inventory.yaml", "targets": targets},
                                 started=started)
        t0, c0 = time.perf_counter(), cpu()
        for result in year.results():
            store.record_target(run_id, result)
        store.finish_run(run_id, finished=started + 600)
        write_wall, write_cpu = time.perf_counter() - t0, cpu() - c0
    return {"sizes_bytes": sizes, "night_cpu_s_median": round(statistics.median(night_cpu), 3),
            "audit_write_wall_s": round(write_wall, 2), "audit_write_cpu_s": round(write_cpu, 2),
            "audit_write_ms_per_target": round(1000 * write_cpu / targets, 3)}


def audit_writes(db: str | Path, targets: int, nights: int, volatile: bool) -> dict[str, Any]:
    """Nights of results committed one by one, as `fleetfix audit` does (record_target)."""
    year = Year(targets, 0.01, volatile)
    start = time.time() - (nights + 1) * DAY
    walls: list[float] = []
    cpus: list[float] = []
    server_cpus: list[float] = []
    trips: list[float] = []
    with AuditStore(db) as store:
        server = _server_process(store)
        for night in range(nights):
            if night:
                year.night()
            results = list(year.results())
            started = start + night * DAY
            run_id = store.start_run({"targets": targets}, started=started)
            with _round_trips(store) as counted:
                t0, c0, s0 = time.perf_counter(), cpu(), _process_cpu(server)
                for result in results:
                    store.record_target(run_id, result)
                walls.append(1000 * (time.perf_counter() - t0) / targets)
                cpus.append(1000 * (cpu() - c0) / targets)
                if server is not None:
                    server_cpus.append(1000 * (_process_cpu(server) - s0) / targets)
            if counted:
                trips.append(counted[0] / targets)
            store.finish_run(run_id, finished=started + 600)
            print(f"[history] night {night + 1}: {walls[-1]:.2f} ms/result wall, {cpus[-1]:.2f} ms CPU"
                  + (f", server {server_cpus[-1]:.2f} ms CPU" if server_cpus else "")
                  + (f", {trips[-1]:.2f} round trips" if trips else ""), file=sys.stderr, flush=True)
    return {"write_ms_per_result_wall_median": round(statistics.median(walls), 2),
            "write_ms_per_result_cpu_median": round(statistics.median(cpus), 2),
            "write_ms_per_result_wall": [round(w, 2) for w in walls],
            "write_ms_per_result_server_cpu": [round(c, 2) for c in server_cpus],
            "round_trips_per_result": [round(t, 2) for t in trips]}


def _server_process(store: AuditStore) -> int | None:
    """The PostgreSQL backend serving the store, when it runs on this machine (its CPU is then read
    from /proc: it moves less than wall on a loaded machine)."""
    if not store.postgres:
        return None
    pid = int(store._conn.raw.info.backend_pid)
    return pid if Path(f"/proc/{pid}/stat").exists() else None


def _process_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@contextlib.contextmanager
def _round_trips(store: AuditStore) -> Iterator[list[int]]:
    """On PostgreSQL: [round trips] once the block is done (tests/lab/pgserver.round_trips); SQLite: []."""
    if not store.postgres:
        yield []
        return
    from tests.lab import pgserver

    with pgserver.round_trips(store._conn.raw) as counted:
        yield counted


def reads(db: Path) -> dict[str, Any]:
    with AuditStore(db, readonly=True) as store:
        last = store.resolve("last")
        t0 = time.perf_counter()
        run = load_audit(store, last)
        full = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_audit(store, last, facts=False)
        light = time.perf_counter() - t0
    return {
        "load_audit_s": round(full, 3), "load_audit_without_facts_s": round(light, 3),
        "drift_new_findings": len(run.drift.new_findings),
        "cli_history_s": cli_seconds(db, "history"),
        "cli_show_s": cli_seconds(db, "show", "last"),
        "cli_show_json_s": cli_seconds(db, "show", "last", "--json"),
        "cli_diff_s": cli_seconds(db, "diff", str(last - 30), "last"),
        "cli_python_s": _python_alone(),
    }


def _python_alone() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return round(time.perf_counter() - started, 3)


def prune(db: Path, keep_days: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    with AuditStore(db) as store:
        pruned = store.prune(keep_days=keep_days)
        prune_s = time.perf_counter() - t0
        store.vacuum()
    return {"keep_days": keep_days, "prune_s": round(prune_s, 2), "results_deleted": pruned.results,
            "bytes_after_vacuum": file_size(db)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, default=10000)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--volatile", action="store_true", help="also move mem/disk leaves every night")
    parser.add_argument("--prune-days", type=float, default=90)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the database here")
    parser.add_argument("--audit-writes", action="store_true",
                        help="only the per-result commits of an audit (the module docstring)")
    parser.add_argument("--db", help="with --audit-writes: a postgresql:// URL, or `lab` for a throwaway "
                        "cluster (default: a new SQLite file)")
    options = parser.parse_args()
    if options.audit_writes:
        _main_audit_writes(options)
        return
    work = Path(tempfile.mkdtemp(prefix="fleetfix-history-"))
    db = (options.keep or work) / "audit.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    try:
        t0 = time.perf_counter()
        result: dict[str, Any] = {"targets": options.targets, "nights": options.nights,
                                  "churn": options.churn, "volatile": options.volatile,
                                  "loadavg": os.getloadavg()[0]}
        result.update(build(db, options.targets, options.nights, options.churn, options.volatile))
        result["build_s"] = round(time.perf_counter() - t0, 1)
        result["bytes"] = file_size(db)
        result.update(reads(db))
        result["prune"] = prune(db, options.prune_days)
        result["loadavg_after"] = os.getloadavg()[0]
        _emit(result, options.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _emit(result: dict[str, Any], json_path: Path | None) -> None:
    print(json.dumps(result, indent=1))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")


def _main_audit_writes(options: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="fleetfix-history-"))
    try:
        with contextlib.ExitStack() as stack:
            db: str | Path = work / "audit.db"
            if options.db == "lab":
                from tests.lab import pgserver

                db = stack.enter_context(pgserver.running_server()).fresh_url()
            elif options.db:
                db = options.db
            result: dict[str, Any] = {"db": "sqlite" if isinstance(db, Path) else "postgresql",
                                      "targets": options.targets, "nights": options.nights,
                                      "volatile": options.volatile, "loadavg": os.getloadavg()}
            result.update(audit_writes(db, options.targets, options.nights, options.volatile))
            result["loadavg_after"] = os.getloadavg()
        _emit(result, options.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
