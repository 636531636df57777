"""`copy` (controller → target) and `fetch` (target → controller): one file, idempotent by sha256
(playbook/transfers.py moves it). A transfer is only its transfer: it runs no script of its own."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field

from fleetfix.errors import TransferError, TransportError
from fleetfix.playbook.render import Compiler, Loc, RenderedTransfer, Renderer, StepFields
from fleetfix.playbook.steps.base import StepCall, StepEnd
from fleetfix.playbook.transfers import run_transfer

_OCTAL_MODE = re.compile(r"^0?[0-7]{3,4}$")


class TransferSpec(BaseModel):
    """`copy` / `fetch`: src and dest are templates (text, not shell: never quoted). Controller paths are
    relative to the playbook's directory; target paths are absolute."""

    model_config = ConfigDict(extra="forbid")

    src: str = Field(min_length=1)
    dest: str = Field(min_length=1)
    # A quoted octal string: YAML 1.1 reads an unquoted 0644 as the number 420 and 644 as 644.
    mode: str | None = None
    max_size: int | None = Field(None, gt=0)  # bytes; default guests.transfer.DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class Transfer:
    key: str  # "copy" | "fetch"
    field: str
    spec: type[BaseModel] = TransferSpec

    def rules(self, step: StepFields, spec: Any) -> Iterator[tuple[Loc, str]]:
        for field in ("check", "apply", "verify", "until", "changed_when"):
            if getattr(step, field) is not None:
                yield (field,), f"not with {self.key} (it checks by sha256 itself)"
        if step.retries:
            yield ("retries",), f"not with {self.key}"
        if step.env:
            yield ("env",), f"not with {self.key} (no script runs)"
        if spec.mode is not None and not _OCTAL_MODE.match(spec.mode):
            yield (self.key, "mode"), 'an octal mode as a quoted string, e.g. "0644"'

    def compile(self, spec: Any, compiler: Compiler) -> dict[str, jinja2.Template]:
        return {field: compiler.text(getattr(spec, field), (self.key, field)) for field in ("src", "dest")}

    def render(self, spec: Any, compiled: dict[str, jinja2.Template], renderer: Renderer) -> RenderedTransfer:
        paths: dict[str, str] = {}
        for field, template in compiled.items():
            paths[field] = renderer.text(template, f"{self.key}.{field}")
            if not paths[field].strip():
                raise renderer.error(f"{self.key}.{field}", ValueError(f"{field} rendered empty"))
        controller = "src" if self.key == "copy" else "dest"
        guest = "dest" if self.key == "copy" else "src"
        if not paths[guest].startswith("/"):
            raise renderer.error(f"{self.key}.{guest}",
                                 ValueError(f"{paths[guest]!r}: a target path must be absolute"))
        local = Path(paths[controller]).expanduser()
        if not local.is_absolute():  # relative to the playbook's file, like `requires`
            local = renderer.directory / local
        paths[controller] = str(local)
        mode = int(spec.mode, 8) if spec.mode is not None else None
        return RenderedTransfer(self.key, paths["src"], paths["dest"], mode, spec.max_size)

    def run(self, call: StepCall, rendered: RenderedTransfer) -> StepEnd:
        """Recorded as a `transfer` event; what it moved is also the step's registered value."""
        started = time.monotonic()
        where = {"op": rendered.kind, "src": rendered.src, "dest": rendered.dest}
        try:
            outcome = run_transfer(rendered, call.transport, call.guest, check_mode=call.check_mode,
                                   before_change=call.before_change)
        except TransferError as exc:
            call.event("transfer", **where, status="failed", error=str(exc),
                       duration=time.monotonic() - started)
            return StepEnd("failed", str(exc))
        except TransportError as exc:
            call.event("transfer", **where, status="unreachable", error=str(exc),
                       duration=time.monotonic() - started)
            raise call.lost(f"{rendered.kind}: {exc}", exc) from None
        call.event("transfer", **outcome.detail, status=outcome.status, reason=outcome.reason,
                   duration=time.monotonic() - started)
        if outcome.status == "failed" and call.check_mode and call.would_change_before:
            # e.g. fetching what an earlier step would create: like an assertion, it may well pass then
            return StepEnd("would-change", "not possible before the changes above: " + outcome.reason,
                           registered=outcome.detail)
        return StepEnd(outcome.status, outcome.reason, registered=outcome.detail)


COPY = Transfer("copy", "copy_spec")  # `copy_spec`: BaseModel.copy is pydantic's
FETCH = Transfer("fetch", "fetch")
