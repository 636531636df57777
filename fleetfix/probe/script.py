"""The probe scripts as text, with their parameters prepended as quoted shell assignments.

This is the one place where probe parameters become shell text: every value goes through
`shlex.quote`, so an interpreter path from the inventory can never run as code on a target.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from functools import cache
from importlib import resources

from fleetfix.errors import ConfigError


@cache
def _packaged(name: str) -> str:
    return resources.files("fleetfix.probe").joinpath(name).read_text(encoding="utf-8")


def probe_script_body() -> str:
    """probe.sh exactly as shipped (no parameters: it then inspects `python3`, not deep)."""
    return _packaged("probe.sh")


def build_probe_script(pythons: Sequence[str] = ("python3",), deep: bool = False, *,
                       discover: bool = True) -> str:
    """The probe for one target: inspect these interpreters (names on PATH or paths); deep = import torch;
    discover = also find torch envs nobody named and inspect them the same way (off: the list is whole)."""
    if isinstance(pythons, str):
        raise TypeError("pythons must be a sequence of interpreter names, not one string")
    for interpreter in pythons:
        if not interpreter or not interpreter.strip() or any(c in interpreter for c in "\x00\n\r"):
            raise ConfigError(f"not a usable python interpreter name: {interpreter!r}", field="python")
    words = " ".join(shlex.quote(p) for p in pythons)
    header = (
        "# parameters, from fleetfix.probe.script.build_probe_script\n"
        f"FLEETFIX_DEEP={1 if deep else 0}\n"
        "FLEETFIX_PYTHONS_GIVEN=1\n"
        f"FLEETFIX_DISCOVER={1 if discover else 0}\n"
        f"set -- {words}\n"
    )
    return header + probe_script_body()


def build_node_script() -> str:
    """The per-node script: hostname and the NVIDIA kernel module line from /proc/driver/nvidia/version."""
    return _packaged("node.sh")


NODE_FACTS_SCRIPT = build_node_script()
