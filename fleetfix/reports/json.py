"""Machine-readable output: the same data as the text report, as JSON on stdout.

Run objects say what they are as JSON (`to_json()`); the audit's runs are rendered by the audit report,
which also serves the other audit formats.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

# What one piece of the printed JSON gathers: iterencode yields a piece per token, too small to write one
# by one; the whole text (every target's facts at 10,000 targets: tens of MB) is too large to hold.
_PIECE_CHARS = 1 << 16


def render_json(run: Any, **options: Any) -> Iterator[str]:
    """The run as JSON, in pieces (the same text json.dumps(..., indent=2, default=str) gives)."""
    data = as_json(run)  # here, not when the first piece is asked for: a run with no JSON fails at once
    return _gathered(_encoded_lines(data))


def _encoded_lines(data: Any) -> Iterator[str]:
    yield from json.JSONEncoder(indent=2, default=str).iterencode(data)
    yield "\n"


def _gathered(chunks: Iterable[str]) -> Iterator[str]:
    batch: list[str] = []
    size = 0
    for chunk in chunks:
        batch.append(chunk)
        size += len(chunk)
        if size >= _PIECE_CHARS:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)


def as_json(run: Any) -> Any:
    # The audit's runs by class name: importing fleetfix.audit to compare types would cost every other
    # command's --json ~0.2 s (issue 21). Subclasses count, as with isinstance.
    names = {cls.__name__ for cls in type(run).__mro__}
    if "AuditRun" in names or "RemediatedAudit" in names:
        from fleetfix.audit import report as audit_report

        if "RemediatedAudit" in names:
            return {**audit_report.json_report(run.final), "audit": audit_report.json_report(run.audit)}
        return audit_report.json_report(run)
    to_json = getattr(run, "to_json", None)
    if to_json is None:
        raise TypeError(f"no JSON report for {type(run).__name__}")
    return to_json()
