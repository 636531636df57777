"""The guest seam: what fleetfix does with a target, whatever kind of guest it is.

A `Guest` is one target's driver, built over its node's transport (the node's SSH connection, shared by
every guest of that node). It runs commands inside the guest (`transport()`), tells whether the guest
runs (`status()`), takes, lists, deletes and rolls back snapshots, and moves files in and out (`push()`,
`pull()`: streamed, size-bounded, sha256-verified on both ends, see `guests.transfer`). The fleet runner,
the probe, the playbook runner and the snapshot guard only ever talk to this interface: a new guest kind is
one module implementing it plus one line in `fleetfix.guests.GUEST_KINDS`.

Snapshot commands return the node's `CommandResult` as is: a failure (storage without snapshot support, a
name taken) is data for the caller's recap, not an exception; only transport failures raise.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Protocol

from fleetfix.guests.transfer import DEFAULT_MAX_BYTES, TransferResult
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult, Transport

GuestStatus = Literal["running", "stopped", "unknown"]
DEFAULT_GUEST_TIMEOUT = 600.0  # a snapshot or rollback of a big volume can take minutes


class Guest(Protocol):
    kind: ClassVar[str]
    tool: ClassVar[str]  # the node's command that manages this kind ("pct", "qm"), for messages
    # Why this kind cannot be snapshotted (None: it can). Said in the recap when a change is refused.
    no_snapshots: ClassVar[str | None]
    # How Proxmox names this kind: the `type` of /cluster/resources entries and the /nodes/N/<type> index
    # that lists them ("lxc", "qemu"); None for a kind Proxmox does not list (the node itself).
    pve_type: ClassVar[str | None]
    # Whether the guest runs on its node's kernel (so the node's NVIDIA kernel module is the one its
    # driver libraries must match). A VM has its own kernel and, with passthrough, its own driver.
    shares_node_kernel: ClassVar[bool]
    target: Target

    def __init__(self, target: Target, node: Transport) -> None: ...

    def transport(self) -> Transport:
        """Runs commands inside the guest."""
        ...

    def status(self) -> GuestStatus: ...

    def snapshot(self, name: str, description: str = "") -> CommandResult: ...

    def list_snapshots(self) -> tuple[CommandResult, list[str]]:
        """The listing command's result, and the snapshot names in it (empty when it failed)."""
        ...

    def delete_snapshot(self, name: str) -> CommandResult: ...

    def rollback(self, name: str, *, start: bool) -> CommandResult:
        """Back to the snapshot; start=True starts the guest afterwards (a rollback stops it)."""
        ...

    def push(self, local_path: str | Path, remote_path: str, *, mode: int = 0o644,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        """Put a local file at remote_path (absolute, in the guest; its directory must exist), replacing
        it atomically, only after the guest's sha256 of what arrived matched what was sent. Raises
        TransferError (nothing changed at remote_path), GuestError, or TransportError."""
        ...

    def pull(self, remote_path: str, local_path: str | Path, *, mode: int = 0o600,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        """Copy a guest file to local_path (its directory must exist), atomically, only after the local
        sha256 of what arrived matched the guest's. Raises TransferError, GuestError or TransportError."""
        ...


def parse_snapshot_tree(text: str) -> list[str]:
    """Snapshot names from `pct listsnapshot` / `qm listsnapshot` (PVE's tree print, the same for both:
    `` `-> name  time  description``, children indented), without the `current` pseudo entry."""
    names: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "`->" and words[1] != "current":
            names.append(words[1])
    return names


class ProxmoxGuest:
    """What `pct` and `qm` share on the node: status and the snapshot commands, by the guest's integer id.

    pve-container's `pct` and qemu-server's `qm` take the same arguments for these (docs/DOMAIN.md 5.2;
    for `qm`: qemu-server `src/PVE/CLI/qm.pm` and `PVE/API2/Qemu.pm`, docs/findings.md "Proxmox VMs"):
    `TOOL status ID` (`status: running|stopped`; qm prints QMP's run state, so a paused VM is "unknown"
    here), `TOOL snapshot ID NAME [--description D]`, `TOOL listsnapshot ID` (both print with
    pve-guest-common's `print_snapshot_tree`), `TOOL delsnapshot ID NAME`, `TOOL rollback ID NAME
    [--start 1]` (a rollback stops a running guest first; qm has `--start` since qemu-server 7.3).
    """

    kind: ClassVar[str]
    tool: ClassVar[str]  # "pct" | "qm"
    no_snapshots: ClassVar[str | None] = None
    pve_type: ClassVar[str | None]
    shares_node_kernel: ClassVar[bool]

    def __init__(self, target: Target, node: Transport, *, timeout: float = DEFAULT_GUEST_TIMEOUT) -> None:
        guest_id = target.guest.id
        if isinstance(guest_id, bool) or not isinstance(guest_id, int):
            raise TypeError(f"a {self.kind} guest id is an int, not {type(guest_id).__name__}")
        self.target, self.node, self.id, self.timeout = target, node, guest_id, timeout

    def _run(self, command: str, *rest: str) -> CommandResult:
        return self.node.execute([self.tool, command, str(self.id), *rest], timeout=self.timeout)

    def status(self) -> GuestStatus:
        result = self._run("status")
        if not result.ok:
            return "unknown"
        if "status: stopped" in result.stdout:
            return "stopped"
        return "running" if "status: running" in result.stdout else "unknown"

    def snapshot(self, name: str, description: str = "") -> CommandResult:
        return self._run("snapshot", name, *(["--description", description] if description else []))

    def list_snapshots(self) -> tuple[CommandResult, list[str]]:
        result = self._run("listsnapshot")
        return result, parse_snapshot_tree(result.stdout) if result.ok else []

    def delete_snapshot(self, name: str) -> CommandResult:
        return self._run("delsnapshot", name)

    def rollback(self, name: str, *, start: bool) -> CommandResult:
        return self._run("rollback", name, *(["--start", "1"] if start else []))
