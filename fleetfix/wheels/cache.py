"""The controller's wheel cache: one directory per compatibility key and builder, each a pip wheelhouse.

    <root>/                                     0700 (default <state dir>/wheels)
      fleetfix-tiny-ext-0.1.0-3f2a9c1e0b7d4a55/ one key and builder: pip install --no-index --find-links <dir>
        fleetfix_tiny_ext-0.1.0-cp311-cp311-linux_x86_64.whl    0600
        manifest.json                           0600: key, key digest, builder, wheel, sha256, size,
                                                built_on, built_at (UTC), build_seconds, source,
                                                build_command, sdist, sdist_sha256
      .locks/<sha256 of key and scope>.lock     flock: one build at a time per key and set of trusted builders
      .incoming/                                pulls land here first (same filesystem: rename into place)

The key is what decides whether a compiled extension wheel works on a target (docs/extensions.md): the
distribution's name and version plus the fields the playbook renders (Python tag, torch version and its
CUDA, the C++ ABI, the CUDA toolkit used, the arch list, the machine, libc). Every field of it is what a
target reported about itself, so the key says where a wheel *fits*, never whom it may be *given to*: that
is the builder's part of an entry (docs/security.md, the wheel cache). An entry is found only by its key
and its builder together, and the caller asks only for the builders its target trusts (by default: itself).
Every fact the manifest records about provenance (builder, source, build command, sdist sha256) is the
controller's own; nothing a builder printed is in it.

A lookup matches the whole key exactly, never a part of it, and re-hashes the wheel: an entry whose sha256
differs from its manifest is refused and removed (it is never handed out), so the caller builds again. A
wheel is stored only when it is what a compiled key promises (`compiled_wheel_problem`): its own dist-info
names the key's distribution and version, its tags are platform-specific, and it holds an ELF shared object
for the key's machine; a pure-Python wheel is refused. Reading a wheel is bounded: the dist-info files are
size-checked before they are read and read with a cap, and members are streamed.
Directories named as wheelhouses (a CI's output in the same layout, copied or mounted, that the operator
names on the command line) are looked up after the cache, read-only, whoever built their entries: a
corrupt entry there is refused and left alone.

Names that reach a path (the distribution's, the version) are checked first (PEP 508 / PEP 440), and every
entry path is resolved and must stay directly under its root. No I/O outside the root and the
wheelhouses; nothing here talks to a target.
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
from typing import IO, Any

from fleetfix.errors import ConfigError
from fleetfix.paths import private_dir
from fleetfix.wheels.archive import members_problem

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2  # 1: before builders were recorded; such entries are read only in wheelhouses
_LOCKS, _INCOMING = ".locks", ".incoming"
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl, name and version without dashes.
_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[^-]*)?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")
# PEP 508 "Names" (https://peps.python.org/pep-0508/#names): ASCII letters and digits, with '.', '-', '_'
# inside only.
_PEP508_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE)
# PEP 440 appendix B's regex (https://peps.python.org/pep-0440/#appendix-b-parsing-version-strings-with-
# regular-expressions), without the '-N' post-release spelling: a wheel file name cannot carry '-'
# (PEP 427), so such a version could never name its wheel.
_PEP440_VERSION = re.compile(r"""
    v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[_.]?[0-9]*)?
    (?:[_.]?(?:post|rev|r)[_.]?[0-9]*)?
    (?:[_.]?dev[_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[_.][a-z0-9]+)*)?""", re.IGNORECASE | re.VERBOSE)
_MAX_NAME = 200  # longer names and versions are refused: they end up in a directory name

# The builder of upstream's release wheels: the controller downloaded them itself (wheels/release.py).
UPSTREAM = "upstream"
_TARGET = "target:"  # a builder that is an inventory target: "target:<its name>"

# What reading a wheel may cost, whatever its zip headers claim.
# The zip directory is judged by wheelarchive's limits (members, sizes declared); METADATA and WHEEL, read
# into memory, by a tighter one.
MAX_DIST_INFO_FILE = 1024 * 1024  # METADATA, WHEEL: real ones are a few KiB
_CHUNK = 1024 * 1024
# ELF: e_ident starts with "\x7fELF", e_ident[EI_DATA] (offset 5) is 1 for little- and 2 for big-endian,
# and e_machine is the 16-bit field at offset 18 (glibc's elf.h: ELFMAG, EI_DATA, Elf64_Ehdr).
_ELF_MAGIC = b"\x7fELF"
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183}  # elf.h: EM_X86_64 62, EM_AARCH64 183


def canonical_name(name: str) -> str:
    """PEP 503: case and runs of -_. do not matter (causal_conv1d, Causal-Conv1d: causal-conv1d)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_problem(name: str) -> str | None:
    """Why name is not a distribution name (PEP 508), or None. A name a target reported becomes part of a
    path on the controller: '/tmp/x' or '../x' must never get that far."""
    if len(name) > _MAX_NAME or not _PEP508_NAME.fullmatch(name):
        return f"{name[:80]!r} is not a distribution name (PEP 508: letters, digits, '.', '-', '_')"
    return None


