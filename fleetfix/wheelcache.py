"""The controller's wheel cache: one directory per binary-compatibility key, each a pip wheelhouse.

    <root>/                                     0700 (default <state dir>/wheels)
      fleetfix-tiny-ext-0.1.0-3f2a9c1e0b7d4a55/ one key: pip install --no-index --find-links <this dir>
        fleetfix_tiny_ext-0.1.0-cp311-cp311-linux_x86_64.whl    0600
        manifest.json                           0600: key, key digest, wheel, sha256, size, built_on,
                                                built_at (UTC), build_seconds, source
      .locks/<key digest>.lock                  flock: one builder per key, across threads and processes
      .incoming/                                pulls land here first (same filesystem: rename into place)

The key is what decides whether a compiled extension wheel works on a target (docs/extensions.md): the
distribution's name and version plus the fields the playbook renders (Python tag, torch version and its
CUDA, the C++ ABI, the CUDA toolkit used, the arch list, the machine, libc). A lookup matches the whole key
exactly, never a part of it, and re-hashes the wheel: an entry whose sha256 differs from its manifest is
refused and removed (it is never handed out), so the caller builds again. Directories named as wheelhouses
(a CI's output in the same layout, copied or mounted) are looked up after the cache, read-only: a corrupt
entry there is refused and left alone.

No I/O outside the root and the wheelhouses; nothing here talks to a target.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetfix.errors import ConfigError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_LOCKS, _INCOMING = ".locks", ".incoming"
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl, name and version without dashes.
_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def canonical_name(name: str) -> str:
    """PEP 503: case and runs of -_. do not matter (causal_conv1d, Causal-Conv1d: causal-conv1d)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def key_digest(key: Mapping[str, str]) -> str:
    """sha256 of the key as canonical JSON: the same key always gives the same digest."""
    text = json.dumps(dict(key), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def missing_fields(key: Mapping[str, str]) -> list[str]:
    """The key fields with no value: such a key cannot prove two targets compatible, so it is not cached."""
    return sorted(name for name, value in key.items() if not str(value).strip())


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    found = _WHEEL.match(filename)
    return (canonical_name(found["name"]), found["version"]) if found else None


def wheel_problem(path: Path, *, name: str, version: str, tag: str) -> str | None:
    """Why the wheel at path is not distribution name (canonical) at exactly version for tag, judged by its
    own dist-info (METADATA's Name and Version, WHEEL's Tag lines), or None. For a wheel that arrived from
    elsewhere: its file name alone proves nothing, and no checksum came with it, so every member's CRC is
    read too (bytes damaged on the way are refused here, not halfway through pip's unpacking)."""
    try:
        with zipfile.ZipFile(path) as wheel:
            damaged = wheel.testzip()
            if damaged is not None:
                return f"not a readable wheel (bad CRC-32 for {damaged})"
            infos = {entry.split("/")[0] for entry in wheel.namelist()
                     if entry.count("/") == 1 and entry.split("/")[0].endswith(".dist-info")}
            if len(infos) != 1:
                return f"{len(infos)} .dist-info directories, not one"
            (info,) = infos
            metadata = _headers(wheel.read(f"{info}/METADATA"))
            tags = {value for field, value in _header_lines(wheel.read(f"{info}/WHEEL")) if field == "tag"}
    except (OSError, KeyError, zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError) as error:
        return f"not a readable wheel ({error})"
    found = (canonical_name(metadata.get("name", "")), metadata.get("version", ""))
    if found != (name, version):
        return f"its metadata says {found[0]} {found[1]}, not {name} {version}"
    if tag not in tags:
        return f"its tags are {', '.join(sorted(tags)) or 'none'}, not {tag}"
    return None


def _header_lines(data: bytes) -> list[tuple[str, str]]:
    """RFC 822-style "Field: value" lines up to the first blank line (the body), fields lower-cased."""
    lines = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            break
        field, colon, value = line.partition(":")
        if colon:
            lines.append((field.strip().lower(), value.strip()))
    return lines


def _headers(data: bytes) -> dict[str, str]:
    return dict(reversed(_header_lines(data)))  # the first occurrence wins


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    key: dict[str, str]
    wheel: str  # file name inside directory
    sha256: str
    size: int
    built_on: str
    built_at: str
    build_seconds: float | None
    source: str  # "build", or where a downloaded wheel came from

    @property
    def path(self) -> Path:
        return self.directory / self.wheel

    @property
    def digest(self) -> str:
        return key_digest(self.key)

    def to_dict(self) -> dict[str, Any]:
        return {"fleetfix_wheel_cache": MANIFEST_VERSION, "key": self.key, "key_digest": self.digest,
                "wheel": self.wheel, "sha256": self.sha256, "size": self.size, "built_on": self.built_on,
                "built_at": self.built_at, "build_seconds": self.build_seconds, "source": self.source}


@dataclass
class Lookup:
    """What a lookup found: an entry whose wheel was re-hashed and matched, and the entries it refused."""

    entry: CacheEntry | None = None
    refused: list[str] = field(default_factory=list)  # one line each: which entry, and why


def _read_entry(directory: Path) -> CacheEntry:
    data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("fleetfix_wheel_cache") != MANIFEST_VERSION:
        raise ValueError("not a fleetfix wheel-cache manifest")
    key = data["key"]
    if not isinstance(key, dict) or not all(isinstance(v, str) for v in key.values()):
        raise ValueError("manifest key is not a mapping of strings")
    wheel = str(data["wheel"])
    if "/" in wheel or wheel_name_version(wheel) is None:
        raise ValueError(f"manifest names no wheel file: {wheel!r}")
    seconds = data.get("build_seconds")
    return CacheEntry(directory, {str(k): v for k, v in key.items()}, wheel, str(data["sha256"]),
                      int(data["size"]), str(data.get("built_on", "")), str(data.get("built_at", "")),
                      float(seconds) if isinstance(seconds, int | float) else None,
                      str(data.get("source", "build")))


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # also when it existed with a wider mode, or the umask narrowed mkdir's
    return path


class WheelCache:
    """The cache at root (created 0700 on first write), and read-only wheelhouses in the same layout."""

    def __init__(self, root: str | Path, *, wheelhouses: Sequence[str | Path] = ()) -> None:
        self.root = Path(root)
        self.wheelhouses = [Path(path) for path in wheelhouses]
        for house in self.wheelhouses:
            if not house.is_dir():
                raise ConfigError(f"wheelhouse {house} is not a directory")

    # -- naming ---------------------------------------------------------------------------------------

    @staticmethod
    def entry_name(key: Mapping[str, str]) -> str:
        """<name>-<version>-<16 hex of the key digest>: readable, and unique per key."""
        name = canonical_name(key.get("name", "wheel")) or "wheel"
        version = re.sub(r"[^A-Za-z0-9_.!+]", "_", key.get("version", "")) or "0"
        return f"{name}-{version}-{key_digest(key)[:16]}"

    # -- concurrency ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: Mapping[str, str]) -> Iterator[None]:
        """Hold the key: the first holder builds; the others wait here and then find its entry. An flock,
        so two threads (two targets) and two fleetfix processes sharing the cache exclude each other."""
        path = _private_dir(self.root / _LOCKS) / f"{key_digest(key)}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    # -- reading --------------------------------------------------------------------------------------

    def lookup(self, key: Mapping[str, str]) -> Lookup:
        """The entry for exactly this key, its wheel's sha256 re-checked: the cache first, then each
        wheelhouse. A cache entry that fails the check is removed; a wheelhouse's is only skipped."""
        found = Lookup()
        name = self.entry_name(key)
        for base, writable in ((self.root, True), *((house, False) for house in self.wheelhouses)):
            directory = base / name
            if not (directory / MANIFEST).is_file():
                continue
            problem = self._problem(directory, key)
            if problem is None:
                found.entry = _read_entry(directory)
                return found
            found.refused.append(f"{directory}: {problem}" + ("; removed" if writable else "; skipped"))
            if writable:
                shutil.rmtree(directory, ignore_errors=True)
        return found

    def _problem(self, directory: Path, key: Mapping[str, str]) -> str | None:
        """Why the entry in directory must not be used for key, or None."""
        try:
            entry = _read_entry(directory)
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"unreadable manifest ({error})"
        if entry.key != dict(key):
            return "its manifest is for another key"
        try:
            size, digest = entry.path.stat().st_size, file_sha256(entry.path)
        except OSError as error:
            return f"wheel unreadable ({error.strerror or error})"
        if digest != entry.sha256 or size != entry.size:
            return (f"checksum mismatch: manifest sha256 {entry.sha256} ({entry.size} bytes), "
                    f"file {digest} ({size} bytes)")
        return None

    def entries(self) -> list[CacheEntry]:
        """Every readable entry of the cache (not the wheelhouses), by directory name."""
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            if directory.name.startswith(".") or not (directory / MANIFEST).is_file():
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append(_read_entry(directory))
        return found

    def verify(self) -> list[tuple[CacheEntry, str | None]]:
        """Every entry with what is wrong with it (None: its wheel matches its manifest). Changes nothing."""
        return [(entry, self._problem(entry.directory, entry.key)) for entry in self.entries()]

    # -- writing --------------------------------------------------------------------------------------

    def incoming(self, filename: str) -> Path:
        """A fresh private path inside the cache (same filesystem) for a wheel on its way in."""
        if "/" in filename or filename.startswith("."):
            raise ValueError(f"not a file name: {filename!r}")
        folder = _private_dir(self.root / _INCOMING) / secrets.token_hex(8)
        folder.mkdir(mode=0o700)
        return folder / filename

    def store(self, key: Mapping[str, str], wheel: Path, *, built_on: str, build_seconds: float | None,
              source: str = "build") -> CacheEntry:
        """Move wheel (from `incoming()`) into the key's entry, with its manifest; an older entry for the
        same key is replaced as a whole (rename), so a reader sees the old entry or the new one."""
        names = wheel_name_version(wheel.name)
        if names is None:
            raise ValueError(f"{wheel.name}: not a wheel file name")
        if (names[0], names[1]) != (canonical_name(key.get("name", "")), key.get("version")):
            raise ValueError(f"{wheel.name} is not {key.get('name')} {key.get('version')}")
        _private_dir(self.root)
        staging = _private_dir(self.root / _INCOMING) / f"entry-{secrets.token_hex(8)}"
        staging.mkdir(mode=0o700)
        target = staging / wheel.name
        os.replace(wheel, target)
        os.chmod(target, 0o600)
        entry = CacheEntry(self.root / self.entry_name(key), dict(key), wheel.name, file_sha256(target),
                           target.stat().st_size, built_on,
                           time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), build_seconds, source)
        manifest = staging / MANIFEST
        fd = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(entry.to_dict(), handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        old = None
        if entry.directory.exists():
            old = self.root / _INCOMING / f"old-{secrets.token_hex(8)}"
            os.replace(entry.directory, old)
        os.replace(staging, entry.directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):
            wheel.parent.rmdir()  # the incoming() folder, now empty
        return entry

    def purge(self, *, names: Sequence[str] = (), everything: bool = False) -> list[CacheEntry]:
        """Remove the entries of these distributions (any spelling), or every entry; returns them."""
        wanted = {canonical_name(name) for name in names}
        removed = []
        for entry in self.entries():
            if everything or canonical_name(entry.key.get("name", "")) in wanted:
                shutil.rmtree(entry.directory, ignore_errors=True)
                removed.append(entry)
        if everything:
            shutil.rmtree(self.root / _INCOMING, ignore_errors=True)
        return removed


def default_cache_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "wheels"
