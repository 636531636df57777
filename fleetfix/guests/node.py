"""The node itself as a target: commands run on its own transport; a node cannot be snapshotted."""

from __future__ import annotations

from typing import ClassVar

from fleetfix.guests.base import GuestStatus
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
