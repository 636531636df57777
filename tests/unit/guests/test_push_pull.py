"""push/pull without a lab: the node guest over LocalTransport (the `--local` path, real files and the real
guest-side scripts), corruption in transit, the size cap, and the LXC staging clean-up against a fake node."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import BinaryIO

import pytest

from fleetfix.errors import ConnectionLostError, TransferError
from fleetfix.guests.lxc import LxcGuest
from fleetfix.guests.node import NodeGuest
from fleetfix.guests.transfer import NODE_STAGING_DIR, guest_digest
from fleetfix.target import GuestRef, NodeRef, Target
from fleetfix.transport.base import CommandResult, Transferred
from fleetfix.transport.fake import FakeCall, FakeTransport
from fleetfix.transport.local import LocalTransport

LOCAL = Target("local", NodeRef("local", None))


class Corrupting(LocalTransport):
    """Flips one byte of what it stores (upload) or delivers (download), after the hash was taken."""

    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        moved = super().upload(source, path, mode=mode, max_bytes=max_bytes)
        with open(path, "r+b") as handle:
            handle.seek(1)
            handle.write(b"X")
        return moved

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        data = bytearray(Path(path).read_bytes())
        data[1:2] = b"X"
        sink.write(data)
        return Transferred(len(data), hashlib.sha256(data).hexdigest())


def listing(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_node_push_and_pull_over_local_files(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"wheel bytes\n" * 1000)
    guest = NodeGuest(LOCAL, LocalTransport())
    dest = tmp_path / "dest.bin"
    pushed = guest.push(source, str(dest), mode=0o640)
    assert dest.read_bytes() == source.read_bytes() and oct(dest.stat().st_mode & 0o777) == "0o640"
    assert pushed.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    found = guest_digest(guest.transport(), str(dest))
    assert found is not None and (found.sha256, found.size, found.mode) == (pushed.sha256, 12000, 0o640)
    back = tmp_path / "back.bin"
    assert guest.pull(str(dest), back).sha256 == pushed.sha256
    assert listing(tmp_path) == ["back.bin", "dest.bin", "src.bin"]


def test_corruption_in_transit_is_refused_and_cleaned_up(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"original content")
    dest = tmp_path / "dest.bin"
    dest.write_bytes(b"old")
    guest = NodeGuest(LOCAL, Corrupting())
    with pytest.raises(TransferError, match="checksum mismatch"):
        guest.push(source, str(dest))
    assert dest.read_bytes() == b"old"  # the destination only ever changes by rename
    with pytest.raises(TransferError, match="checksum mismatch"):
        guest.pull(str(source), tmp_path / "pulled.bin")
    assert listing(tmp_path) == ["dest.bin", "src.bin"]


def test_size_cap_and_exclusive_create(tmp_path: Path) -> None:
    transport = LocalTransport()
    target = tmp_path / "f"
    with pytest.raises(TransferError, match="larger than the limit"):
        transport.upload(io.BytesIO(b"x" * 100), str(target), max_bytes=10)
    assert not target.exists()  # the partial file is removed
    transport.upload(io.BytesIO(b"ok"), str(target), mode=0o600, max_bytes=10)
    with pytest.raises(TransferError, match="cannot create"):
        transport.upload(io.BytesIO(b"again"), str(target), max_bytes=10)
    assert target.read_bytes() == b"ok"


def test_guest_paths_must_be_absolute_files(tmp_path: Path) -> None:
    guest = NodeGuest(LOCAL, LocalTransport())
    source = tmp_path / "src"
    source.write_bytes(b"x")
    for bad in ("relative/path", "/dir/", "/a\nb"):
        with pytest.raises(TransferError, match="absolute file path"):
            guest.push(source, bad)


def _lxc(node: FakeTransport) -> LxcGuest:
    return LxcGuest(Target("pve1/101", NodeRef("pve1", None), GuestRef.lxc(101)), node)


def test_lxc_push_removes_the_staged_file_when_the_link_drops(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"payload")
    node = FakeTransport("pve1").on("pct push", ConnectionLostError("link dropped"))
    with pytest.raises(ConnectionLostError):
        _lxc(node).push(source, "/root/x")
    assert node.files == {}
    assert [call.argv[-2:] for call in node.calls] == [("--perms", "0600")]


def test_lxc_pull_removes_the_staged_file_after_a_failed_pull(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"in the ct").hexdigest()

    def pct_pull(call: FakeCall) -> CommandResult:
        # Real pct creates the destination before opening the source; here the source vanished meanwhile.
        node.files[call.argv[4]] = b""
        return CommandResult(0, "", "failed to open /root/x: No such file or directory\n", 0.0)

    node = (FakeTransport("pve1")
            .on("pct exec 101", stdout=f"file {digest} 9 644\n")
            .on("pct pull 101", pct_pull))
    with pytest.raises(TransferError, match=r"checksum mismatch.*pct pull: failed to open") as error:
        _lxc(node).pull("/root/x", tmp_path / "x")
    assert node.files == {} and listing(tmp_path) == []
    assert NODE_STAGING_DIR in str(node.calls[-1].argv[4]) and os.path.basename(str(error.value))
