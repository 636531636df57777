"""The one sanitiser for text that came from a target, before a terminal (or an XML/HTML report) shows it.

A target controls its own output, its error messages and, through facts, much of what reports say. Control
characters in it act on the operator's terminal: an OSC 52 sequence writes the clipboard, others set the
window title, move the cursor or rewrite lines already printed (`\\r`, CSI). So every such character is
replaced by a visible escape (`\\x1b`, `\\r`, `\\u202e`), which also keeps XML (JUnit) well-formed: XML 1.0
cannot carry C0 controls other than tab, newline and carriage return at all.

Escaped, by Unicode category: controls (Cc: C0, DEL, and the C1 range U+0080..U+009F, which some
terminals take as 8-bit CSI/OSC), format characters (Cf: the bidirectional overrides and isolates, which
reorder what is shown, "Trojan Source", CVE-2021-42574; zero-width characters, which hide text), line and
paragraph separators (Zl, Zp: a new line in disguise), lone surrogates (Cs), and the non-characters
U+FFFE/U+FFFF. Tab and newline are kept by `safe` (multi-line output stays readable); `safe_line` keeps a
line one line.
"""

from __future__ import annotations

import unicodedata

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED = {"\r": "\\r", "\x1b": "\\x1b", "\n": "\\n", "\t": "\\t"}


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES or char in "\ufffe\uffff"


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_control(text: str) -> bool:
    """Whether text holds any character `safe_line` would escape (newline and tab included)."""
    # isprintable() is False for every unsafe category (and for a few harmless ones): a fast pre-check.
    return not text.isprintable() and any(_unsafe(char) for char in text)


def _sanitise(text: str, kept: str) -> str:
    if text.isprintable():  # the common case: nothing to do
        return text
    # Multi-line text (a whole report) is never isprintable(): without the kept characters it usually is.
    # Checked in C, this spares the per-character walk below, which was most of the time `audit show`
    # of a large fleet took.
    rest = text
    for char in kept:
        rest = rest.replace(char, "")
    if rest.isprintable():
        return text
    return "".join(char if char in kept or not _unsafe(char) else _escape(char) for char in text)


def safe(text: str) -> str:
    """text with every character that could act on a terminal (or break XML) escaped visibly; tab and
    newline kept. Idempotent on its own output, and the identity on ordinary text."""
    return _sanitise(text, "\t\n")


def safe_line(text: str) -> str:
    """safe(), and newlines escaped too: for what must stay on one line (an error message, a name)."""
    return _sanitise(text, "\t")
