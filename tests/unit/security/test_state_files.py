"""Issue 18: state and store faults, and the modes of the files fleetfix writes.

Before: a corrupt or locked audit database and a full state disk ended in tracebacks; `audit history --db
typo.db` created an empty database; the audit DB and reports were 0644, the state dir 0755, and with
umask 000 files became 0777.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fleetfix.audit.store import AuditStore
from fleetfix.errors import ConfigError, StoreError

REPO = Path(__file__).resolve().parents[3]


def fleetfix(*args: str, umask: int | None = None, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", **(env or {})},
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["history"], ["show", "last"], ["diff", "1", "2"]])
def test_reading_a_database_that_is_not_there_creates_nothing(tmp_path: Path, command: list[str]) -> None:
    typo = tmp_path / "typo.db"
    line = one_line(fleetfix("audit", *command, "--db", str(typo)), 2)
    assert "no audit database here" in line
    assert not list(tmp_path.iterdir())


def test_a_locked_database_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db):
        pass
    holder = sqlite3.connect(db, isolation_level=None)
    store = AuditStore(db)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, and never letting go
    try:
        store._conn.execute("PRAGMA busy_timeout = 0")  # no need to wait out the 30 s here
        with pytest.raises(StoreError, match="locked by another process"):
            store.start_run({})
    finally:
        store.close()
        holder.execute("ROLLBACK")
        holder.close()


def test_a_database_corrupted_after_opening_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db) as store:
        store.finish_run(store.start_run({}))
        page_size = store._conn.execute("PRAGMA page_size").fetchone()[0]
    with AuditStore(db, readonly=True) as store:
        with db.open("r+b") as raw:  # trash every page after the first (the schema): the tables
            raw.seek(page_size)
            raw.write(b"\xff" * page_size * 3)
        with pytest.raises(StoreError, match="audit database is corrupt"):
            store.runs()


def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 1000)
    assert "cannot open audit database" in one_line(fleetfix("audit", "history", "--db", str(junk)), 2)


def test_a_full_disk_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db) as store:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL, as on a full disk
        with pytest.raises(StoreError) as caught:
            store.start_run({"padding": "x" * 100_000})
    assert str(caught.value).startswith(f"{db}: the disk is full")
    assert caught.value.exit_code == 1


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "state"
    playbook = tmp_path / "p.yaml"
    playbook.write_text("name: p\nsteps:\n- name: s\n  check: 'true'\n")
    env = {"FLEETFIX_STATE_DIR": str(state)}
    assert fleetfix("apply", str(playbook), "--local", env=env, umask=0).returncode == 0
    with AuditStore(tmp_path / "db" / "audit.db"):
        pass
    modes = {path.relative_to(tmp_path): path.stat().st_mode & 0o777
             for path in [state, *state.rglob("*"), tmp_path / "db", *(tmp_path / "db").rglob("*")]}
    for path, mode in modes.items():
        expected = 0o700 if (tmp_path / path).is_dir() else 0o600
        assert mode == expected, (path, oct(mode))


def test_an_old_0644_database_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db):
        pass
    db.chmod(0o644)
    with AuditStore(db):
        pass
    assert db.stat().st_mode & 0o777 == 0o600


def test_readonly_refuses_an_older_schema(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    sqlite3.connect(db).close()  # schema v0: an empty database
    with pytest.raises(ConfigError, match="schema v0"):
        AuditStore(db, readonly=True)


def test_a_full_disk_under_the_run_record_fails_the_target_with_the_reason(tmp_path: Path) -> None:
    """/dev/full answers every write with ENOSPC: the run record's file is pointed at it."""
    from fleetfix.playbook.records import RunRecorder

    recorder = RunRecorder(tmp_path)
    recorder._file.close()
    recorder._file = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115
    with pytest.raises(StoreError, match=r"cannot write the run record .*: No space left on device"):
        recorder.event("target-start", target="a")
    recorder.event("target-end", target="a")  # the record is closed: dropped, no second error
    assert recorder.failure is not None
    recorder.close()


def test_a_state_dir_from_the_environment_is_private_with_its_parents(tmp_path: Path) -> None:
    # `fleetfix audit` takes its lock in the state dir before the history opens it: with umask 000 that
    # created $FLEETFIX_STATE_DIR (and the parents it made) 0777, and the lock file 0644.
    state = tmp_path / "made" / "by" / "fleetfix" / "state"
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    with socket.socket() as closed:  # a loopback port nobody listens on: the target is unreachable
        closed.bind(("127.0.0.1", 0))
        done = fleetfix("audit", "--host", "127.0.0.1", "--port", str(closed.getsockname()[1]),
                        "--known-hosts", str(known_hosts), env={"FLEETFIX_STATE_DIR": str(state)}, umask=0)
    assert done.returncode == 4, done.stderr
    made = [tmp_path / "made", *sorted((tmp_path / "made").rglob("*"))]
    assert state in made and (state / "audit.db").exists()
    modes = {str(path.relative_to(tmp_path)): oct(path.stat().st_mode & 0o777) for path in made}
    assert modes == {name: oct(0o700 if (tmp_path / name).is_dir() else 0o600) for name in modes}, modes


def test_a_new_wheel_cache_and_its_parents_are_private_under_umask_000(tmp_path: Path) -> None:
    from fleetfix.wheels.cache import WheelCache

    root = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        with WheelCache(root).lock({"name": "demo", "version": "1"}, "upstream"):
            pass
    finally:
        os.umask(old)
    made = [tmp_path / "a", tmp_path / "a" / "b", root, *[p for p in root.rglob("*") if p.is_dir()]]
    for directory in made:
        assert directory.stat().st_mode & 0o777 == 0o700, directory
