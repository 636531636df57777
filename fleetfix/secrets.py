"""Secrets in what fleetfix prints and records: masked by variable name, and by value wherever they appear.

A var whose name looks secret (*password*, *passwd*, *secret*, *token*) is masked in recorded vars
(`mask_vars`), and its value (4 characters or more), as typed and as shell-quoted, is replaced by the mask
in scripts, output and records (`Redactor`).
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "********"
SECRET_NAME = re.compile(r"password|passwd|secret|token", re.IGNORECASE)
_MIN_SECRET_LEN = 4  # masking shorter values would mangle unrelated output


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def mask_vars(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of values with every secret-named entry (at any depth) masked."""
    masked: dict[str, Any] = {}
    for name, value in values.items():
        if is_secret_name(str(name)):
            masked[str(name)] = MASK
        elif isinstance(value, Mapping):
            masked[str(name)] = mask_vars(value)
        else:
            masked[str(name)] = value
    return masked


def secret_values(values: Mapping[str, Any]) -> list[str]:
    """The values of secret-named vars (at any depth), as text, for redaction."""
    found: list[str] = []
    for name, value in values.items():
        if is_secret_name(str(name)) and value is not None and not isinstance(value, Mapping):
            found.append(str(value))
        elif isinstance(value, Mapping):
            found.extend(secret_values(value))
    return found


class Redactor:
    """Masks secret values (and their shell-quoted form) in text and nested data. Thread-safe: the
    secrets of each target's vars are added as targets are planned, while others already run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            found = set(self._secrets)
            for value in values:
                if len(value) >= _MIN_SECRET_LEN:
                    found.add(value)
                    found.add(shlex.quote(value))  # the form it takes in a rendered script
            self._secrets = tuple(sorted(found, key=len, reverse=True))  # longest first: no partial masks

    def text(self, value: str) -> str:
        for secret in self._secrets:
            value = value.replace(secret, MASK)
        return value

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {key: self(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self(item) for item in value]
        return value
