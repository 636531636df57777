"""Discovering a Proxmox source: from the cache when it is fresh, else from the source itself (API or
pvesh, in `clients`), then mapped to targets (`model.targets_from_listing`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from fleetfix import boundedjson
from fleetfix.errors import DiscoveryError
from fleetfix.inventory.discovery.model import (
    CACHE_VERSION,
    DiscoveryResult,
    Listing,
    ProxmoxSource,
    listing_from_records,
    targets_from_listing,
)
from fleetfix.paths import default_state_dir, private_dir

# --- the cache -------------------------------------------------------------------------------------------


def cache_path(state_dir: Path, source: ProxmoxSource) -> Path:
    return state_dir / "discovery" / f"{source.name}.json"


def read_cache(path: Path, source: ProxmoxSource, *, now: float) -> Listing | None:
    """The cached listing if it is for this endpoint and younger than the TTL; anything odd is a miss."""
    try:
        data = boundedjson.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return None
    if data.get("fingerprint") != source.fingerprint():
        return None
    fetched_at = data.get("fetched_at")
    if not isinstance(fetched_at, int | float) or not 0 <= now - fetched_at < source.cache_ttl:
        return None
    addresses = data.get("node_addresses")
    if not isinstance(addresses, dict) or not all(isinstance(v, str) for v in addresses.values()):
        return None
    try:
        listing = listing_from_records(data.get("guests"))
    except DiscoveryError:
        return None
    return replace(listing, node_addresses=addresses, fetched_at=float(fetched_at))


def write_cache(path: Path, source: ProxmoxSource, listing: Listing) -> None:
    """Best effort: a cache that cannot be written only costs the next run an API call."""
    data = {
        "version": CACHE_VERSION,
        "fingerprint": source.fingerprint(),
        "fetched_at": listing.fetched_at,
        "node_addresses": dict(listing.node_addresses),
        "guests": [
            {"kind": guest.kind, "vmid": guest.vmid, "node": guest.node, "name": guest.name,
             "status": guest.status, "tags": list(guest.tags), "template": int(guest.template)}
            for guest in listing.guests
        ],
    }
    try:
        private_dir(path.parent)  # and the state dir above it, when this creates it: 0700 whatever the umask
        temporary = path.with_suffix(".tmp")
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            json.dump(data, out)
        os.replace(temporary, path)
    except OSError:
        pass


# --- orchestration ---------------------------------------------------------------------------------------

# Fetches a source's listing. The default is discovery.clients.fetch_listing; tests pass fakes.
Fetcher = Callable[[ProxmoxSource], Listing]


@dataclass
class Discoverer:
    """Discovers sources: from the cache when fresh (and not `refresh`), else from the source.

    Call it with a ProxmoxSource; `fleetfix.inventory.load_inventory(path, discover=...)` does that for
    every `proxmox:` entry."""

    refresh: bool = False  # ignore the cache (it is still written)
    state_dir: Path | None = None  # None: fleetfix's state dir ($FLEETFIX_STATE_DIR, ~/.local/state/...)
    fetch: Fetcher | None = None
    now: Callable[[], float] = time.time

    def __call__(self, source: ProxmoxSource) -> DiscoveryResult:
        return self.discover(source)

    def discover(self, source: ProxmoxSource) -> DiscoveryResult:
        path = cache_path(self._state_dir(), source) if source.cache_ttl > 0 else None
        listing = None
        if path is not None and not self.refresh:
            listing = read_cache(path, source, now=self.now())
        from_cache = listing is not None
        if listing is None:
            listing = replace(self._fetch(source), fetched_at=self.now())
            if path is not None:
                write_cache(path, source, listing)
        result = targets_from_listing(source, listing)
        result.from_cache = from_cache
        result.warnings[:0] = _source_warnings(source, listing)
        return result

    def discover_all(self, sources: Iterable[ProxmoxSource]) -> list[DiscoveryResult]:
        return [self.discover(source) for source in sources]

    def _fetch(self, source: ProxmoxSource) -> Listing:
        if self.fetch is not None:
            return self.fetch(source)
        # Deferred: requests and proxmoxer are slow to import, and unused without proxmox sources.
        from fleetfix.inventory.discovery.clients import fetch_listing

        return fetch_listing(source)

    def _state_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else default_state_dir()


def _source_warnings(source: ProxmoxSource, listing: Listing) -> list[str]:
    warnings = []
    if source.api is not None and not source.api.verify_tls:
        warnings.append(f"{source.label}: TLS verification is OFF (verify_tls: false): anyone on the path "
                        "to the API can impersonate it and read the token")
    if source.api is not None:
        mode = source.api.secret.loose_permissions()
        if mode is not None:
            warnings.append(f"{source.label}: token_secret_file {source.api.secret.file} is readable by "
                            f"group or others (mode {mode:04o}); chmod 600 it")
    if not listing.guests and source.api is not None:
        warnings.append(f"{source.label}: the token sees no guests (a privilege-separated token needs "
                        "its own permissions, e.g. the PVEAuditor role on /)")
    return warnings


def discover(
    source: ProxmoxSource, *, refresh: bool = False, state_dir: Path | None = None,
) -> DiscoveryResult:
    """Discover one source with the real clients (and the cache when the source enables it)."""
    return Discoverer(refresh=refresh, state_dir=state_dir).discover(source)
