"""Machine-readable output: the same data as the text report, as JSON on stdout.

Run objects say what they are as JSON (`to_json()`); the audit's runs are rendered by the audit report,
which also serves the other audit formats.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

# What one piece of the printed JSON gathers: the whole text (every target's facts at 10,000 targets: tens
# of MB) is too large to hold, one piece per member too small to write one by one.
_PIECE_CHARS = 1 << 16
_INDENT = "  "


def render_json(run: Any, **options: Any) -> Iterator[str]:
    """The run as JSON, in pieces: the text json.dumps(..., indent=2, default=str) gives, but for how a
    float is spelled (1e-07 may come out as 1e-7: the same number)."""
    data = as_json(run)  # here, not when the first piece is asked for: a run with no JSON fails at once
    return _gathered(_encoded(data))


def _encoded(data: Any) -> Iterator[str]:
    """The document's text, member by member: a top-level object's or array's members, and those of an
    array inside it (a run's targets), each encoded on its own."""
    yield from _container(data, 0, nested=True)
    yield "\n"


def _container(data: Any, level: int, *, nested: bool) -> Iterator[str]:
    if isinstance(data, dict) and data and all(isinstance(key, str) for key in data):
        members: Iterable[tuple[str, Any]] = ((f"{json.dumps(key)}: ", value) for key, value in data.items())
        brackets = "{}"
    elif isinstance(data, list) and data:
        members = (("", value) for value in data)
        brackets = "[]"
    else:
        yield _member(data, level)
        return
    inner = "\n" + _INDENT * (level + 1)
    yield brackets[0]
    for index, (key, value) in enumerate(members):
        yield ("," if index else "") + inner + key
        if nested and isinstance(value, list):
            yield from _container(value, level + 1, nested=False)
        else:
            yield _member(value, level + 1)
    yield "\n" + _INDENT * level + brackets[1]


def _member(value: Any, level: int) -> str:
    """One value's JSON at this depth. pydantic-core writes it several times faster than the json module's
    indenting encoder, which is pure Python and was a visible share of `fleetfix probe --json`'s CPU at
    fleet scale; its text is kept only where it is what json.dumps gives: ASCII (json.dumps escapes
    the rest) and read back equal to the value (so no tuple, datetime, non-str key or object that only
    default=str would have written). Only where pydantic is loaded already: importing it would cost a
    command that does not use it more than it saves on a small document."""
    to_json = getattr(sys.modules.get("pydantic_core"), "to_json", None)
    text = ""
    if to_json is not None:
        with contextlib.suppress(ValueError, TypeError):  # an object it cannot write: default=str can
            text = to_json(value, indent=2).decode()
    if not text or not text.isascii() or json.loads(text) != value:
        text = json.dumps(value, indent=2, default=str)
    return text.replace("\n", "\n" + _INDENT * level) if level else text


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
    # The audit's runs by class name: importing fleetfix.audit to compare types would slow every other
    # command's --json by the audit's imports. Subclasses count, as with isinstance.
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
