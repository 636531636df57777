"""The source archive of a wheel, held by the controller: what a build's manifest can say it was built from.

A `wheels` item may name its source (the step's `source:`): an sdist the controller takes itself, from an
absolute path, a file:// URL or an https URL (wheels/httpfetch.py's rules: https only, plain http only for a
pinned digest, redirects stay on https). The controller hashes the bytes as they land in its own private
file, refuses them when the item pins another sha256 (`source_sha256:`, or the operator's wheel lock),
and only then pushes exactly those bytes to the builder, which builds from that file. So the sha256 in
the manifest is the controller's measurement of the archive the wheel was built from, never a guest's
report, and a builder never chooses its source.

The distribution's name and version come from the archive's file name (`{name}-{version}.tar.gz`, PEP 625,
or the older `.zip`), checked as names and versions (PEP 508, PEP 440) before they reach a path; the build
must then leave a wheel of exactly that name and version (playbook/wheels.py), so a file misnamed by its
publisher fails there. Each location is taken once per run, however many targets and items ask for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleetfix.wheels.cache import WheelCache, canonical_name, name_problem, version_problem
from fleetfix.wheels.httpfetch import Expected, Fetcher, FetchError

_SDIST = re.compile(r"^(?P<stem>.+?)(?P<ext>\.tar\.gz|\.zip)$")
_DIGEST = re.compile(r"^(?:sha256:)?([0-9a-fA-F]{64})$")
_CHUNK = 1 << 20


class SourceRefused(Exception):
    """Why an item's source was not taken (or not the pinned one); nothing was built or installed."""


@dataclass(frozen=True)
class SourceArchive:
    location: str  # as the item named it: an absolute path, file:// or https:// URL
    path: Path  # the controller's private copy
    filename: str
    name: str  # canonical (PEP 503)
    version: str
    sha256: str
    size: int

    @property
    def shown(self) -> str:
        """The location as manifests and events record it: a URL without user or password."""
        parts = urllib.parse.urlsplit(self.location)
        if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
            return self.location
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def sdist_name_version(filename: str) -> tuple[str, str] | str:
    """(canonical name, version) from an sdist's file name, or why it is not one."""
    found = _SDIST.match(filename)
    if found is None or "-" not in found["stem"]:
        return f"{filename[:80]!r} is not an sdist's file name (NAME-VERSION.tar.gz or .zip)"
    name, version = found["stem"].rsplit("-", 1)
    problem = name_problem(name) or version_problem(version)
    return problem if problem is not None else (canonical_name(name), version)


def pinned_digest(text: str) -> str | None:
    """The lower-case hex of `sha256:<hex>` or `<hex>`; None for "" (no pin). SourceRefused otherwise."""
    if not text.strip():
        return None
    found = _DIGEST.match(text.strip())
    if found is None:
        raise SourceRefused(f"source_sha256 {text[:80]!r} is not sha256:<64 hex digits>")
    return found[1].lower()


def _filename(location: str) -> tuple[str, str | None]:
    """(file name, local path or None for an https/http URL); SourceRefused for anything else."""
    parts = urllib.parse.urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme in ("https", "http"):
        return urllib.parse.unquote(parts.path.rpartition("/")[2]), None
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SourceRefused(f"{location}: a file:// URL names a file on this controller, not on "
                                f"{parts.netloc}")
        local = urllib.parse.unquote(parts.path)
    elif not scheme and location.startswith("/"):
        local = location
    else:
        raise SourceRefused(f"source {location[:120]!r}: use an absolute path, a file:// URL or an "
                            "https:// URL (on the controller)")
    return local.rpartition("/")[2], local


class _Pinned:
    """The fetcher's authenticator for one source: the pin, when the item or the lock gives one."""

    def __init__(self, pin: str | None, where: str) -> None:
        self.pin, self.where = pin, where

    def expected(self, url: str, fetcher: Fetcher) -> Expected | str:
        return Expected(self.pin, self.where, pinned=True) if self.pin else "no pinned sha256"


@dataclass
class Sources:
    """The run's source archives, by location; files live in the cache's private incoming folder until
    `close()` (run_playbook's end). lock_pin: the operator's wheel lock's pin for a URL, if any."""

    max_bytes: int
    lock_pin: Callable[[str], tuple[str, str] | None] = lambda url: None  # URL -> (sha256, "file:line")
    # By (location, the item's pin): an item whose pin differs is refused without spoiling another's take.
    _taken: dict[tuple[str, str | None], SourceArchive | str] = field(default_factory=dict)
    _locks: dict[tuple[str, str | None], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def take(self, location: str, pin_text: str, cache: WheelCache | None) -> SourceArchive:
        """The archive at location on the controller, hashed, and equal to the pin (the item's, else the
        lock's) when there is one; SourceRefused saying why not. Taken once per run per location and pin."""
        item_pin = pinned_digest(pin_text)
        with self._guard:
            lock = self._locks.setdefault((location, item_pin), threading.Lock())
        with lock:
            taken = self._taken.get((location, item_pin))
            if taken is None:
                try:
                    taken = self._take(location, item_pin, cache)
                except SourceRefused as refused:
                    taken = str(refused)
                self._taken[(location, item_pin)] = taken
        if isinstance(taken, str):
            raise SourceRefused(taken)
        return taken

    def _take(self, location: str, item_pin: str | None, cache: WheelCache | None) -> SourceArchive:
        filename, local = _filename(location)
        names = sdist_name_version(filename)
        if isinstance(names, str):
            raise SourceRefused(f"source {location[:120]}: {names}")
        locked = self.lock_pin(location) if local is None else None
        pin, where = (item_pin, "the item's source_sha256") if item_pin else (
            locked if locked is not None else (None, ""))
        # The cache's private incoming folder (same filesystem as the cache), else a private temporary one.
        dest = cache.incoming(filename) if cache is not None else Path(
            tempfile.mkdtemp(prefix="fleetfix-source-")) / filename
        try:
            if local is None:
                fetcher = Fetcher(authenticator=_Pinned(pin, where), allow_unverified=True)
                try:
                    fetched = fetcher.fetch(location, dest, max_bytes=self.max_bytes)
                except FetchError as error:
                    raise SourceRefused(f"source not fetched: {error.reason}") from None
                sha256, size = fetched.sha256, fetched.size
            else:
                sha256, size = _copy(Path(local), dest, self.max_bytes)
            if pin is not None and sha256 != pin:
                raise SourceRefused(f"{filename}: sha256 {sha256} is not the pinned {pin} ({where}); "
                                    "nothing built")
        except BaseException:
            _remove(dest)
            raise
        return SourceArchive(location, dest, filename, names[0], names[1], sha256, size)

    def close(self) -> None:
        """Remove the run's copies."""
        with self._guard:
            for taken in self._taken.values():
                if isinstance(taken, SourceArchive):
                    _remove(taken.path)
            self._taken.clear()


def _copy(source: Path, dest: Path, max_bytes: int) -> tuple[str, int]:
    """Copy a regular file into dest (0600, new), hashing what is written: (sha256, size)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise SourceRefused(f"source {source}: {error.strerror or error}") from None
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise SourceRefused(f"source {source} is not a regular file")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(out, "wb") as writer:
            while chunk := reader.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise SourceRefused(f"source {source} is over the limit of {max_bytes} bytes")
                digest.update(chunk)
                writer.write(chunk)
    return digest.hexdigest(), size


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # the incoming() folder
