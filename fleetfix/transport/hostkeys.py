"""known_hosts checking the way OpenSSH does it, with the policy fleetfix needs.

Why not paramiko's `HostKeys`/`SSHClient` policies: `HostKeys.load` raises on one malformed line, does not
know `@revoked`/`@cert-authority` markers or `!negated`/wildcard patterns, and `AutoAddPolicy` would accept
a changed key. This module reads the file line by line, skips what it cannot use, and lets the caller check
the server's key *before* authenticating (so no credential is ever offered to an impostor).

Policy (like OpenSSH `StrictHostKeyChecking=yes`, or `accept-new` when asked):
- key listed for the host → trusted;
- key listed as `@revoked` → refused as changed (never trusted);
- host listed, but only with other keys → `ChangedHostKeyError`, never accepted, even with accept_new;
- host not listed → `UnknownHostKeyError`, or recorded and trusted when accept_new.
"""

from __future__ import annotations

import fcntl
import functools
import hmac
import os
import re
import threading
from base64 import b64decode, b64encode
from binascii import Error as Base64Error
from dataclasses import dataclass, field
from pathlib import Path

from fleetfix.errors import ChangedHostKeyError, HostKeyError, UnknownHostKeyError
from fleetfix.transport._paramiko import PKey, SSHException, UnknownKeyType

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# Host-key algorithms to ask the server for, per known_hosts key type (paramiko 5 has no SHA-1 ssh-rsa).
_ALGORITHMS_FOR_KEY_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}

_append_lock = threading.Lock()  # concurrent first connects to several nodes append to one file


def known_hosts_name(host: str, port: int) -> str:
    """The name OpenSSH looks up and writes: `host` on port 22, else `[host]:port`."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: PKey) -> str:
    """OpenSSH's fingerprint format: `SHA256:` + unpadded base64 of the key blob's SHA-256."""
    return str(key.fingerprint)


def describe(key: PKey) -> str:
    return f"{key.get_name()} {fingerprint(key)}"


@dataclass(frozen=True)
class KnownHostEntry:
    patterns: tuple[str, ...]
    key_type: str
    key_blob: bytes
    marker: str | None  # None, "@revoked" or "@cert-authority" (CA lines are not supported: never trusted)

    def matches(self, name: str) -> bool:
        """OpenSSH host-pattern matching: hashed names, `*`/`?` wildcards, `!` negation wins."""
        matched = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            pattern = pattern[1:] if negated else pattern
            if pattern.startswith("|1|"):
                hit = _hashed_name_matches(name, pattern)
            else:
                hit = _pattern_regex(pattern).fullmatch(name) is not None
            if hit and negated:
                return False
            matched = matched or hit
        return matched


def parse_line(line: str) -> KnownHostEntry | None:
    """One known_hosts line, or None for blanks, comments and lines that cannot be used."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = None
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
    if len(fields) < 3:
        return None
    try:
        blob = b64decode(fields[2], validate=True)
    except (Base64Error, ValueError):
        return None
    return KnownHostEntry(tuple(fields[0].split(",")), fields[1], blob, marker)


def load_known_hosts(path: Path) -> list[KnownHostEntry]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as error:  # a directory, no permission: our file's problem, not the network's
        raise HostKeyError(f"cannot read known_hosts {path}: {error.strerror or error}") from None
    return [entry for entry in map(parse_line, text.splitlines()) if entry is not None]


@dataclass
class _Index:
    """A known_hosts file's entries, found by name without reading every line for every name.

    Why: a fleet looks up each of its nodes (twice per connection), and the file usually lists every node:
    parsing the whole file on each lookup made N nodes cost O(N^2), seconds of CPU at a thousand nodes
    and more with hashed names (benchmarks/node_costs.py; docs/performance.md). Entries whose patterns are
    all plain names are found in a dict. A hashed name can only be found by hashing the name with each
    hashed entry's salt, as OpenSSH does, so those stay one HMAC per entry (in one C call, the salt decoded
    once); wildcard and negated patterns are matched one by one. Each name's result is kept.
    """

    by_name: dict[str, list[tuple[int, KnownHostEntry]]] = field(default_factory=dict)
    hashed: list[tuple[int, KnownHostEntry, bytes, bytes]] = field(default_factory=list)  # salt, digest
    matched_one_by_one: list[tuple[int, KnownHostEntry]] = field(default_factory=list)
    found: dict[str, list[KnownHostEntry]] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: list[KnownHostEntry]) -> _Index:
        index = cls()
        for position, entry in enumerate(entries):
            if all(_is_plain_name(pattern) for pattern in entry.patterns):
                for name in dict.fromkeys(pattern.lower() for pattern in entry.patterns):
                    index.by_name.setdefault(name, []).append((position, entry))
            elif len(entry.patterns) == 1 and entry.patterns[0].startswith("|1|"):  # ssh-keygen -H's lines
                parts = _hashed_pattern(entry.patterns[0])
                if parts is not None:
                    index.hashed.append((position, entry, *parts))
            else:
                index.matched_one_by_one.append((position, entry))
        return index

    def entries_for(self, name: str) -> list[KnownHostEntry]:
        found = self.found.get(name)
        if found is None:
            hits = list(self.by_name.get(name.lower(), ()))
            encoded = name.encode()
            hits += [(position, entry) for position, entry, salt, digest in self.hashed
                     if hmac.digest(salt, encoded, "sha1") == digest]
            hits += [(position, entry) for position, entry in self.matched_one_by_one if entry.matches(name)]
            found = self.found[name] = [entry for _, entry in sorted(hits, key=lambda hit: hit[0])]
        return found


