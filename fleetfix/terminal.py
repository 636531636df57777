"""The one sanitiser for text that came from a target, before a terminal (or an XML/HTML report) shows it.

A target controls its own output, its error messages and, through facts, much of what reports say. Control
characters in it act on the operator's terminal: an OSC 52 sequence writes the clipboard, others set the
window title, move the cursor or rewrite lines already printed (`\\r`, CSI). So every such character is
replaced by a visible escape (`\\x1b`, `\\r`, `\\u202e`), which also keeps XML (JUnit) well-formed: XML 1.0
cannot carry C0 controls other than tab, newline and carriage return at all.

Escaped: C0 controls except tab and newline, DEL, the C1 controls (U+0080..U+009F, which some terminals
take as 8-bit CSI/OSC), the bidirectional overrides and isolates (which reorder what is shown: "Trojan
Source", CVE-2021-42574), lone surrogates and the non-characters U+FFFE/U+FFFF.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\r": "\\r", "\x1b": "\\x1b"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """text with every character that could act on a terminal (or break XML) escaped visibly; tab and
    newline kept. Idempotent on its own output, and the identity on ordinary text."""
    return _UNSAFE.sub(_escape, text)


def safe_line(text: str) -> str:
    """safe(), and newlines escaped too: for what must stay on one line (an error message)."""
    return safe(text).replace("\n", "\\n")
