"""`copy` and `fetch` steps: a file between the controller and a target, idempotent by sha256.

    copy   the target's dest already has the local file's sha256 (and mode, when one is given) → ok;
           else push it (Guest.push: streamed, verified in the target, atomic rename) → changed.
    fetch  the local dest already has the target file's sha256 → ok; else pull it → changed.

Check mode runs only the comparison: a read-only `sha256sum` in the target and a local hash, so it changes
nothing anywhere. A missing local source (copy) or target source (fetch) fails the step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetfix.guests.base import Guest
from fleetfix.guests.transfer import DEFAULT_MAX_BYTES, TransferResult, guest_digest, local_digest
from fleetfix.playbook.render import RenderedTransfer
from fleetfix.transport.base import Transport

FETCH_MODE = 0o600  # what lands on the controller is private unless the step says otherwise


@dataclass(frozen=True)
class TransferOutcome:
    status: Literal["ok", "changed", "would-change", "failed"]
    reason: str
    detail: dict[str, Any]  # what the run record and `registered` keep: src, dest, size, sha256, ...


def short(sha256: str | None) -> str:
    return (sha256 or "none")[:12]


def run_transfer(spec: RenderedTransfer, transport: Transport, guest: Callable[[], Guest], *,
                 check_mode: bool, before_change: Callable[[], str | None]) -> TransferOutcome:
    """One copy/fetch on one target. before_change() is asked right before a copy changes the target (the
    snapshot guard); a string it returns refuses the change. TransferError/TransportError propagate."""
    max_bytes = spec.max_bytes or DEFAULT_MAX_BYTES
    detail: dict[str, Any] = {"op": spec.kind, "src": spec.src, "dest": spec.dest}
    if spec.kind == "copy":
        want = local_digest(spec.src)
        if want is None or not Path(spec.src).is_file():
            return TransferOutcome("failed", f"copy: {spec.src} does not exist on the controller", detail)
        have = guest_digest(transport, spec.dest)
        detail.update(sha256=want, before=have.sha256 if have else None)
        same_mode = have is not None and (spec.mode is None or have.mode == spec.mode)
        if have is not None and have.sha256 == want and same_mode:
            return TransferOutcome("ok", f"{spec.dest} matches (sha256 {short(want)}, {have.size} bytes)",
                                   {**detail, "size": have.size, "changed": False})
        why = "absent" if have is None else ("differs" if have.sha256 != want else "mode differs")
        if check_mode:
            return TransferOutcome("would-change", f"would copy {spec.src} -> {spec.dest} ({why})", detail)
        refusal = before_change()
        if refusal is not None:
            return TransferOutcome("failed", refusal, detail)
        done = guest().push(spec.src, spec.dest, mode=0o644 if spec.mode is None else spec.mode,
                            max_bytes=max_bytes)
        return _changed(f"copied {done.size} bytes to {spec.dest} (sha256 {short(done.sha256)}; was {why})",
                        detail, done)
    have = guest_digest(transport, spec.src)
    if have is None:
        return TransferOutcome("failed", f"fetch: {spec.src} does not exist on the target", detail)
    local = local_digest(spec.dest) if os.path.isfile(spec.dest) else None
    detail.update(sha256=have.sha256, before=local)
    if local == have.sha256:
        return TransferOutcome("ok", f"{spec.dest} matches (sha256 {short(local)}, {have.size} bytes)",
                               {**detail, "size": have.size, "changed": False})
    why = "absent" if local is None else "differs"
    if check_mode:
        return TransferOutcome("would-change", f"would fetch {spec.src} -> {spec.dest} ({why})", detail)
    # No before_change(): a fetch changes the controller, not the target, so there is nothing to snapshot.
    Path(spec.dest).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    done = guest().pull(spec.src, spec.dest, mode=FETCH_MODE if spec.mode is None else spec.mode,
                        max_bytes=max_bytes)
    return _changed(f"fetched {done.size} bytes to {spec.dest} (sha256 {short(done.sha256)}; was {why})",
                    detail, done)


def _changed(reason: str, detail: dict[str, Any], done: TransferResult) -> TransferOutcome:
    return TransferOutcome("changed", reason, {**detail, "size": done.size, "sha256": done.sha256,
                                                "changed": True})
