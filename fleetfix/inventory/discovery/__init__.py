"""Proxmox discovery: a cluster's containers, listed through the PVE API or `pvesh`, as Targets.

model: sources, listings and their mapping to targets (pure); clients: the API and pvesh fetchers;
discoverer: cache + fetch + map, what the inventory loader calls.
"""

from fleetfix.inventory.discovery.discoverer import Discoverer, discover
from fleetfix.inventory.discovery.model import DiscoveryResult, ProxmoxSource

__all__ = ["Discoverer", "DiscoveryResult", "ProxmoxSource", "discover"]