def version_problem(version: str) -> str | None:
    """Why version is not a PEP 440 version a wheel file name can carry, or None."""
    if len(version) > _MAX_NAME or not _PEP440_VERSION.fullmatch(version):
        return f"{version[:80]!r} is not a version (PEP 440)"
    return None


def key_digest(key: Mapping[str, str]) -> str:
    """sha256 of the key as canonical JSON: the same key always gives the same digest."""
    text = json.dumps(dict(key), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def target_builder(name: str) -> str:
    """The builder id of a wheel built on the inventory target called name."""
    return _TARGET + name


def builder_label(builder: str) -> str:
    """What the recap and `wheels list` call a builder: the target's name, or 'upstream'."""
    return builder.removeprefix(_TARGET)


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
    read = _read_wheel(path, name=name, version=version)
    if isinstance(read, str):
        return read
    if tag not in read.tags:
        return f"its tags are {', '.join(sorted(read.tags)) or 'none'}, not {tag}"
    return None


def compiled_wheel_problem(path: Path, key: Mapping[str, str]) -> str | None:
    """Why the wheel at path is not what a compiled extension's key promises, or None: its file name and
    its own dist-info name the key's distribution and version, WHEEL says it is not pure (Root-Is-Purelib:
    false) and carries the file name's tag, that tag is platform-specific (not `any`), and it holds at least
    one ELF shared object, for the key's machine where the key names one. A pure-Python wheel that calls
    itself mamba_ssm is not a compiled extension, whatever its modules are called."""
    found = _WHEEL.match(path.name)
    if found is None:
        return f"{path.name}: not a wheel file name"
    names = (canonical_name(found["name"]), found["version"])
    if names != (canonical_name(key.get("name", "")), key.get("version", "")):
        return f"{path.name} is not {key.get('name')} {key.get('version')}"
    tag = f"{found['python']}-{found['abi']}-{found['platform']}"
    if found["platform"] == "any" or found["abi"] == "none":
        return f"{path.name} is tagged {tag}: a pure-Python wheel, not a compiled extension"
    # PEP 425: a tag part may be a '.'-separated set; the wheel must be for the key's Python and machine.
    python_tag, machine = key.get("python_tag", ""), key.get("machine", "")
    if python_tag and python_tag not in found["python"].split("."):
        return f"{path.name} is for Python {found['python']}, not the key's {python_tag}"
    if machine and not any(platform.endswith(f"_{machine}") for platform in found["platform"].split(".")):
        return f"{path.name} is for platform {found['platform']}, not the key's machine {machine}"
    read = _read_wheel(path, name=names[0], version=names[1], machine=key.get("machine", ""))
    if isinstance(read, str):
        return read
    if read.purelib:
        return "its WHEEL says Root-Is-Purelib: true: a pure-Python wheel, not a compiled extension"
    if tag not in read.tags:
        return f"its WHEEL tags are {', '.join(sorted(read.tags)) or 'none'}, not its file name's {tag}"
    return read.shared_object_problem


@dataclass
class _WheelInfo:
    tags: set[str]
    purelib: bool
    shared_object_problem: str | None


def _read_wheel(path: Path, *, name: str, version: str, machine: str = "") -> _WheelInfo | str:
    """The wheel's dist-info facts, or why it cannot be read as name at version. Bounded whatever the zip
    claims: the member count and the declared sizes are checked first, the dist-info files are read only
    when small and with a cap, and the CRC check streams."""
    try:
        with zipfile.ZipFile(path) as wheel:
            members = wheel.infolist()
            too_much = members_problem(members)
            if too_much is not None:
                return too_much
            tops = [member.filename.split("/") for member in members if member.filename.count("/") == 1]
            infos = {parts[0] for parts in tops if parts[0].endswith(".dist-info")}
            if len(infos) != 1:
                return f"{len(infos)} .dist-info directories, not one"
            (info,) = infos
            metadata = _headers(_read_small(wheel, f"{info}/METADATA"))
            wheel_file = _header_lines(_read_small(wheel, f"{info}/WHEEL"))
            damaged = _first_bad_crc(wheel, members)
            if damaged is not None:
                return f"not a readable wheel (bad CRC-32 for {damaged})"
            shared = _shared_object_problem(wheel, members, machine)
    except _TooLarge as too_large:
        return str(too_large)
    except (OSError, KeyError, zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError,
            NotImplementedError) as error:
        return f"not a readable wheel ({error})"
    found = (canonical_name(metadata.get("name", "")), metadata.get("version", ""))
    if found != (name, version):
        return f"its metadata says {found[0]} {found[1]}, not {name} {version}"
    tags = {value for key, value in wheel_file if key == "tag"}
    purelib = dict(reversed(wheel_file)).get("root-is-purelib", "").lower() != "false"
    return _WheelInfo(tags, purelib, shared)


class _TooLarge(Exception):
    pass


def _read_small(wheel: zipfile.ZipFile, member: str) -> bytes:
    """member's bytes, refused before reading when its header says it is larger than a dist-info file can
    be, and read with a cap anyway (the header's size is the zip's word)."""
    info = wheel.getinfo(member)
    if info.file_size > MAX_DIST_INFO_FILE:
        raise _TooLarge(f"{member} is {info.file_size} bytes, more than {MAX_DIST_INFO_FILE}")
    with wheel.open(info) as handle:
        data = handle.read(MAX_DIST_INFO_FILE + 1)
    if len(data) > MAX_DIST_INFO_FILE:
        raise _TooLarge(f"{member} is more than {MAX_DIST_INFO_FILE} bytes")
    return data


def _first_bad_crc(wheel: zipfile.ZipFile, members: Sequence[zipfile.ZipInfo]) -> str | None:
    """The first member whose bytes do not match its CRC-32, streamed chunk by chunk (ZipFile.testzip
    does the same, and is replaced here only to share one catch of what a damaged stream raises)."""
    for member in members:
        try:
            with wheel.open(member) as handle:
                while handle.read(_CHUNK):
                    pass
        except zipfile.BadZipFile:
            return member.filename
    return None


def _shared_object_problem(wheel: zipfile.ZipFile, members: Sequence[zipfile.ZipInfo],
                           machine: str) -> str | None:
    """None when some `.so` member is an ELF object (for machine, when the key names a known one)."""
    wanted = _ELF_MACHINES.get(machine)
    seen = []
    for member in members:
        if not member.filename.endswith(".so") and ".so." not in member.filename.rpartition("/")[2]:
            continue
        with wheel.open(member) as handle:
            header = _read_at_most(handle, 20)
        if len(header) < 20 or not header.startswith(_ELF_MAGIC) or header[5] not in (1, 2):
            seen.append(f"{member.filename} (not ELF)")
            continue
        found = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
        if wanted is None or found == wanted:
            return None
        seen.append(f"{member.filename} (ELF machine {found}, not {machine}'s {wanted})")
    if not seen:
        return "it holds no shared object (.so): a pure-Python wheel, not a compiled extension"
    return "no shared object for this key: " + ", ".join(seen[:3])


def _read_at_most(handle: IO[bytes], size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = handle.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _header_lines(data: bytes) -> list[tuple[str, str]]:
    """RFC 822-style "Field: value" lines up to the first blank line (the body), fields lower-cased."""
    lines = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            break
        name, colon, value = line.partition(":")
        if colon:
            lines.append((name.strip().lower(), value.strip()))
    return lines


def _headers(data: bytes) -> dict[str, str]:
    return dict(reversed(_header_lines(data)))  # the first occurrence wins


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class Provenance:
    """What the controller itself knows about how a wheel came to be, recorded in its manifest. Nothing
    here is read from what a builder printed."""

    builder: str  # target_builder(name) or UPSTREAM
    source: str = "build"  # "build", or the URL the controller downloaded the wheel from
    build_seconds: float | None = None
    build_command: str | None = None  # the build script the controller sent, as rendered
    sdist_sha256: str | None = None  # only when the controller itself had the source archive
    sdist: str | None = None  # where the controller took that archive from (a path or URL)


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    key: dict[str, str]
    wheel: str  # file name inside directory
    sha256: str
    size: int
    built_on: str  # the builder's label: the target's inventory name, or "upstream"
    built_at: str
    build_seconds: float | None
    source: str  # "build", or the URL a downloaded wheel came from
    builder: str = ""  # target_builder(name) or UPSTREAM; "" in a version 1 manifest (a wheelhouse's)
    build_command: str | None = None
    sdist_sha256: str | None = None
    sdist: str | None = None

    @property
    def path(self) -> Path:
        return self.directory / self.wheel

    @property
    def digest(self) -> str:
        return key_digest(self.key)

    def to_dict(self) -> dict[str, Any]:
        return {"fleetfix_wheel_cache": MANIFEST_VERSION, "key": self.key, "key_digest": self.digest,
                "builder": self.builder, "wheel": self.wheel, "sha256": self.sha256, "size": self.size,
                "built_on": self.built_on, "built_at": self.built_at, "build_seconds": self.build_seconds,
                "source": self.source, "build_command": self.build_command,
                "sdist": self.sdist, "sdist_sha256": self.sdist_sha256}


@dataclass
class Lookup:
    """What a lookup found: an entry whose wheel was re-hashed and matched, and the entries it refused."""

    entry: CacheEntry | None = None
    refused: list[str] = field(default_factory=list)  # one line each: which entry, and why


def _read_entry(directory: Path, *, legacy: bool = False) -> CacheEntry:
    """The entry in directory; legacy: a version 1 manifest (no builder) is read too."""
    data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    versions = (1, MANIFEST_VERSION) if legacy else (MANIFEST_VERSION,)
    if not isinstance(data, dict) or data.get("fleetfix_wheel_cache") not in versions:
        raise ValueError("not a fleetfix wheel-cache manifest" if not isinstance(data, dict) or
                         data.get("fleetfix_wheel_cache") != 1 else
                         "written before fleetfix recorded builders: never used (fleetfix wheels purge)")
    key = data["key"]
    if not isinstance(key, dict) or not all(isinstance(v, str) for v in key.values()):
        raise ValueError("manifest key is not a mapping of strings")
    wheel = str(data["wheel"])
    if "/" in wheel or wheel_name_version(wheel) is None:
        raise ValueError(f"manifest names no wheel file: {wheel!r}")
    seconds = data.get("build_seconds")
    optional = {name: str(data[name]) if isinstance(data.get(name), str) else None
                for name in ("build_command", "sdist_sha256", "sdist")}
    return CacheEntry(directory, {str(k): v for k, v in key.items()}, wheel, str(data["sha256"]),
                      int(data["size"]), str(data.get("built_on", "")), str(data.get("built_at", "")),
                      float(seconds) if isinstance(seconds, int | float) else None,
                      str(data.get("source", "build")), str(data.get("builder", "")), **optional)


def _private_dir(path: Path) -> Path:
    private_dir(path)  # every parent it creates 0700 too, whatever the umask
    os.chmod(path, 0o700)  # also when it existed with a wider mode
    return path


def _under(base: Path, name: str) -> Path:
    """base/name, refused unless it resolves to a directory directly under base (names are checked before
    they get here; this holds whatever a caller passes)."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"not an entry name: {name!r}")
    path = base / name
    if path.resolve().parent != base.resolve():
        raise ValueError(f"{name!r} resolves outside {base}")
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
    def entry_name(key: Mapping[str, str], builder: str) -> str:
        """<name>-<version>-<16 hex of the sha256 of key digest and builder>: readable, and unique per key
        and builder. ValueError when the key's name or version is not one (PEP 508, PEP 440)."""
        name, version = key.get("name", ""), key.get("version", "")
        problem = name_problem(name) or version_problem(version)
        if problem is not None:
            raise ValueError(problem)
        scope = hashlib.sha256(f"{key_digest(key)}\n{builder}".encode()).hexdigest()
        return f"{canonical_name(name)}-{version}-{scope[:16]}"

    def entry_dir(self, key: Mapping[str, str], builder: str) -> Path:
        return _under(self.root, self.entry_name(key, builder))

    # -- concurrency ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: Mapping[str, str], scope: str) -> Iterator[None]:
        """Hold the key within scope (a set of builders, or UPSTREAM): its first holder builds; the others
        wait here and then find its entry. An flock, so two threads (two targets) and two fleetfix processes
        sharing the cache exclude each other. Callers take at most one scope's lock of a key and then
        perhaps UPSTREAM's, never the other way round, so waits never form a cycle."""
        digest = hashlib.sha256(f"{key_digest(key)}\n{scope}".encode()).hexdigest()
        path = _private_dir(self.root / _LOCKS) / f"{digest}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    # -- reading --------------------------------------------------------------------------------------

    def lookup(self, key: Mapping[str, str], builder: str) -> Lookup:
        """The cache's entry for exactly this key built by builder, its wheel's sha256 re-checked. An entry
        that fails the check is removed."""
        found = Lookup()
        directory = self.entry_dir(key, builder)
        if not (directory / MANIFEST).is_file():
            return found
        problem = self._problem(directory, key, builder=builder)
        if problem is None:
            found.entry = _read_entry(directory)
            return found
        found.refused.append(f"{directory}: {problem}; removed")
        shutil.rmtree(directory, ignore_errors=True)
        return found

    def lookup_wheelhouses(self, key: Mapping[str, str]) -> Lookup:
        """The first wheelhouse entry for exactly this key, whoever built it (the operator named these
        directories), its sha256 re-checked; a corrupt one is skipped, never removed."""
        found = Lookup()
        prefix = self.entry_name(key, "")[:-16]  # <name>-<version>-
        for house in self.wheelhouses:
            for directory in sorted(house.glob(f"{glob_escape(prefix)}*")):
                if not (directory / MANIFEST).is_file() or directory.resolve().parent != house.resolve():
                    continue
                problem = self._problem(directory, key, builder=None)
                if problem is None:
                    found.entry = _read_entry(directory, legacy=True)
                    return found
                if problem != _OTHER_KEY:
                    found.refused.append(f"{directory}: {problem}; skipped")
        return found

    def _problem(self, directory: Path, key: Mapping[str, str], *, builder: str | None) -> str | None:
        """Why the entry in directory must not be used for key (and builder, unless None: a wheelhouse's),
        or None."""
        try:
            entry = _read_entry(directory, legacy=builder is None)
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"unreadable manifest ({error})"
        if entry.key != dict(key):
            return _OTHER_KEY
        if builder is not None and entry.builder != builder:
            return f"its manifest names builder {entry.builder!r}, not {builder!r}"
        try:
            size, digest = entry.path.stat().st_size, file_sha256(entry.path)
        except OSError as error:
            return f"wheel unreadable ({error.strerror or error})"
        if digest != entry.sha256 or size != entry.size:
            return (f"checksum mismatch: manifest sha256 {entry.sha256} ({entry.size} bytes), "
                    f"file {digest} ({size} bytes)")
        return None

    def entries(self) -> list[CacheEntry]:
        """Every readable entry of the cache (not the wheelhouses), by directory name; version 1 entries
        are listed too (they are never used: purge them)."""
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            if directory.name.startswith(".") or not (directory / MANIFEST).is_file():
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append(_read_entry(directory, legacy=True))
        return found

    def verify(self) -> list[tuple[CacheEntry, str | None]]:
        """Every entry with what is wrong with it (None: its wheel matches its manifest). Changes nothing."""
        return [(entry, self._problem(entry.directory, entry.key, builder=entry.builder or "?"))
                for entry in self.entries()]

    # -- writing --------------------------------------------------------------------------------------

    def incoming(self, filename: str) -> Path:
        """A fresh private path inside the cache (same filesystem) for a wheel on its way in."""
        if "/" in filename or filename.startswith(".") or "\0" in filename:
            raise ValueError(f"not a file name: {filename!r}")
        folder = _private_dir(self.root / _INCOMING) / secrets.token_hex(8)
        folder.mkdir(mode=0o700)
        return folder / filename

    def store(self, key: Mapping[str, str], wheel: Path, provenance: Provenance) -> CacheEntry:
        """Move wheel (from `incoming()`) into the entry of key and provenance's builder, with its manifest;
        an older entry for the same key and builder is replaced as a whole (rename), so a reader sees the
        old entry or the new one. WheelRefused, and the wheel left where it is, when it is not the compiled
        extension the key promises (`compiled_wheel_problem`)."""
        problem = compiled_wheel_problem(wheel, key)
        if problem is not None:
            raise WheelRefused(problem)
        directory = self.entry_dir(key, provenance.builder)
        _private_dir(self.root)
        staging = _private_dir(self.root / _INCOMING) / f"entry-{secrets.token_hex(8)}"
        staging.mkdir(mode=0o700)
        target = staging / wheel.name
        os.replace(wheel, target)
        os.chmod(target, 0o600)
        built_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entry = CacheEntry(directory, dict(key), wheel.name, file_sha256(target), target.stat().st_size,
                           builder_label(provenance.builder), built_at,
                           provenance.build_seconds, provenance.source, provenance.builder,
                           provenance.build_command, provenance.sdist_sha256, provenance.sdist)
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


class WheelRefused(ValueError):
    """A wheel the cache will not keep; its message says why."""


_OTHER_KEY = "its manifest is for another key"


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def default_cache_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "wheels"
