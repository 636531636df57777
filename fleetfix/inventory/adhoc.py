"""Targets from the command line (`--host` with `--ct`/`--vm`, `--local`), and the name rules they share
with the inventory.

Apart from fleetfix.inventory.load (YAML, the pydantic inventory model, discovery) so that `fleetfix probe
--host H --ct N` can dial the node before any of that is imported: start-up is most of the time to the
first packet for one target (docs/performance.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, Unpack

from fleetfix.errors import ConfigError
from fleetfix.target import NODE, Become, GuestRef, NodeRef, SSHSettings, Target

# Proxmox VE accepts VMIDs 100..999999999 (ids below 100 are reserved).
CTID_MIN, CTID_MAX = 100, 999_999_999
# Hostname-like, and free of the pattern language's `, ! : * ? [ /`, so a name is never read as a pattern.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ADDRESS_PATTERN = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]{0,252}")  # never starts with '-'


def resolved_file(value: str | None, base: Path) -> str | None:
    """A file named relative to `base` (the inventory's directory, or the working directory), ~ expanded."""
    if value is None:
        return None
    expanded = Path(os.path.expanduser(value))
    return str(expanded if expanded.is_absolute() else base / expanded)


class SSHOptions(TypedDict, total=False):
    """How `--host` is reached (the SSH options of the command line), as adhoc_targets takes them."""

    port: int  # 22
    user: str  # root
    identity_file: str | None
    known_hosts: str | None
    accept_new: bool
    connect_timeout: float  # seconds, 10
    become: Become | None


def adhoc_targets(host: str, *, ctids: Sequence[int] = (), vmids: Sequence[int] = (),
                  **ssh: Unpack[SSHOptions]) -> list[Target]:
    """Targets from `--host/--ct/--vm`: the node itself, or one target per CT and VM sharing one NodeRef."""
    port, user = ssh.get("port", 22), ssh.get("user", "root")
    connect_timeout = ssh.get("connect_timeout", 10.0)
    if not ADDRESS_PATTERN.fullmatch(host):
        raise ConfigError(f"--host {host!r}: expected a host name or IP address")
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: expected a TCP port, 1..65535")
    if not NAME_PATTERN.fullmatch(user):
        raise ConfigError(f"--user {user!r}: expected a user name")
    if not connect_timeout > 0:
        raise ConfigError(f"connect timeout {connect_timeout}: expected a positive number of seconds")
    seen: dict[int, str] = {}
    guests = [("--ct", "CT", ctid, "lxc") for ctid in ctids] + [("--vm", "VM", vmid, "vm") for vmid in vmids]
    for flag, noun, guest_id, _ in guests:
        if not CTID_MIN <= guest_id <= CTID_MAX:
            raise ConfigError(f"{flag} {guest_id}: expected a Proxmox {noun} id, {CTID_MIN}..{CTID_MAX}")
        first = seen.get(guest_id)
        if first == flag:
            raise ConfigError(f"{flag} {guest_id} is given twice")
        if first is not None:
            raise ConfigError(f"{flag} {guest_id} is also given as {first} {guest_id}: a node's containers "
                              "and VMs share one id space")
        seen[guest_id] = flag
    cwd = Path.cwd()
    settings = SSHSettings(
        address=host, port=port, user=user,
        identity_file=resolved_file(ssh.get("identity_file"), cwd),
        known_hosts=resolved_file(ssh.get("known_hosts"), cwd), accept_new=ssh.get("accept_new", False),
        connect_timeout=float(connect_timeout), become=ssh.get("become"),
    )
    ref = NodeRef(name=host, ssh=settings)
    if not guests:
        return [Target(host, ref, NODE, source="cli")]
    return [Target(f"{host}/{guest_id}", ref, GuestRef(kind, guest_id), source="cli")
            for _, _, guest_id, kind in guests]


def local_target() -> Target:
    """This machine, with no SSH at all (`--local`)."""
    return Target("local", NodeRef(name="local", ssh=None), NODE, source="local")
