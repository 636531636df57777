"""Guest kinds: how fleetfix drives each kind of target over its node's connection.

    guest = open_guest(target, node_transport)   # the driver for target.guest.kind
    guest.transport().execute(argv)              # inside the guest
    guest.snapshot("fleetfix-20261203-030000")   # on the node, by the guest's id

A new kind: a module implementing `base.Guest`, and its line here. A kind whose guests can run one command
together over one node channel (containers, `pctbatch`) also has a line in NODE_BATCHES.
"""

from __future__ import annotations

from fleetfix.guests.base import Guest, GuestStatus
from fleetfix.guests.lxc import LxcGuest
from fleetfix.guests.node import NodeGuest
from fleetfix.guests.pctbatch import PctBatch
from fleetfix.guests.vm import VmGuest
from fleetfix.target import Target
from fleetfix.transport.base import Transport

GUEST_KINDS: dict[str, type[Guest]] = {
    "node": NodeGuest,
    "lxc": LxcGuest,
    "vm": VmGuest,
}

# Kinds with a node-side fan-out: many guests of one node, one channel, one copy of the stdin.
NODE_BATCHES: dict[str, type[PctBatch]] = {
    "lxc": PctBatch,
}


def open_guest(target: Target, node: Transport) -> Guest:
    """The driver for the target's guest kind, over its node's transport (shared, not owned)."""
    try:
        make = GUEST_KINDS[target.guest.kind]
    except KeyError:
        raise ValueError(f"{target.name}: unknown guest kind {target.guest.kind!r}") from None
    return make(target, node)


def pve_types() -> dict[str, str]:
    """Proxmox's guest type -> fleetfix's kind ({"lxc": "lxc", "qemu": "vm"}), for discovery."""
    return {driver.pve_type: kind for kind, driver in GUEST_KINDS.items() if driver.pve_type is not None}


__all__ = ["GUEST_KINDS", "NODE_BATCHES", "Guest", "GuestStatus", "open_guest", "pve_types"]
