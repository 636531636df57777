"""The target pattern language of `--limit` and of inventory groups.

A pattern is comma-separated terms; a target is selected when it matches any inclusion term (or there are
none, only exclusions) and no exclusion term (`!term`). The input order of targets is kept.

    pve1/200        exact target name             name:pve1/2*   name or glob on names only
    pve1/*          glob on target names          group:gpu*     group membership (glob on group names)
    training        a target name or a group      tag:a100       tag (glob on tags)
    all             every target                  node:pve1      every target on that node (glob)
                                                  ctid:200       CT id, or a range: ctid:200-299

Inventory names cannot contain `,`, `!`, `:`, `*`, `?` or `[`, so every term reads one way only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fleetfix.errors import ConfigError
from fleetfix.target import Target

PREFIXES = ("name", "group", "tag", "node", "ctid")
_GLOB_CHARS = frozenset("*?[")
# "tga:gpu" is a typo, not a name; but an IPv6 address ("fe80::1", "dead:beef::1") may be an ad-hoc name.
_PREFIX_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9_-]*):(?!:)")
_CTID_RANGE = re.compile(r"(\d{1,10})(?:-(\d{1,10}))?")


@dataclass(frozen=True)
class Term:
    """One parsed term. `text` is the term as written (with its `!`), for error messages."""

    text: str
    kind: str  # "all" | "bare" | one of PREFIXES
    value: str
    exclude: bool = False
    ctid_low: int = 0
    ctid_high: int = 0

    def matches(self, target: Target) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "bare":
            if _GLOB_CHARS.intersection(self.value):
                return fnmatchcase(target.name, self.value)
            return target.name == self.value or self.value in target.groups
        if self.kind == "name":
            return fnmatchcase(target.name, self.value)
        if self.kind == "group":
            return any(fnmatchcase(group, self.value) for group in target.groups)
        if self.kind == "tag":
            return any(fnmatchcase(tag, self.value) for tag in target.tags)
        if self.kind == "node":
            return fnmatchcase(target.node.name, self.value)
        if self.kind == "ctid":
            # PVE ids are one namespace per cluster, containers and VMs alike: the term matches both.
            guest_id = target.guest.id
            return guest_id is not None and self.ctid_low <= guest_id <= self.ctid_high
        raise AssertionError(f"unhandled term kind {self.kind!r}")

    @property
    def unknown_prefix(self) -> str | None:
        """For a bare term that looks like `word:...` with an unknown word: that word (probably a typo)."""
        if self.kind != "bare":
            return None
        found = _PREFIX_LIKE.match(self.value)
        return found.group(1) if found else None


def parse_term(text: str) -> Term:
    """Parse one term; ConfigError (message without context) when it cannot mean anything."""
    raw = text.strip()
    exclude = raw.startswith("!")
    body = raw[1:].strip() if exclude else raw
    if not body:
        raise ConfigError("empty term" if not exclude else "'!' needs a term after it")
    if body == "all":
        return Term(raw, "all", body, exclude)
    prefix, colon, value = body.partition(":")
    if not colon or prefix not in PREFIXES:
        return Term(raw, "bare", body, exclude)
    value = value.strip()
    if not value:
        raise ConfigError(f"{prefix}: needs a value")
    if prefix != "ctid":
        return Term(raw, prefix, value, exclude)
    found = _CTID_RANGE.fullmatch(value)
    if found is None:
        raise ConfigError(f"{raw!r}: ctid: expects a CT id or a range like 200-299")
    low = int(found.group(1))
    high = int(found.group(2)) if found.group(2) else low
    if low > high:
        raise ConfigError(f"{raw!r}: ctid range is empty ({low} > {high})")
    return Term(raw, "ctid", value, exclude, low, high)


def parse_pattern(pattern: str) -> list[Term]:
    """Split on commas and parse each term; ConfigError (message without context) on a bad term."""
    if not pattern.strip():
        raise ConfigError("empty pattern")
    return [parse_term(part) for part in pattern.split(",")]


def apply_terms(targets: Iterable[Target], terms: Sequence[Term]) -> list[Target]:
    """The targets the terms select, in input order. No inclusion terms: start from every target."""
    includes = [term for term in terms if not term.exclude]
    excludes = [term for term in terms if term.exclude]
    return [
        target for target in targets
        if (not includes or any(term.matches(target) for term in includes))
        and not any(term.matches(target) for term in excludes)
    ]


def check_unknown_prefixes(targets: Sequence[Target], terms: Sequence[Term]) -> None:
    """Reject `tga:gpu`-style typos, unless the term really is some target's name (an IPv6 address)."""
    for term in terms:
        prefix = term.unknown_prefix
        if prefix is not None and not any(target.name == term.value for target in targets):
            known = ", ".join(f"{name}:" for name in PREFIXES)
            raise ConfigError(f"unknown selector {prefix + ':'!r} in {term.text!r} (known: {known})")


def select(targets: Sequence[Target], pattern: str | None, *, option: str = "--limit") -> list[Target]:
    """The targets `pattern` selects, in input order; None selects all. Nothing selected is an error."""
    if pattern is None:
        return list(targets)
    try:
        terms = parse_pattern(pattern)
        check_unknown_prefixes(targets, terms)
    except ConfigError as exc:
        raise ConfigError(f"{option} {pattern!r}: {exc.detail}") from None
    chosen = apply_terms(targets, terms)
    if not chosen:
        raise ConfigError(f"{option} {pattern!r} matched no targets")
    return chosen
