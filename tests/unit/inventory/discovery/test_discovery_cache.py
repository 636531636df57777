"""The discovery cache: fresh entries are used, stale, foreign or corrupt ones are not, refresh bypasses."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

from pvefakes import api_source, ct

from fleetfix.inventory.discovery.discoverer import Discoverer, cache_path
from fleetfix.inventory.discovery.model import ApiAccess, Listing, ProxmoxSource, listing_from_records


class CountingFetch:
    def __init__(self, *records: dict[str, object]) -> None:
        self.records = list(records)
        self.calls = 0

    def __call__(self, source: ProxmoxSource) -> Listing:
        self.calls += 1
        found = listing_from_records(self.records)
        return Listing(found.guests, node_addresses={"pve1": "127.0.0.11"})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_fresh_cache_is_used_and_stale_cache_refetched(tmp_path: Path) -> None:
    fetch, clock = CountingFetch(ct(200, "a"), ct(201, "b", status="stopped")), Clock()
    discoverer = Discoverer(state_dir=tmp_path, fetch=fetch, now=clock)
    source = api_source(cache_ttl=300)
    first = discoverer.discover(source)
    clock.now += 299
    second = discoverer.discover(source)
    assert fetch.calls == 1 and not first.from_cache and second.from_cache
    assert [t.name for t in second.targets] == [t.name for t in first.targets] == ["a"]
    assert second.skipped == first.skipped and second.targets[0].node.ssh == first.targets[0].node.ssh
    clock.now += 2
    assert not discoverer.discover(source).from_cache and fetch.calls == 2


def test_cache_file_is_private_and_holds_no_secret(tmp_path: Path, secret_env: str) -> None:
    Discoverer(state_dir=tmp_path, fetch=CountingFetch(ct(200, "a"))).discover(api_source(cache_ttl=60))
    path = cache_path(tmp_path, api_source())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_env not in path.read_text()
    assert json.loads(path.read_text())["guests"][0]["vmid"] == 200


def test_refresh_bypasses_the_cache(tmp_path: Path) -> None:
    fetch = CountingFetch(ct(200, "a"))
    Discoverer(state_dir=tmp_path, fetch=fetch).discover(api_source(cache_ttl=300))
    Discoverer(state_dir=tmp_path, fetch=fetch, refresh=True).discover(api_source(cache_ttl=300))
    assert fetch.calls == 2


def test_no_ttl_means_no_cache_file(tmp_path: Path) -> None:
    fetch = CountingFetch(ct(200, "a"))
    discoverer = Discoverer(state_dir=tmp_path, fetch=fetch)
    discoverer.discover(api_source())
    discoverer.discover(api_source())
    assert fetch.calls == 2 and not (tmp_path / "discovery").exists()


def test_a_cache_for_another_endpoint_or_token_is_ignored(tmp_path: Path) -> None:
    fetch = CountingFetch(ct(200, "a"))
    discoverer = Discoverer(state_dir=tmp_path, fetch=fetch)
    source = api_source(cache_ttl=300)
    discoverer.discover(source)
    assert source.api is not None
    moved: ApiAccess = replace(source.api, token_id="other@pve!audit")
    assert not discoverer.discover(replace(source, api=moved)).from_cache
    assert fetch.calls == 2


def test_filter_changes_apply_to_a_cached_listing(tmp_path: Path) -> None:
    from fleetfix.inventory.discovery.model import GuestFilter

    fetch = CountingFetch(ct(200, "a", tags="gpu"), ct(201, "b"))
    discoverer = Discoverer(state_dir=tmp_path, fetch=fetch)
    discoverer.discover(api_source(cache_ttl=300))
    narrowed = discoverer.discover(api_source(cache_ttl=300, flt=GuestFilter(tags=("gpu",))))
    assert narrowed.from_cache and [t.name for t in narrowed.targets] == ["a"]


def test_corrupt_cache_is_a_miss_not_an_error(tmp_path: Path) -> None:
    fetch = CountingFetch(ct(200, "a"))
    path = cache_path(tmp_path, api_source())
    path.parent.mkdir(parents=True)
    for junk in (
        "{not json",
        "[]",
        json.dumps({"version": 1, "fingerprint": api_source().fingerprint(), "fetched_at": "yesterday"}),
    ):
        path.write_text(junk)
        assert not Discoverer(state_dir=tmp_path, fetch=fetch).discover(api_source(cache_ttl=300)).from_cache
