"""Snapshots around changes: a guest snapshot before its first change, a rollback if the change fails.

The playbook runner asks a `SnapshotGuard` (one per target and run) right before the first step that will
actually change the target (its check said "not in the desired state", or it has no check). The guard
works through the target's `Guest` (`pct` for a container, `qm` for a VM, run on the node):

1. takes snapshot `fleetfix-<UTC timestamp>` and remembers whether the guest was running, since a
   rollback stops it;
2. prunes older fleetfix snapshots of that guest down to `keep`; only names that fleetfix itself makes
   (`fleetfix-YYYYMMDD-HHMMSS[-N]`) are ever deleted;
3. refuses the change when no snapshot could be taken: storage without snapshot support
   (`snapshot feature is not available`, docs/DOMAIN.md 5.2) or a kind that cannot snapshot (the node
   itself) is refused unless `allow_no_snapshot`; any other snapshot failure is always refused;
4. after a failed target, `rollback()` rolls back with `--start 1` when the guest was running (PVE's
   rollback stops a running guest and only restarts it when told to).

Nothing here raises for a target's own problems: they come back as text for the recap and the run record.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from fleetfix.errors import FleetfixError
from fleetfix.guests import Guest
from fleetfix.guests.base import DEFAULT_GUEST_TIMEOUT
from fleetfix.target import Target
from fleetfix.transport.base import CommandResult

SNAPSHOT_PREFIX = "fleetfix-"
# What PVE says when a volume's storage cannot snapshot (PVE::LXC::Config, docs/DOMAIN.md 5.2).
NO_SNAPSHOT_FEATURE = "snapshot feature is not available"
# pve-configid (pve-common JSONSchema.pm): case-insensitive, at most 40 characters.
PVE_SNAPSHOT_NAME = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
PVE_SNAPSHOT_NAME_MAX = 40
# Only names of this exact shape are fleetfix's to prune; "fleetfix-before-upgrade" is someone else's.
_OWN_NAME = re.compile(r"^fleetfix-(\d{8}-\d{6})(?:-(\d{1,3}))?$")
_NAME_TAKEN = "already used"
_COLLISION_TRIES = 5

# (kind, fields): the run record's event hook (Recorder.event).
EventSink = Callable[..., None]


class GuestFor(Protocol):
    """The guest driver of a target (Fleet.guest); may raise a TransportError (node unreachable)."""

    def __call__(self, target: Target, /) -> Guest: ...


@dataclass(frozen=True)
class SnapshotPolicy:
    """What `apply --snapshot ...` (or a playbook's `snapshot: true`) asks for."""

    take: bool = False  # snapshot before the first change
    rollback_on_failure: bool = False
    keep: int | None = None  # prune to this many fleetfix snapshots per CT (the new one included)
    allow_no_snapshot: bool = False  # change a CT whose storage cannot snapshot (and a node) anyway
    timeout: float = DEFAULT_GUEST_TIMEOUT

    def __post_init__(self) -> None:
        if self.keep is not None and self.keep < 1:
            raise ValueError("keep must be at least 1 (the snapshot just taken)")

    @property
    def active(self) -> bool:
        return self.take or self.rollback_on_failure or self.keep is not None


def snapshot_name(now: datetime, attempt: int = 0) -> str:
    """`fleetfix-YYYYMMDD-HHMMSS` in UTC (24 chars), `-N` appended for the Nth retry after a collision.
    Sorting these names sorts them by time."""
    name = SNAPSHOT_PREFIX + now.astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    if attempt:
        name += f"-{attempt}"
    if len(name) > PVE_SNAPSHOT_NAME_MAX or not PVE_SNAPSHOT_NAME.match(name):  # pragma: no cover
        raise AssertionError(f"not a valid PVE snapshot name: {name}")
    return name


def own_snapshot_key(name: str) -> tuple[str, int] | None:
    """(timestamp, retry number) for a name fleetfix made, else None (never touch it)."""
    match = _OWN_NAME.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2) or 0)


def to_prune(names: Sequence[str], keep: int) -> list[str]:
    """fleetfix's own snapshots beyond the newest `keep`, oldest first; other names are never listed."""
    own = sorted((key, name) for name in names if (key := own_snapshot_key(name)) is not None)
    return [name for _, name in own[: max(len(own) - keep, 0)]]


def _why(result: CommandResult) -> str:
    if result.timed_out:
        return "timed out"
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {result.exit_code}"


@dataclass
class SnapshotOutcome:
    """What happened to one target's snapshot, for the recap, the JSON output and the run record."""

    name: str | None = None  # the snapshot taken
    unavailable: str | None = None  # why none was taken (storage, a node, an error)
    refused: bool = False  # no snapshot, so the change was not made
    pruned: list[str] = field(default_factory=list)
    rolled_back: bool = False
    rollback_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def note(self) -> str:
        """One short phrase for the recap line ("" when there is nothing to say)."""
        if self.rolled_back:
            return f"rolled back to {self.name}"
        if self.rollback_error is not None:
            return f"ROLLBACK FAILED ({self.rollback_error}); snapshot {self.name} kept"
        if self.name is not None:
            return f"snapshot {self.name}"
        if self.unavailable is not None:
            return ("not changed, no snapshot: " if self.refused else "no snapshot: ") + self.unavailable
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unavailable": self.unavailable, "refused": self.refused,
                "pruned": list(self.pruned), "rolled_back": self.rolled_back,
                "rollback_error": self.rollback_error, "warnings": list(self.warnings)}


