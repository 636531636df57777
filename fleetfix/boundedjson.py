"""JSON from targets and caches, read within limits: one `ValueError` for every way it can be bad.

`json.loads` has three failure modes besides malformed text that a caller catching `JSONDecodeError`
misses: an integer over Python's 4300-digit conversion limit (a plain ValueError), nesting deeper than the
interpreter's recursion limit (RecursionError), and integers too big for anything that uses them later
(OverflowError far from the parser). Here integers are at most MAX_INT_DIGITS digits and all of these are
a `ValueError` with a one-line message.
"""

from __future__ import annotations

import json
from typing import Any

MAX_INT_DIGITS = 20


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def loads(text: str | bytes) -> Any:
    """json.loads, within the limits above; ValueError (JSONDecodeError is one) for anything bad."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
