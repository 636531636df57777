"""`--json` output (reports/json.py): json.dumps's text, written member by member and faster."""

from __future__ import annotations

import datetime
import enum
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetfix.reports.json import _PIECE_CHARS, render_json


class Run:
    def __init__(self, data: Any) -> None:
        self.data = data

    def to_json(self) -> Any:
        return self.data


class Severity(enum.StrEnum):
    ERROR = "error"


class Colour(enum.Enum):
    RED = 1


def rendered(data: Any) -> str:
    return "".join(render_json(Run(data)))


def reference(data: Any) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


TARGET = {"target": "pve1/200", "status": "ok", "duration": 1.234, "findings": [],
          "facts": {"os": {"id": "debian", "version": "12"}, "pythons": [{"path": "/usr/bin/python3",
                    "torch": {"cuda": "12.8", "arch_list": ["sm_80", "sm_90"]}}], "gpu": {}},
          "node_facts": None}


@pytest.mark.parametrize("data", [
    {"targets": [TARGET, {**TARGET, "target": "pve1/201", "status": "unreachable", "facts": None}],
     "summary": {"error": 1, "unreachable": 1}},
    [TARGET, [1, [2, []]], {}, "x"],
    {}, [], "plain", 3, None, True,
    {"targets": [], "summary": {}},
    {"note": "naïve café", "nested": [{"name": "ü"}]},      # json.dumps escapes non-ASCII
    {"when": datetime.datetime(2026, 12, 4, 8, 0)},        # default=str: "2026-12-04 08:00:00"
    {"path": Path("/etc/os-release"), "pair": (1, 2)},      # an object default=str writes; a tuple
    {1: "an int key", "2": [{3: "nested int key"}]},
    {"severity": Severity.ERROR, "colour": Colour.RED},    # a StrEnum is its value; an Enum default=str's
    {"nan": math.nan, "inf": [math.inf]},
    {"bytes": b"raw", "set": {1}},
])
def test_the_text_is_what_json_dumps_gives(data: Any) -> None:
    assert rendered(data) == reference(data)


def test_without_pydantic_loaded_the_json_module_writes_it_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_core", None)  # as in a command that never imported it
    data = {"targets": [TARGET], "tiny": 1e-07}
    assert rendered(data) == reference(data)


def test_a_float_may_be_spelled_otherwise_but_is_the_same_number() -> None:
    data = {"tiny": 1e-07, "big": 1e22, "plain": 0.5}
    text = rendered(data)
    assert json.loads(text) == data
    assert text.replace("1e-7", "1e-07").replace("1e22", "1e+22") == reference(data)


def test_a_large_run_comes_in_bounded_pieces_that_join_to_the_text() -> None:
    data = {"targets": [{**TARGET, "target": f"pve{i // 10}/{200 + i % 10}"} for i in range(2000)]}
    pieces = list(render_json(Run(data)))
    assert len(pieces) > 5
    member = len(reference(TARGET)) * 2  # a piece ends at the first member past the bound
    assert all(len(piece) <= _PIECE_CHARS + member for piece in pieces)
    assert "".join(pieces) == reference(data)


def test_a_run_without_json_fails_when_rendered_not_when_printed() -> None:
    with pytest.raises(TypeError, match="no JSON report for object"):
        render_json(object())
