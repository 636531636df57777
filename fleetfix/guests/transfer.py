"""Files between this machine and a guest: streamed, size-bounded, sha256-verified on both ends, atomic.

    push (local -> guest)   the bytes are hashed as they are sent, into a temp name; in the guest,
                            `sha256sum` of that temp file must give the same hash, then chmod and an atomic
                            rename onto the destination. A mismatch removes the temp file and raises.
    pull (guest -> local)   `sha256sum` in the guest first; the bytes are hashed as they arrive, into a
                            private temp file beside the local destination; the hashes must agree, then
                            fsync and an atomic rename.

How the bytes reach the guest is the guest kind's business (`NodeGuest`: SFTP on the node's connection;
`LxcGuest`: SFTP to a private staging file on the node, then `pct push`/`pct pull`). What is shared lives
here: the read-only digest of a guest file (also what playbook steps compare for idempotency), the
verify-and-rename script run in the guest, and the local half of a pull.

Every temp file is removed on every exit path we control: the guest-side script removes its temp file on
any failure, node staging files are removed in `finally`, local temp files likewise. Only a link that drops
mid-transfer can leave a `*.fleetfix-*.tmp` beside a destination in the guest (never the destination
itself: it only ever changes by rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fleetfix.errors import TransferError
from fleetfix.transport.base import FileTransport, Transferred, Transport

# Big enough for the largest CUDA extension wheels (flash-attn's are ~0.5 GB), small enough that a wrong
# path (a disk image, a dataset) fails at once instead of filling the controller's disk.
DEFAULT_MAX_BYTES = 4 * 1024**3
DEFAULT_TRANSFER_TIMEOUT = 600.0  # for each guest-side command (digest, verify); not for the stream itself
# Where LXC transfers are staged on the node: /var/tmp, not /tmp (a tmpfs on Debian 13, too small for a
# wheel of hundreds of MB).
NODE_STAGING_DIR = "/var/tmp"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Streams a file into the sink it is given (a node download), returning what crossed the link.
ReceiveFn = Callable[[BinaryIO], Transferred]

# argv: PATH. Prints "absent", or "file SHA256 SIZE MODE". Read-only (check mode runs it).
DIGEST_SCRIPT = r"""f=$1
if [ ! -e "$f" ]; then echo absent; exit 0; fi
if [ ! -f "$f" ]; then echo "$f is not a regular file" >&2; exit 3; fi
h=$(sha256sum < "$f") || exit 4
s=$(wc -c < "$f") || exit 4
m=$(stat -c %a -- "$f" 2>/dev/null || true)
echo "file ${h%% *}" $s "$m"
"""

# argv: TMP DEST SHA256 MODE. Verifies the temp file against the sender's hash, then chmod + rename; on
# any failure the temp file is removed and the reason is the last stderr line.
FINISH_SCRIPT = r"""tmp=$1 dest=$2 want=$3 mode=$4
fail() { rm -f -- "$tmp"; echo "$*" >&2; exit 1; }
[ -f "$tmp" ] || fail "nothing arrived at $tmp"
got=$(sha256sum < "$tmp") || fail "cannot read $tmp"
got=${got%% *}
[ "$got" = "$want" ] || fail "checksum mismatch: sent sha256 $want, received $got"
chmod "$mode" "$tmp" || fail "chmod $mode $tmp failed"
mv -f -- "$tmp" "$dest" || fail "cannot rename $tmp to $dest"
"""


@dataclass(frozen=True)
class GuestFile:
    """A regular file in a guest, as `DIGEST_SCRIPT` saw it."""

    sha256: str
    size: int
    mode: int | None  # permission bits; None when stat could not say


@dataclass(frozen=True)
class TransferResult:
    source: str
    destination: str
    size: int
    sha256: str
    duration: float

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "destination": self.destination, "size": self.size,
                "sha256": self.sha256, "duration": round(self.duration, 3)}


def unique_suffix() -> str:
    return secrets.token_hex(6)


def check_guest_path(path: str) -> str:
    """An absolute file path in a guest: no NUL, no trailing slash (a directory is not a file name)."""
    if not path.startswith("/") or "\0" in path or path.endswith("/") or "\n" in path:
        raise TransferError(f"{path!r}: a guest path must be an absolute file path")
    return path


def node_files(node: Transport) -> FileTransport:
    if not isinstance(node, FileTransport):
        raise TransferError(f"{node.label}: this connection cannot transfer files")
    return node


def guest_digest(transport: Transport, path: str, *, timeout: float = DEFAULT_TRANSFER_TIMEOUT
                 ) -> GuestFile | None:
    """sha256, size and mode of a file in the guest, or None when there is none. Read-only."""
    result = transport.execute(("/bin/sh", "-c", DIGEST_SCRIPT, "sh", check_guest_path(path)),
                               timeout=timeout)
    words = result.stdout.split()
    if result.ok and words == ["absent"]:
        return None
    if result.ok and len(words) in (3, 4) and words[0] == "file" and _SHA256.fullmatch(words[1]) \
            and words[2].isdigit():
        mode = int(words[3], 8) if len(words) == 4 and re.fullmatch(r"[0-7]{1,4}", words[3]) else None
        return GuestFile(words[1], int(words[2]), mode)
    tail = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    if result.exit_code == 127 or "sha256sum" in tail:
        tail += " (the guest needs coreutils' sha256sum)"
    raise TransferError(f"{transport.label}: cannot checksum {path}: {tail}")


def finish_in_guest(transport: Transport, tmp: str, dest: str, sha256: str, mode: int, *,
                    timeout: float = DEFAULT_TRANSFER_TIMEOUT) -> str | None:
    """Verify the temp file in the guest and rename it onto dest; the failure reason, or None."""
    result = transport.execute(("/bin/sh", "-c", FINISH_SCRIPT, "sh", tmp, dest, sha256, format(mode, "o")),
                               timeout=timeout)
    if result.ok:
        return None
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else ("timed out" if result.timed_out else f"exit {result.exit_code}")


@contextlib.contextmanager
def open_local(path: str | Path, max_bytes: int) -> Iterator[BinaryIO]:
    """A local file to send, refused up front when it is over the limit (or not a regular file)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115  # closed below, after the caller streamed it
    except OSError as error:
        raise TransferError(f"{path}: {error.strerror or error}") from None
    with handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TransferError(f"{path}: not a regular file")
        if info.st_size > max_bytes:
            raise TransferError(f"{path}: {info.st_size} bytes, over the limit of {max_bytes}")
        yield handle


def local_digest(path: str | Path) -> str | None:
    """sha256 of a local file, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def receive_local(destination: str | Path, mode: int, expected: GuestFile, receive: ReceiveFn,
                  *, what: str) -> Transferred:
    """The local half of a pull: receive(sink) streams into a private temp file beside destination; its
    hash must match what the guest said, then fsync, chmod and an atomic rename. The temp file is removed
    on any failure."""
    target = Path(destination)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.fleetfix-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as sink:
            got = receive(sink)
            sink.flush()
            os.fsync(sink.fileno())
        if got.sha256 != expected.sha256 or got.size != expected.size:
            raise TransferError(
                f"{what}: checksum mismatch: the guest has sha256 {expected.sha256} ({expected.size} bytes), "
                f"received {got.sha256} ({got.size} bytes)")
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return got

