"""What fleetfix acts on: a node (the Proxmox host itself) or a container on a node.

Inventory files, `--host/--ct` flags and Proxmox discovery all resolve to these plain values once, at
load time; nothing downstream reads YAML or layers vars again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SSHSettings:
    """How to reach a node over SSH. One connection per node per run is shared by its containers."""

    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    accept_new: bool = False  # like OpenSSH StrictHostKeyChecking=accept-new; never for a changed key
    jump_host: str | None = None  # "user@host:port" of a bastion, optional
    connect_timeout: float = 10.0
    keepalive: float = 15.0

    @property
    def key(self) -> tuple[str, int, str]:
        """Identity of the connection: targets with the same key share one SSH connection."""
        return (self.address, self.port, self.user)


@dataclass(frozen=True)
class NodeRef:
    name: str
    ssh: SSHSettings | None  # None: this machine (`--local`)


@dataclass(frozen=True)
class Target:
    name: str  # unique in a run: "pve1" for a node, "pve1/200" or the CT's name for a container
    node: NodeRef
    ctid: int | None = None  # None: the node itself
    vars: Mapping[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    source: str = "inventory"  # where it came from: a file path, "cli", "local", "proxmox:<cluster>"

    @property
    def is_container(self) -> bool:
        return self.ctid is not None
