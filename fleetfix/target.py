"""What fleetfix acts on: a node (the Proxmox host itself), or a guest on a node (an LXC container, a VM).

Inventory files, `--host/--ct` flags and Proxmox discovery all resolve to these plain values once, at
load time; nothing downstream reads YAML or layers vars again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Become:
    """Privilege escalation on a node for a login that is not root: `sudo -n -u USER --` before the
    commands that need it (`pct`, `qm`, `pvesh`; everything run on a node that is itself a target).

    password: a secret reference (`@env:NAME` or `@file:PATH`, fleetfix.secrets), resolved when the
    connection is opened; never the password itself. None: sudo must not ask (NOPASSWD rules).
    """

    method: str = "sudo"  # the only one: su needs a terminal
    user: str = "root"
    password: str | None = None


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

    become: Become | None = None  # run the node's privileged commands through sudo (docs/security.md)

    @property
    def key(self) -> tuple[Any, ...]:
        """Identity of the connection: targets with the same key share one SSH connection.

        Every setting that decides whom we trust or what we run as is part of it (address, port, user,
        identity, known_hosts and accept_new, the jump chain, become): two inventory nodes that differ
        in any of them get a connection each, so no node is ever reached under another node's host-key
        check or credentials. Only timeouts, which change no trust decision, are left out.
        """
        return (self.address, self.port, self.user, self.identity_file, self.known_hosts, self.accept_new,
                self.jump_host, self.become)

    @property
    def endpoint(self) -> tuple[str, int]:
        """Where the node is (address, port): the same machine whatever the login, for telling guests
        apart (a CT id is unique per node, not per login)."""
        return (self.address, self.port)


@dataclass(frozen=True)
class NodeRef:
    name: str
    ssh: SSHSettings | None  # None: this machine (`--local`)


@dataclass(frozen=True)
class GuestRef:
    """Which guest of its node a target is: the node itself, or a guest kind with its Proxmox id.

    The kind names a driver in `fleetfix.guests` (exec, status, snapshots for that kind); nothing else
    branches on it but the findings' fix texts (`probe/rules/guestkind.py`: `pct`, `qm` or neither).
    """

    kind: str = "node"  # a key of fleetfix.guests.GUEST_KINDS: "node", "lxc", "vm"
    id: int | None = None  # the CT id / VMID; None for the node

    @classmethod
    def lxc(cls, ctid: int) -> GuestRef:
        return cls("lxc", ctid)

    @classmethod
    def vm(cls, vmid: int) -> GuestRef:
        return cls("vm", vmid)

    @property
    def is_node(self) -> bool:
        return self.kind == "node"

    def to_json(self) -> dict[str, Any]:
        """The guest in JSON outputs: `guest` and `vmid`, and `ctid` as before for containers."""
        return {"guest": self.kind, "vmid": self.id, "ctid": self.id if self.kind == "lxc" else None}


NODE = GuestRef()


@dataclass(frozen=True)
class WheelBuilder:
    """A dedicated wheel builder (inventory `wheels: builder:`): for each cache key a target needs and the
    cache lacks, the controller clones this CT template on its node, runs the playbook in the clone, keeps
    its wheels as the builder `clone:<node>/<template>`, and destroys the clone (docs/extensions.md)."""

    node: NodeRef
    template: int  # the CT template's id on node (`template: 1` in its config)
    first_id: int = 9900  # clones take the first free id from here ...
    ids: int = 100  # ... among this many
    storage: str | None = None  # a full clone onto this storage (`pct clone --full 1 --storage`); else linked

    @property
    def builder_id(self) -> str:
        """The cache's builder id of what its clones build (fleetfix.wheels.cache)."""
        return f"clone:{self.node.name}/{self.template}"


@dataclass(frozen=True)
class Target:
    name: str  # unique in a run: "pve1" for a node, "pve1/200" or the guest's name for a CT/VM
    node: NodeRef
    guest: GuestRef = NODE
    vars: Mapping[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    source: str = "inventory"  # where it came from: a file path, "cli", "local", "proxmox:<cluster>"
    # The targets whose built wheels this one installs from the wheel cache (inventory `wheels: trust:`,
    # docs/security.md); by default none: a target installs only wheels it built itself.
    wheel_builders: frozenset[str] = frozenset()
    # The dedicated builder whose clones build this target's wheels (inventory `wheels: builder:`); None:
    # the target builds what no trusted builder has.
    wheel_builder: WheelBuilder | None = None
    # False (inventory `wheels: build: never`): wheels come only from the operator's wheelhouses and
    # upstream's verified release wheels; nothing is built for this target, by itself or anyone.
    wheel_build: bool = True
