"""A throwaway PostgreSQL cluster for the history tests: Debian's server binaries (the `postgresql`
package .ci/run installs), never its system service or cluster. initdb into a private temporary
directory as the unprivileged `postgres` user (the server refuses root), listening only on a Unix socket
in that directory (no TCP at all), trust authentication (nothing else can reach the socket: the
directory is 0700 to its owner). One cluster per test session; each test gets its own schema in it
(`PgServer.fresh_url`), which costs a CREATE SCHEMA instead of a cluster or a database.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import psycopg

SERVICE_USER = "postgres"


def server_bin() -> Path | None:
    """The newest installed server's bin directory (/usr/lib/postgresql/<major>/bin), or None."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    found = sorted((p for p in root.glob("*/bin") if (p / "initdb").is_file()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


def problem() -> str | None:
    """Why no cluster can be started here, or None."""
    if server_bin() is None:
        return "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            return f"no {SERVICE_USER!r} user to run the server as (the postgresql package creates it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (fleetfix[postgres])"
    return None


class PgServer:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.socket_dir = base / "run"
        self._bin = server_bin()
        self._schemas = itertools.count(1)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", SERVICE_USER, "--"]
            entry = pwd.getpwnam(SERVICE_USER)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        self.socket_dir.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid)

    def _run(self, tool: str, *args: str) -> None:
        assert self._bin is not None
        subprocess.run([*self._as_user, str(self._bin / tool), *args], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120, cwd=self.base)

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", SERVICE_USER, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--locale=C")
        # No TCP; durability traded for speed (a test cluster is thrown away).
        options = (f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off -c max_connections=60")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.base / "server.log"),
                  "-w", "-t", "60", "start")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres", *, options: str = "") -> str:
        query = f"host={quote(str(self.socket_dir), safe='')}" + (f"&options={quote(options, safe='')}"
                                                                    if options else "")
        return f"postgresql://{SERVICE_USER}@/{database}?{query}"

    def admin(self) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def fresh_url(self) -> str:
        """A URL whose search_path is a new, empty schema: a history of its own."""
        schema = f"t{next(self._schemas)}"
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return self.url(options=f"-csearch_path={schema}")


@contextlib.contextmanager
def round_trips(conn: psycopg.Connection[Any]) -> Iterator[list[int]]:
    """[the round trips this connection made in the block] once it is done, counted in libpq's own trace
    of the messages (PQtrace), whatever the code above libpq does: count_round_trips."""
    counted: list[int] = []
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            yield counted
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        counted.append(count_round_trips(trace.read().decode(errors="replace")))


def count_round_trips(trace: str) -> int:
    """Round trips in a libpq trace: each time the client, having sent messages (F lines), reads the
    server's answers (B lines). Pipelined statements sent before any answer is read count once."""
    trips = 0
    sending = False
    for line in trace.splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        if fields[1] == "F":
            sending = True
        elif fields[1] == "B" and sending:
            trips += 1
            sending = False
    return trips


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    base = Path(tempfile.mkdtemp(prefix="fleetfix-pg-"))
    server = PgServer(base)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
