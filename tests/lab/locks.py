"""Locks around the test bed's machine-wide caches (standard library only).

A cache under /var/cache/fleetfix-lab or /opt/fleetfix-test-cache is built by whichever test needs it first.
Two pytest-xdist workers (or two sessions) can need the same one at once on a fresh machine: without a lock
the second would see a half-built directory, remove it under the first, or rename onto it. Every builder
takes `cache_lock(dest)` around its "is it there? else build it" step; the lock file sits beside dest, so
whichever test file builds a given cache, they all serialise on the same lock.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on path (created if missing), released on exit; it blocks until it is free."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_lock(dest: Path) -> AbstractContextManager[None]:
    """The lock for building the cache entry dest: `.NAME.lock` beside it."""
    return file_lock(dest.with_name(f".{dest.name}.lock"))