class SnapshotGuard:
    """One target's snapshot for one run. `before_change()` is idempotent: only the first call acts.
    Not thread-safe, and needs not be: a target's steps run one after another."""

    def __init__(self, target: Target, policy: SnapshotPolicy, guest_for: GuestFor, *,
                 event: EventSink | None = None, description: str = "",
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.target, self.policy, self.guest_for = target, policy, guest_for
        self.event = event or (lambda kind, **fields: None)
        self.description = description
        self.now = now
        self.outcome = SnapshotOutcome()
        self._decided = False
        self._refusal: str | None = None
        self._was_running = True
        self._guest: Guest | None = None

    @property
    def touched(self) -> bool:
        """Whether a change was about to be made (so there is something to say in the recap)."""
        return self._decided

    def before_change(self) -> str | None:
        """Snapshot the target if not done yet. Returns why it must NOT be changed, or None to go on."""
        if not self._decided:
            self._decided = True
            self._refusal = self._take()
        return self._refusal

    def _event(self, kind: str, **fields: Any) -> None:
        self.event(kind, target=self.target.name, **self.target.guest.to_json(), **fields)

    # -- taking ------------------------------------------------------------------------------------------

    def _take(self) -> str | None:
        try:
            guest = self._guest = self.guest_for(self.target)
        except FleetfixError as exc:
            return self._unavailable(f"snapshot: {exc}", storage=False)
        if guest.no_snapshots is not None:
            return self._unavailable(guest.no_snapshots, storage=True)
        tool = f"{guest.tool} snapshot"
        try:
            # Unknown counts as running: the steps run inside the guest, which needs it running.
            self._was_running = guest.status() != "stopped"
            result, name = self._snapshot(guest)
        except FleetfixError as exc:
            return self._unavailable(f"{tool}: {exc}", storage=False)
        if not result.ok:
            return self._unavailable(f"{tool}: {_why(result)}", storage=NO_SNAPSHOT_FEATURE in result.stderr)
        self.outcome.name = name
        self._event("snapshot", snapshot=name, ok=True, error=None, was_running=self._was_running)
        if self.policy.keep is not None:
            self._prune(guest)
        return None

    def _snapshot(self, guest: Guest) -> tuple[CommandResult, str]:
        stamp = self.now()
        for attempt in range(_COLLISION_TRIES):
            name = snapshot_name(stamp, attempt)
            result = guest.snapshot(name, self.description)
            if result.ok or _NAME_TAKEN not in result.stderr:
                break  # a second run within the same second retries with -1, -2, ...
        return result, name

    def _unavailable(self, why: str, *, storage: bool) -> str | None:
        """Record why there is no snapshot; refuse the change unless allowed (and it is a storage limit)."""
        self.outcome.unavailable = why
        refuse = not (storage and self.policy.allow_no_snapshot)
        self.outcome.refused = refuse
        self._event("snapshot", snapshot=None, ok=False, error=why, refused=refuse)
        if not refuse:
            return None
        hint = " (--allow-no-snapshot changes it anyway)" if storage else ""
        return f"not changed: no snapshot: {why}{hint}"

    def _prune(self, guest: Guest) -> None:
        assert self.policy.keep is not None
        try:
            listed, names = guest.list_snapshots()
            if not listed.ok:
                self.outcome.warnings.append(f"listing snapshots: {_why(listed)}; nothing pruned")
                return
            for old in to_prune(names, self.policy.keep):
                if old == self.outcome.name:  # pragma: no cover - keep >= 1 keeps the newest
                    continue
                deleted = guest.delete_snapshot(old)
                if deleted.ok:
                    self.outcome.pruned.append(old)
                else:
                    self.outcome.warnings.append(f"deleting snapshot {old}: {_why(deleted)}")
        except FleetfixError as exc:
            self.outcome.warnings.append(f"pruning snapshots: {exc}")
        if self.outcome.pruned or self.outcome.warnings:
            self._event("snapshot-prune", deleted=self.outcome.pruned, warnings=self.outcome.warnings)

    # -- rolling back ------------------------------------------------------------------------------------

    def rollback(self) -> None:
        """Roll the guest back to the snapshot taken (if any), restarting it when it was running."""
        name, guest = self.outcome.name, self._guest
        if name is None or guest is None:
            return
        started = time.monotonic()
        error: str | None = None
        try:
            result = guest.rollback(name, start=self._was_running)
            if not result.ok:
                error = _why(result)
        except FleetfixError as exc:
            error = str(exc)
        self.outcome.rolled_back = error is None
        self.outcome.rollback_error = error
        self._event("rollback", snapshot=name, ok=error is None, error=error, start=self._was_running,
                    duration=time.monotonic() - started)
