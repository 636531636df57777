"""The node itself as a target: commands run on its own transport; files go over the node's own file
transport (SFTP on its SSH connection, plain file I/O for this machine); a node cannot be snapshotted."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import ClassVar

from fleetfix.errors import FleetfixError, TransferError
from fleetfix.guests.base import GuestStatus
from fleetfix.guests.transfer import (
    DEFAULT_MAX_BYTES,
    TransferResult,
    check_guest_path,
    finish_in_guest,
    guest_digest,
    node_files,
    open_local,
    receive_local,
    unique_suffix,
)
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult, Transport


class NodeGuest:
    kind: ClassVar[str] = "node"
    tool: ClassVar[str] = "node"
    no_snapshots: ClassVar[str | None] = "a node is not a guest and cannot be snapshotted"
    pve_type: ClassVar[str | None] = None
    shares_node_kernel: ClassVar[bool] = True

    def __init__(self, target: Target, node: Transport) -> None:
        self.target, self.node = target, node

    def transport(self) -> Transport:
        return self.node

    def status(self) -> GuestStatus:
        return "running"  # reachable at all means running; an unreachable node fails before this

    def snapshot(self, name: str, description: str = "") -> CommandResult:
        raise NotImplementedError(self.no_snapshots)

    def list_snapshots(self) -> tuple[CommandResult, list[str]]:
        raise NotImplementedError(self.no_snapshots)

    def delete_snapshot(self, name: str) -> CommandResult:
        raise NotImplementedError(self.no_snapshots)

    def rollback(self, name: str, *, start: bool) -> CommandResult:
        raise NotImplementedError(self.no_snapshots)

    def push(self, local_path: str | Path, remote_path: str, *, mode: int = 0o644,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        """Straight into a temp name beside the destination (same filesystem, so the rename is atomic)."""
        dest = check_guest_path(remote_path)
        files = node_files(self.node)
        tmp = f"{dest}.fleetfix-{unique_suffix()}.tmp"
        started = time.monotonic()
        with open_local(local_path, max_bytes) as source:
            sent = files.upload(source, tmp, mode=0o600, max_bytes=max_bytes)  # removes itself on failure
        try:
            failure = finish_in_guest(self.node, tmp, dest, sent.sha256, mode)
        except FleetfixError:
            with contextlib.suppress(FleetfixError):
                files.remove(tmp)
            raise
        if failure is not None:
            raise TransferError(f"{self.target.name}: push {local_path} -> {dest}: {failure}")
        return TransferResult(str(local_path), dest, sent.size, sent.sha256, time.monotonic() - started)

    def pull(self, remote_path: str, local_path: str | Path, *, mode: int = 0o600,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        source = check_guest_path(remote_path)
        files = node_files(self.node)
        started = time.monotonic()
        found = guest_digest(self.node, source)
        what = f"{self.target.name}: pull {source} -> {local_path}"
        if found is None:
            raise TransferError(f"{what}: no such file")
        if found.size > max_bytes:
            raise TransferError(f"{what}: {found.size} bytes, over the limit of {max_bytes}")
        got = receive_local(local_path, mode, found,
                            lambda sink: files.download(source, sink, max_bytes=max_bytes), what=what)
        return TransferResult(source, str(local_path), got.size, got.sha256, time.monotonic() - started)
