"""Transports: the one seam between fleetfix and a target. See base.Transport."""

from fleetfix.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "Transport"]
