"""Import modules on a daemon thread while the caller goes on: for what a command needs only later.

Why: a command's slow imports (pydantic models, rules, rich) used to run before its first SSH round trip,
or on its own thread competing with the handshake for the interpreter lock. Started here once the
network work is under way, they run while the threads doing it wait for the network; whichever thread
needs a module first waits for this import (Python's per-module import lock) instead of doing it again.
An import that fails here is ignored: the thread that needs the module imports it again and sees the error.
"""

from __future__ import annotations

import contextlib
import importlib
import threading


def import_ahead(*modules: str) -> threading.Thread:
    """Start importing `modules`, in order, on a daemon thread; returns it (already started)."""
    def load() -> None:
        for name in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    thread = threading.Thread(target=load, daemon=True, name="import-ahead")
    thread.start()
    return thread