# Parsed files, shared by every connection of the process: path -> (its stat stamp, its index). A file is
# parsed again when its stamp changes (accept-new appended to it, someone edited it), the way Python's
# import system and linecache notice a changed source file.
_indexes: dict[Path, tuple[tuple[int, int, int, int], _Index]] = {}
_indexes_lock = threading.Lock()


def _index_of(path: Path) -> _Index:
    try:
        info = path.stat()
    except FileNotFoundError:
        return _Index()
    except OSError as error:
        raise HostKeyError(f"cannot read known_hosts {path}: {error.strerror or error}") from None
    stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    with _indexes_lock:
        cached = _indexes.get(path)
        if cached is None or cached[0] != stamp:
            cached = _indexes[path] = (stamp, _Index.of(load_known_hosts(path)))
        return cached[1]


class KnownHosts:
    """One known_hosts file, parsed again only when it changed (it may have grown by accept-new since)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(os.path.expanduser(path or DEFAULT_KNOWN_HOSTS))

    def entries_for(self, host: str, port: int) -> list[KnownHostEntry]:
        return _index_of(self.path).entries_for(known_hosts_name(host, port))

    def preferred_algorithms(self, host: str, port: int, offered: tuple[str, ...]) -> list[str]:
        """Put the key types we already know for this host first, as OpenSSH does, so that a host known by
        its RSA key is not reported as changed just because it also has an ed25519 key."""
        known: list[str] = []
        for entry in self.entries_for(host, port):
            if entry.marker is None:
                known.extend(_ALGORITHMS_FOR_KEY_TYPE.get(entry.key_type, (entry.key_type,)))
        first = [alg for alg in dict.fromkeys(known) if alg in offered]
        return first + [alg for alg in offered if alg not in first]

    def verify(self, host: str, port: int, key: PKey, *, accept_new: bool) -> None:
        """Return if key is trusted for host:port (recording it first when new and accept_new); else raise."""
        name = known_hosts_name(host, port)
        blob = key.asbytes()
        entries = self.entries_for(host, port)
        if any(e.marker == "@revoked" and e.key_blob == blob for e in entries):
            raise ChangedHostKeyError(
                f"host key for {name} ({describe(key)}) is marked @revoked in {self.path}; refusing"
            )
        plain = [e for e in entries if e.marker is None]
        if any(e.key_blob == blob for e in plain):
            return
        if plain:
            listed = ", ".join(sorted({_describe_entry(e) for e in plain}))
            raise ChangedHostKeyError(
                f"REMOTE HOST IDENTIFICATION HAS CHANGED for {name}: it offered {describe(key)}, but "
                f"{self.path} lists {listed}; possible man-in-the-middle, refusing (never accepted "
                f"automatically; if the change is expected, remove the old entry: "
                f"ssh-keygen -R '{name}' -f {self.path})"
            )
        if not accept_new:
            port_flag = "" if port == 22 else f"-p {port} "
            raise UnknownHostKeyError(
                f"unknown host key for {name}: {describe(key)}; to trust it, verify that fingerprint out "
                f"of band, then rerun with --accept-new or run: ssh-keyscan {port_flag}{host} >> {self.path}"
            )
        self.record(name, key)

    def record(self, name: str, key: PKey) -> None:
        """Append `name keytype base64` like OpenSSH accept-new (file 0600, directory 0700 if created)."""
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        with _append_lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as stream:
                fcntl.flock(stream, fcntl.LOCK_EX)  # other fleetfix processes may append at the same time
                if stream.tell() > 0 and not _ends_with_newline(self.path):
                    line = "\n" + line
                stream.write(line)


def _is_plain_name(pattern: str) -> bool:
    return not pattern.startswith(("!", "|")) and "*" not in pattern and "?" not in pattern


def _hashed_name_matches(name: str, pattern: str) -> bool:
    """Whether `|1|salt|hash` is name hashed (OpenSSH's HashKnownHosts: HMAC-SHA1 of the name keyed with
    the salt, both base64): the same test as paramiko's `HostKeys.hash_host(name, pattern) == pattern`."""
    parts = _hashed_pattern(pattern)
    return parts is not None and hmac.digest(parts[0], name.encode(), "sha1") == parts[1]


def _hashed_pattern(pattern: str) -> tuple[bytes, bytes] | None:
    """(salt, digest) of `|1|salt|hash`, or None when no name can match it: hashing writes each as the
    canonical base64 of 20 bytes, and any other text never equals what it writes."""
    fields = pattern.split("|")
    if len(fields) != 4:
        return None
    try:
        salt, digest = b64decode(fields[2], validate=True), b64decode(fields[3], validate=True)
    except (Base64Error, ValueError):
        return None
    canonical = b64encode(salt).decode() == fields[2] and b64encode(digest).decode() == fields[3]
    return (salt, digest) if canonical and len(salt) == len(digest) == 20 else None


@functools.lru_cache(maxsize=1024)
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """OpenSSH patterns know only `*` and `?`; `[` is literal (as in `[host]:port`), case is ignored."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _describe_entry(entry: KnownHostEntry) -> str:
    try:
        return describe(PKey.from_type_string(entry.key_type, entry.key_blob))
    except (SSHException, UnknownKeyType, ValueError, TypeError):  # a type paramiko cannot parse
        return entry.key_type


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as stream:
        stream.seek(-1, os.SEEK_END)
        return stream.read(1) == b"\n"
