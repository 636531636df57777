"""Secrets: where they come from, and masking them in what fleetfix prints and records.

Where they come from (the secret channel): a reference, `@env:NAME` (an environment variable) or
`@file:PATH` (a file's content, one trailing newline dropped), resolved when a command runs
(`resolve_reference`), so only the reference is ever written down (a unit file, a crontab, an inventory).
A file holding secrets is refused when its group or others may access it, as OpenSSH refuses such a
private key (`check_private_file`).

Masking: a var whose name looks secret (*password*, *passwd*, *secret*, *token*), and any var whose value
came through the secret channel whatever its name, is masked in recorded vars (`mask_vars`), and its value
(4 characters or more), as typed and as shell-quoted, is replaced by the mask in scripts, output, records
and error messages (`Redactor`).
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from fleetfix.errors import ConfigError

MASK = "********"
ENV_PREFIX, FILE_PREFIX = "@env:", "@file:"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SECRET_FILE = 64 * 1024
SECRET_NAME = re.compile(r"password|passwd|secret|token", re.IGNORECASE)
_MIN_SECRET_LEN = 4  # masking shorter values would mangle unrelated output


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def is_reference(value: object) -> bool:
    return isinstance(value, str) and value.startswith((ENV_PREFIX, FILE_PREFIX))


def check_private_file(path: str, what: str) -> None:
    """Refuse a secrets file that its group or others may access (mode & 077), as OpenSSH refuses such a
    private key (authfile.c, sshkey_perm_ok), with the same remedy."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # reading it says what is wrong
    if mode & 0o077:
        raise ConfigError(f"{what} {path}: permissions 0{mode & 0o777:03o} are too open: it holds secrets, "
                          "so it must not be accessible by others (chmod 600)")


def resolve_reference(reference: str, what: str = "secret") -> str:
    """The value an `@env:NAME` or `@file:PATH` reference stands for; ConfigError naming the reference
    (never a value) when it cannot be resolved."""
    if reference.startswith(ENV_PREFIX):
        name = reference[len(ENV_PREFIX):]
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{what} {reference!r}: expected @env:NAME with NAME an environment variable")
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"{what} {reference}: ${name} is not set")
        return value
    if reference.startswith(FILE_PREFIX):
        path = os.path.expanduser(reference[len(FILE_PREFIX):])
        if not path:
            raise ConfigError(f"{what} {reference!r}: expected @file:PATH")
        check_private_file(path, f"{what} {reference}:")
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_SECRET_FILE + 1)
        except OSError as error:
            raise ConfigError(f"{what} {reference}: cannot read: {error.strerror or error}") from None
        if len(data) > MAX_SECRET_FILE:
            raise ConfigError(f"{what} {reference}: over {MAX_SECRET_FILE // 1024} KiB: not a secret")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{what} {reference}: not UTF-8 text") from None
        return text[:-1] if text.endswith("\n") else text
    raise ConfigError(f"{what}: expected a reference, @env:NAME or @file:PATH (never the value itself)")


def load_var_file(path: str) -> dict[str, Any]:
    """`--var-file`: a YAML (or JSON, which is YAML) mapping of vars, from a file only its owner may read,
    within the YAML loader's budgets; ConfigError naming the file and line, never a value."""
    from fleetfix.yamlsource import load_yaml  # deferred: yaml is not needed to mask

    check_private_file(os.path.expanduser(path), "--var-file")
    data, where = load_yaml(os.path.expanduser(path))
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of var names to values", path=path)
    for name, value in data.items():
        if not isinstance(name, str) or not _VAR_NAME.fullmatch(name):
            raise where.error((str(name),), "expected a var name: letters, digits and '_'")
        if not _json_shaped(value):
            raise where.error((name,), "expected a string, number, boolean, null, list or mapping")
    return dict(data)


_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _json_shaped(value: Any) -> bool:
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if isinstance(value, list):
        return all(_json_shaped(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_shaped(item) for key, item in value.items())
    return False


def mask_vars(values: Mapping[str, Any], secrets: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of values with every secret-named entry (at any depth), and every entry whose value is one
    of `secrets` (values from the secret channel), masked."""
    known = {secret for secret in secrets if len(secret) >= _MIN_SECRET_LEN}
    masked: dict[str, Any] = {}
    for name, value in values.items():
        if is_secret_name(str(name)) or (isinstance(value, str) and value in known):
            masked[str(name)] = MASK
        elif isinstance(value, Mapping):
            masked[str(name)] = mask_vars(value, known)
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
