"""`fleetfix` itself, with timers around the audit's store writes, its load and its reports (scale mode).

    python -m benchmarks.scale_cli audit -i inventory.yaml --db audit.db ...

Runs the real command (fleetfix.cli.main) in this process; the only addition is timing: every
AuditStore.record_targets call (each result the audit commits: wall time including the wait for the store's
lock, the time the lock was held, i.e. the writes' serial time, and CPU of the thread that committed it),
load_audit, and the reports (ReportChoice.emit). They are printed as one line on stderr,
`SCALE {json}`, when the process exits, so benchmarks/scale.py can report the audit write time apart from
the whole process's CPU and RSS (which it measures from outside, os.wait4).
"""

from __future__ import annotations

import atexit
import functools
import json
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import fleetfix.audit as audit_package
from fleetfix.audit.store import AuditStore
from fleetfix.cli import main
from fleetfix.cli.common import ReportChoice

_lock = threading.Lock()
timings: dict[str, float] = {"record_wall_s": 0.0, "record_cpu_s": 0.0, "records": 0,
                             "store_lock_held_s": 0.0, "load_audit_s": 0.0, "reports_s": 0.0}


class _TimedLock:
    """The store's lock, counting how long it is held (every store call: writes, and the few reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since = 0.0

    def __enter__(self) -> None:
        self._lock.acquire()
        self._since = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        held = time.perf_counter() - self._since
        self._lock.release()
        with _lock:
            timings["store_lock_held_s"] += held


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Time `function`; also the process's peak RSS when it is first entered (the peak of every phase
    before it: for load_audit, probing and recording) and when it last returns (through it), so a peak
    can be put down to a phase."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        with _lock:
            timings.setdefault(f"peak_rss_mib_before_{key}", _peak_rss_mib())
        try:
            return function(*args, **kwargs)
        finally:
            with _lock:
                timings[key] += time.perf_counter() - started
                timings[f"peak_rss_mib_after_{key}"] = _peak_rss_mib()

    return wrapper


def _timed_record(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            with _lock:
                timings["record_wall_s"] += time.perf_counter() - wall
                timings["record_cpu_s"] += time.thread_time() - cpu
                timings["records"] += 1

    return wrapper


def _report() -> None:
    print("SCALE " + json.dumps(timings), file=sys.stderr, flush=True)


def install() -> None:
    original_init = AuditStore.__init__

    @functools.wraps(original_init)
    def init(self: AuditStore, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._lock = _TimedLock()  # type: ignore[assignment]

    AuditStore.__init__ = init  # type: ignore[method-assign]
    AuditStore.record_targets = _timed_record(AuditStore.record_targets)  # type: ignore[method-assign]
    # run_audit calls load_audit by its module-level name
    audit_package.load_audit = _timed("load_audit_s", audit_package.load_audit)
    ReportChoice.emit = _timed("reports_s", ReportChoice.emit)  # type: ignore[method-assign]
    atexit.register(_report)


if __name__ == "__main__":
    install()
    main(prog_name="fleetfix")
