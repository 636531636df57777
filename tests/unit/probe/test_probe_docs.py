"""docs/findings.md documents every finding code, and only codes that exist."""

from __future__ import annotations

import re
from pathlib import Path

from fleetfix.probe.rules import CODES

FINDINGS_DOC = Path(__file__).resolve().parents[3] / "docs" / "findings.md"


def documented_codes() -> list[str]:
    return re.findall(r"^### ([A-Z][A-Z0-9_]+)$", FINDINGS_DOC.read_text(), flags=re.MULTILINE)


def test_every_code_is_documented_once() -> None:
    documented = documented_codes()
    assert sorted(documented) == sorted(set(documented)), "a code is documented twice"
    assert set(CODES) - set(documented) == set(), "codes missing from docs/findings.md"
    assert set(documented) - set(CODES) == set(), "docs/findings.md documents codes no rule emits"


def test_docs_follow_the_chain_order() -> None:
    assert documented_codes() == list(CODES)


def test_each_entry_says_what_how_and_fix() -> None:
    sections = re.split(r"^### ", FINDINGS_DOC.read_text(), flags=re.MULTILINE)[1:]
    for section in sections:
        code = section.split("\n", 1)[0]
        assert "**Detected from**" in section, code
        assert "**Fix:**" in section, code
        assert re.search(r"\*\*(error|warning|info)\b", section), code
