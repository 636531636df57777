"""What running one target came to: the one `Outcome` type, and how an exception becomes one.

Every caller of `Fleet.map` reads these, the playbook runner and the tests included: one classification of
errors for the whole program, so a target counts as unreachable or failed the same way everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from fleetfix.errors import BecomeError, FleetfixError, GuestError, Interrupted, UnexpectedError
from fleetfix.target import Target
from fleetfix.transport.base import Transport

R = TypeVar("R")
Status = Literal["ok", "failed", "unreachable"]

# on_event(kind, target, detail): kind is "start", then one of "ok" / "failed" / "unreachable" with the
# error's one-line message as detail. Called from worker threads: the handler must be thread-safe.
EventHandler = Callable[[str, Target, str], None]


@dataclass(frozen=True)
class Outcome(Generic[R]):
    target: Target
    status: Status
    value: R | None = None
    error: FleetfixError | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, target: Target, error: Exception, duration: float) -> Outcome[Any]:
        """How an exception raised for a target is recorded, never raised on: a stopped, missing or
        agent-less guest, or sudo refused, is unreachable (nothing ran, like a node down); any other
        FleetfixError failed; anything else is a bug, failed as an UnexpectedError, and the others go on."""
        if isinstance(error, (GuestError, BecomeError)):
            return cls(target, "unreachable", error=error, duration=duration)
        if isinstance(error, FleetfixError):
            return cls(target, "failed", error=error, duration=duration)
        wrapped = UnexpectedError(f"unexpected error: {describe(error)}")
        wrapped.__cause__ = error
        return cls(target, "failed", error=wrapped, duration=duration)

    @classmethod
    def since(cls, target: Target, error: Exception, started: float) -> Outcome[Any]:
        """`failed`, timed from `started` (time.monotonic())."""
        return cls.failed(target, error, time.monotonic() - started)


def call(fn: Callable[[Target, Transport], R], target: Target, transport: Transport, started: float
         ) -> Outcome[R]:
    """fn(target, transport) as an Outcome: its value, or what it raised."""
    try:
        value = fn(target, transport)
    except Exception as error:
        return Outcome.since(target, error, started)
    return Outcome(target, "ok", value=value, duration=time.monotonic() - started)


def not_started(target: Target) -> Outcome[Any]:
    """A target the Fleet did not start because it was interrupted first."""
    return Outcome(target, "failed", error=Interrupted("interrupted: not started"))


def report(outcome: Outcome[Any], on_event: EventHandler | None) -> None:
    if on_event:
        on_event(outcome.status, outcome.target, str(outcome.error or ""))


def describe(error: BaseException) -> str:
    """An exception on one line, its type first."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
