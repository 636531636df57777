"""A command and Python's cyclic garbage collector: start-up's objects are scanned never, the run's as usual.

A command's start-up (imports, pydantic's validators, the inventory) leaves some 60,000 objects that live
until the process ends, and makes almost no cyclic garbage. With the collector's defaults they are scanned
again and again while the command runs, and once more while the interpreter shuts down, a noticeable
share of a probe's CPU spent to collect almost nothing (docs/performance.md, "The command and the garbage
collector"). So, for one command:

- during start-up a collection waits for START_UP_THRESHOLD new objects instead of 700 (still bounded: a
  huge inventory is collected while it loads);
- when the fleet's work starts (`start_up_done`, from FleetOptions.open), everything alive is frozen
  (gc.freeze: never scanned again) and the usual thresholds come back, for what the run makes (a higher
  one saves a little CPU but raises a large fleet's peak memory: cyclic garbage waits longer);
- at exit everything is frozen once more: the interpreter's shutdown has nothing to scan, and the OS takes
  the memory back.

When the command's context closes, the thresholds are what they were and start-up's objects unfrozen: a
program that runs commands in-process (the tests, through CliRunner) keeps its collector as it was, but
for the freeze at its exit. Where something else froze objects already, the collector is left alone. The
library never touches the collector: that is for the program that imports it to decide.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator

START_UP_THRESHOLD = 100_000


class _Command:
    def __init__(self, usual: tuple[int, int, int]) -> None:
        self.usual = usual
        self.starting = True


_current: _Command | None = None
_freezes_at_exit = False


@contextlib.contextmanager
def command_collector() -> Iterator[None]:
    """For one command: few collections until `start_up_done`; as before when it ends."""
    global _current, _freezes_at_exit
    if _current is not None or gc.get_freeze_count():  # a command within a command, or frozen by others
        yield
        return
    if not _freezes_at_exit:
        atexit.register(gc.freeze)
        _freezes_at_exit = True
    command = _current = _Command(gc.get_threshold())
    gc.set_threshold(START_UP_THRESHOLD, *command.usual[1:])
    try:
        yield
    finally:
        _current = None
        gc.set_threshold(*command.usual)
        if not command.starting:
            gc.unfreeze()


def start_up_done() -> None:
    """The command's real work starts: what is alive now lives to the end; collect the rest as usual."""
    command = _current
    if command is None or not command.starting:
        return
    command.starting = False
    gc.freeze()
    gc.set_threshold(*command.usual)
