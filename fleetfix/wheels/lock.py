"""The fleet's wheel lock: the sha256 of each upstream release wheel an operator allows, in a YAML file they
commit next to their inventory (docs/extensions.md, "The wheel lock").

    # fleetfix wheel lock
    wheels:
      causal-conv1d:
        https://github.com/Dao-AILab/.../causal_conv1d-1.6.1+cu12torch2.8...whl: sha256:4f1c...

Distribution name → URL → sha256 (`sha256:<hex>` as GitHub's API writes it, or the bare hex `sha256sum`
prints). A URL is a release wheel's (.whl) or a source archive's (an sdist, .tar.gz or .zip, that a
`wheels` item names as its `source:`, fleetfix.wheels.source). A pinned digest authenticates the file
whatever carries it, so a URL here may be a plain-http mirror. Every mistake is one line naming file, line
and field: a name that is not the URL's file's distribution, a URL that is not a file over http(s), a
digest that is not 64 hex digits, a URL twice.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetfix.wheels.cache import canonical_name
from fleetfix.wheels.source import sdist_name_version
from fleetfix.yamlsource import Locations, load_yaml

_DIGEST = re.compile(r"^(?:sha256:)?([0-9a-fA-F]{64})$")
_DIST = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.]*)-")


@dataclass(frozen=True)
class Pin:
    sha256: str  # lower-case hex
    where: str  # "wheels.lock:12"


class WheelLock:
    def __init__(self, path: str, pins: dict[str, Pin]) -> None:
        self.path = path
        self._pins = pins

    def pin(self, url: str) -> Pin | None:
        return self._pins.get(url)

    def __len__(self) -> int:
        return len(self._pins)


def load_wheel_lock(path: str | Path) -> WheelLock:
    """The lock at path, every entry checked; ConfigError (exit 2) naming file:line: field otherwise."""
    data, where = load_yaml(path)
    if not isinstance(data, dict) or set(data) != {"wheels"}:
        raise where.error((), "a wheel lock is a mapping with one key, wheels: {name: {url: sha256}}")
    wheels = data["wheels"]
    if wheels is None:
        return WheelLock(str(path), {})
    if not isinstance(wheels, dict):
        raise where.error(("wheels",), "expected a mapping of distribution name to {url: sha256}")
    pins: dict[str, Pin] = {}
    for name, urls in wheels.items():
        if not isinstance(urls, dict):
            raise where.error(("wheels", name), "expected a mapping of URL to sha256")
        for url, digest in urls.items():
            loc = ("wheels", name, url)
            sha256 = _digest(digest, where, loc)
            _check_url(str(name), url, where, loc)
            if url in pins:
                raise where.error(loc, f"this URL is pinned already, at {pins[url].where}")
            pins[url] = Pin(sha256, f"{where.path}:{where.line(loc)}")
    return WheelLock(str(path), pins)


def _digest(value: Any, where: Locations, loc: tuple[str, ...]) -> str:
    found = _DIGEST.match(value) if isinstance(value, str) else None
    if found is None:
        raise where.error(loc, f"expected sha256:<64 hex digits>, got {str(value)[:80]!r}")
    return found[1].lower()


def _check_url(name: str, url: Any, where: Locations, loc: tuple[str, ...]) -> None:
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    except ValueError:  # a malformed host, e.g. an unclosed [
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname \
            or parts.query or parts.fragment or not parts.path.endswith((".whl", ".tar.gz", ".zip")):
        raise where.error(loc, "expected the http(s) URL of a .whl file or an sdist (.tar.gz, .zip)")
    filename = urllib.parse.unquote(parts.path.rpartition("/")[2])
    if filename.endswith(".whl"):
        dist = _DIST.match(filename)
        found = canonical_name(dist[1]) if dist else filename
    else:
        names = sdist_name_version(filename)
        found = names[0] if isinstance(names, tuple) else filename
    if found != canonical_name(name):
        raise where.error(loc, f"the file is {found}'s, not {canonical_name(name)}'s")
