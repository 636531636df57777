"""Where fleetfix keeps its state on the controller: run records, the audit history, discovery caches."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_STATE_DIR, else $XDG_STATE_HOME/fleetfix, else ~/.local/state/fleetfix."""
    env = os.environ if environ is None else environ
    if env.get("FLEETFIX_STATE_DIR"):
        return Path(env["FLEETFIX_STATE_DIR"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "fleetfix"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "fleetfix"
