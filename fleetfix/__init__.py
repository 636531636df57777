"""fleetfix: find and fix broken GPU software stacks across Proxmox LXC fleets."""

__version__ = "0.1.0"
