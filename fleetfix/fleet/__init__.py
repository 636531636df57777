"""Running work on a fleet: every decision about how many things run at once lives in this package.

- `run`: `Fleet.map`, the one place a target's concurrency is decided (nodes at once, channels per node,
  staged targets that need no thread, interrupts);
- `connections`: one connection per node for the Fleet's lifetime (the pool, become, dial-ahead);
- `outcome`: the one `Outcome` type, and how an exception raised for a target becomes one;
- `batches`: one script on every target, a node's containers over one channel and the node's own script
  once (`run_scripts`); the probe passes in what it runs and how it reads the output;
- the names below are the package's public ones; callers import them from `fleetfix.fleet`.
"""

from __future__ import annotations

from fleetfix.fleet.connections import Connector, NodeConnection
from fleetfix.fleet.outcome import EventHandler, Outcome, Status
from fleetfix.fleet.run import (
    DEFAULT_CHANNELS_PER_NODE,
    DEFAULT_FORKS,
    Fleet,
    Pending,
    RunOnThread,
    StartFn,
    interrupt_all,
)

__all__ = [
    "DEFAULT_CHANNELS_PER_NODE",
    "DEFAULT_FORKS",
    "Connector",
    "EventHandler",
    "Fleet",
    "NodeConnection",
    "Outcome",
    "Pending",
    "RunOnThread",
    "StartFn",
    "Status",
    "interrupt_all",
]
