"""One `fleetfix audit` at a time per history database.

Two audits writing one history at once (a cron line that fired while last night's run still hangs, or a
person running one by hand during the nightly run) would each take the other's half-written run as
neither baseline nor result, and report drift that is only their overlap. So an audit holds an exclusive
flock(2) on `<database>.lock` from before it probes until its last report is written (its remediation
included); a second one exits at once with AuditBusyError instead of queueing behind it (the systemd
timer already never starts a unit that is still running; this covers cron and people). The kernel drops
the lock when the process ends, however it ends, so a killed audit never leaves a stale lock behind.
Readers (`audit history`, `show`, `diff`) take no lock: SQLite's WAL lets them read during a run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from fleetfix.errors import AuditBusyError
from fleetfix.paths import private_dir

LOCK_SUFFIX = ".lock"


def lock_path(db: Path) -> Path:
    return db.with_name(db.name + LOCK_SUFFIX)


@contextlib.contextmanager
def exclusive_audit(db: Path) -> Iterator[None]:
    """Hold the history's audit lock for the duration; AuditBusyError if another audit holds it."""
    path = lock_path(db)
    private_dir(path.parent)  # often the state dir itself: 0700 whatever the umask, as every state dir
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise AuditBusyError(f"another audit of this history is running ({holder}); not starting a "
                                 "second one", path=str(db)) from None
        # Who holds it, for the message a second audit prints (the lock itself is the flock, not this).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock; the file stays (removing it would race with the next audit)
