"""A wheels step whose item names upstream's release wheel, through run_playbook on this machine (local
targets, real files, real sh) with a loopback HTTPS stand-in for GitHub's release downloads and its REST API
(each asset's sha256 `digest`): the wheel whose label matches the key, and whose bytes match its digest, is
downloaded once, installed and cached; anything else is built."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetfix.guests.node import NodeGuest
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.target import Target
from fleetfix.transport.local import LocalTransport
from fleetfix.wheels.cache import WheelCache
from fleetfix.wheels.httpfetch import Fetcher
from fleetfix.wheels.release import ReleaseDigests
from tests.lab.releases import ReleaseServer, github_api, make_wheel, refused_port
from tests.lab.tlsca import TestCA
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from
from tests.unit.playbook.test_transfer_and_wheel_steps import ListRecorder

TAG = "cp312-cp312-linux_x86_64"
RELEASE = ("/Dao-AILab/causal-conv1d/releases/download/v{version}/causal_conv1d-{version}"
           "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl")
ELF_X86_64 = b"\x7fELF\x02\x01\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(44)
# What the stand-in serves for torch 2.8 (the key of t1 and t2); torch 2.9 (t3) has no release wheel.
SERVED = ("/Dao-AILab/causal-conv1d/releases/download/v1.6.1/"
          "causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl")

# install: unpacks the wheel into the target's site dir; verify: imports it from there (the import check),
# and a wheel carrying BROKEN fails it, as an upstream wheel built against a newer glibc would.
BOOK = """\
name: upstream
steps:
  - name: wheels installed
    wheels:
      items: "['causal-conv1d']"
      key:
        python_tag: cp312
        torch: "{{ torch }}"
        torch_cuda: "12.8"
        cxx11_abi: "1"
        machine: x86_64
      upstream: "{{ release }}"
      describe: echo causal_conv1d 1.6.1
      build: |
        python3 - "$FLEETFIX_WHEEL_DIR" <<'EOF'
        import sys, zipfile
        tag, info = "cp312-cp312-linux_x86_64", "causal_conv1d-1.6.1.dist-info"
        with zipfile.ZipFile(sys.argv[1] + "/causal_conv1d-1.6.1-" + tag + ".whl", "w") as z:
            z.writestr("causal_conv1d/__init__.py", "ORIGIN = 'built'\\n")
            so = b"\\x7fELF\\x02\\x01\\x01" + bytes(11) + b"\\x3e\\x00" + bytes(44)
            z.writestr("causal_conv1d_cuda.so", so)
            z.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: causal-conv1d\\nVersion: 1.6.1\\n")
            z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: false\\nTag: " + tag + "\\n")
        EOF
        echo {{ target.name }} >> {{ builds }}/log
      install: rm -rf {{ site }}/causal_conv1d && python3 -m zipfile -e "$FLEETFIX_WHEEL" {{ site }}
      verify: |
        PYTHONPATH={{ site }} python3 -c 'import causal_conv1d' && test ! -e {{ site }}/causal_conv1d/BROKEN
"""


pytestmark = pytest.mark.usefixtures("trusted_ca")


def release_server(files: dict[str, bytes], test_ca: TestCA, **api: Any) -> ReleaseServer:
    """The stand-in serving files over https, and GitHub's API describing them (with their digests)."""
    return ReleaseServer({**files, **github_api(files, **api)}, tls=test_ca)


def fetcher() -> Fetcher:
    """The run's fetcher as `fleetfix apply` makes it without a wheel lock: digests from GitHub's API."""
    return Fetcher(timeout=5, authenticator=ReleaseDigests())


def served_wheel(origin: str = "upstream", *, broken: bool = False, version: str = "1.6.1") -> bytes:
    # A compiled extension, as upstream's are (the cache keeps nothing else): an x86_64 ELF header stands
    # in for the module.
    files: dict[str, str | bytes] = {"causal_conv1d/__init__.py": f"ORIGIN = {origin!r}\n",
                                     "causal_conv1d_cuda.so": ELF_X86_64}
    if broken:
        files["causal_conv1d/BROKEN"] = ""
    return make_wheel("causal_conv1d", version, TAG, files)


def targets(tmp_path: Path, release: str, *torches: str) -> list[Target]:
    (tmp_path / "builds").mkdir(exist_ok=True)
    made = []
    for index, torch in enumerate(torches, 1):
        site = tmp_path / "sites" / f"t{index}"
        site.mkdir(parents=True)
        made.append(make_target(f"t{index}", None, site=str(site), torch=torch, release=release,
                                builds=str(tmp_path / "builds")))
    return made


def run(tmp_path: Path, hosts: list[Target], cache: WheelCache, *, fetcher: Fetcher | None,
        rebuild: bool = False, recorder: ListRecorder | None = None) -> PlaybookRun:
    book = playbook_from(BOOK, tmp_path)
    fleet = StandInFleet({target.name: LocalTransport(target.name) for target in hosts})
    return run_playbook(
        book, hosts,
        FleetAccess(fleet.map, lambda target, transport: {},
                    lambda target: NodeGuest(target, LocalTransport(target.name))),
        RunOptions(wheels=WheelOptions(cache, rebuild=rebuild, upstream=fetcher)),
        RunHooks(recorder=recorder))


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds" / "log"
    return sorted(log.read_text().split()) if log.exists() else []


def origin(target: Target) -> str:
    text = (Path(target.vars["site"]) / "causal_conv1d" / "__init__.py").read_text()
    return text.split("'")[1]


def reasons(result: PlaybookRun) -> dict[str, str]:
    return {target.target: target.steps[0].reason for target in result.targets}


def statuses(result: PlaybookRun) -> dict[str, str]:
    return {target.target: target.steps[0].status for target in result.targets}


def test_the_matching_release_wheel_is_used_and_the_other_key_builds(tmp_path: Path,
                                                                     test_ca: TestCA) -> None:
    wheel = served_wheel()
    with release_server({SERVED: wheel}, test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128", "2.8.0+cu128", "2.9.1+cu128")
        cache, recorder = WheelCache(tmp_path / "cache"), ListRecorder()
        result = run(tmp_path, hosts, cache, fetcher=fetcher(), recorder=recorder)
        assert statuses(result) == {"t1": "changed", "t2": "changed", "t3": "changed"}, reasons(result)
        # Downloaded once for the key (the second target of the key got it from the cache); the release's
        # assets, asked of the API once, have none for the other key, so its wheel is not even asked for.
        assert server.requests[SERVED] == 1
        assert not [path for path in server.requests if "torch2.9" in path]
        assert server.requests["/api/v3/repos/Dao-AILab/causal-conv1d/releases/tags/v1.6.1"] == 1
    assert builds(tmp_path) == ["t3"]
    assert [origin(host) for host in hosts] == ["upstream", "upstream", "built"]
    actions = {event["target"]: event for event in recorder.of("wheel")}
    assert sorted(event["action"] for event in actions.values()) == [
        "built", "installed-from-cache", "installed-from-upstream"]
    fetched = next(event for event in actions.values() if event["action"] == "installed-from-upstream")
    assert fetched["url"] == server.url + SERVED
    assert fetched["sha256"] == hashlib.sha256(wheel).hexdigest()  # and the API's digest is this one
    missing = "/releases/tags/v1.6.1 has no asset causal_conv1d-1.6.1+cu12torch2.9"
    assert missing in actions["t3"]["upstream"]
    assert "(upstream: no sha256 to check causal_conv1d-1.6.1+cu12torch2.9" in reasons(result)["t3"]
    assert "installed upstream's release wheel causal_conv1d-1.6.1+cu12torch2.8" in (
        reasons(result)["t1"] + reasons(result)["t2"])

    # The cache keeps it like a built wheel, under the plain name pip accepts, with its origin and sha256.
    (entry,) = [entry for entry in cache.entries() if entry.key["torch"] == "2.8.0+cu128"]
    assert entry.source == server.url + SERVED and entry.built_on == "upstream"
    assert entry.sha256 == hashlib.sha256(wheel).hexdigest()
    assert entry.wheel == f"causal_conv1d-1.6.1-{TAG}.whl"
    assert cache.verify() == [(e, None) for e in cache.entries()]
    assert not list((cache.root / ".incoming").iterdir())

    # Idempotent: everything verifies, nothing is asked for.
    with release_server({SERVED: wheel}, test_ca) as again_server:
        for host in hosts:
            host.vars["release"] = again_server.url + RELEASE
        again = run(tmp_path, hosts, cache, fetcher=fetcher())
        assert set(statuses(again).values()) == {"ok"} and not again_server.requests


def test_rebuild_and_no_fetcher_never_ask_upstream(tmp_path: Path, test_ca: TestCA) -> None:
    with release_server({SERVED: served_wheel()}, test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128")
        cache = WheelCache(tmp_path / "cache")
        first = run(tmp_path, hosts, cache, fetcher=None)
        assert statuses(first) == {"t1": "changed"} and builds(tmp_path) == ["t1"]
        shutil.rmtree(Path(hosts[0].vars["site"]) / "causal_conv1d")  # the target lost it
        rebuilt = run(tmp_path, hosts, cache, fetcher=fetcher(), rebuild=True)
        assert statuses(rebuilt) == {"t1": "changed"} and builds(tmp_path) == ["t1", "t1"]
        assert not server.requests
    assert origin(hosts[0]) == "built"


def test_an_unreachable_upstream_falls_back_to_the_build(tmp_path: Path) -> None:
    with refused_port() as port:
        hosts = targets(tmp_path, f"https://127.0.0.1:{port}" + RELEASE, "2.8.0+cu128")
        cache, recorder = WheelCache(tmp_path / "cache"), ListRecorder()
        result = run(tmp_path, hosts, cache, fetcher=fetcher(), recorder=recorder)
    assert statuses(result) == {"t1": "changed"} and builds(tmp_path) == ["t1"]
    (event,) = recorder.of("wheel")
    assert event["action"] == "built" and "refused" in event["upstream"].lower()
    assert [entry.source for entry in cache.entries()] == ["build"]


def test_a_release_wheel_that_fails_its_import_check_is_not_cached(tmp_path: Path, test_ca: TestCA) -> None:
    with release_server({SERVED: served_wheel(broken=True)}, test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128", "2.8.0+cu128")
        cache, recorder = WheelCache(tmp_path / "cache"), ListRecorder()
        result = run(tmp_path, hosts, cache, fetcher=fetcher(), recorder=recorder)
        assert statuses(result) == {"t1": "changed", "t2": "changed"}, reasons(result)
        assert server.requests[SERVED] == 1  # refused once, never asked for again in the run
    # Each builds its own: neither trusts the other's build (the default, test_wheel_trust_steps.py).
    assert builds(tmp_path) == ["t1", "t2"]
    assert [origin(host) for host in hosts] == ["built", "built"]
    assert [entry.source for entry in cache.entries()] == ["build", "build"]
    built = next(event for event in recorder.of("wheel") if event["action"] == "built")
    assert "upstream's release wheel installed but verify failed" in built["upstream"]


def test_a_release_wheel_whose_metadata_is_not_the_key_is_refused(tmp_path: Path, test_ca: TestCA) -> None:
    with release_server({SERVED: served_wheel(version="1.6.0")}, test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128")
        cache = WheelCache(tmp_path / "cache")
        result = run(tmp_path, hosts, cache, fetcher=fetcher())
        assert server.requests[SERVED] == 1
    assert builds(tmp_path) == ["t1"] and origin(hosts[0]) == "built"
    assert "its metadata says causal-conv1d 1.6.0, not causal-conv1d 1.6.1" in reasons(result)["t1"]


def test_a_template_naming_another_label_is_never_fetched(tmp_path: Path, test_ca: TestCA) -> None:
    # A catalog entry that hard-codes cu13 for a cu12 key: the name differs from the key, so it is not
    # even asked for, although the stand-in would serve it.
    cu13 = SERVED.replace("+cu12", "+cu13")
    with release_server({cu13: served_wheel()}, test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE.replace("cu{cuda_major}", "cu13"), "2.8.0+cu128")
        result = run(tmp_path, hosts, WheelCache(tmp_path / "cache"), fetcher=fetcher())
        assert not server.requests
    assert builds(tmp_path) == ["t1"]
    assert "cuda_major 13 (the key's: 12)" in reasons(result)["t1"]



def test_a_release_wheel_without_a_digest_is_built_instead(tmp_path: Path, test_ca: TestCA) -> None:
    # GitHub computes digests for assets uploaded since 2025-06; an older asset has "digest": null. Nobody
    # vouches for its bytes: it is not even downloaded, and the target builds.
    with release_server({SERVED: served_wheel()}, test_ca, without_digest=[SERVED]) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128")
        cache, recorder = WheelCache(tmp_path / "cache"), ListRecorder()
        result = run(tmp_path, hosts, cache, fetcher=fetcher(), recorder=recorder)
        assert server.requests[SERVED] == 0
    assert statuses(result) == {"t1": "changed"} and builds(tmp_path) == ["t1"]
    assert origin(hosts[0]) == "built"
    (event,) = recorder.of("wheel")
    assert event["action"] == "built" and "has no sha256 digest" in event["upstream"], event
    assert "--allow-unverified-wheels" in reasons(result)["t1"]
    assert [entry.source for entry in cache.entries()] == ["build"]


def test_a_release_wheel_whose_bytes_differ_from_its_digest_is_built_instead(tmp_path: Path,
                                                                             test_ca: TestCA) -> None:
    # The API describes the wheel upstream published; the server (a mirror, the object store) sends another
    # of the same size. Refused on the controller before it reaches a target or the cache.
    published = served_wheel("upstream")
    # Another origin of the same length whose wheel also deflates to the same size.
    swapped = next(wheel for origin in ("upStream", "Upstream", "upstreaM", "UPSTREAM", "uPstream")
                   if len(wheel := served_wheel(origin)) == len(published))
    assert published != swapped
    with ReleaseServer({SERVED: swapped, **github_api({SERVED: published})}, tls=test_ca) as server:
        hosts = targets(tmp_path, server.url + RELEASE, "2.8.0+cu128")
        cache = WheelCache(tmp_path / "cache")
        result = run(tmp_path, hosts, cache, fetcher=fetcher())
        assert server.requests[SERVED] == 1
    assert builds(tmp_path) == ["t1"] and origin(hosts[0]) == "built"
    assert f"is not {hashlib.sha256(published).hexdigest()} (the digest at " in reasons(result)["t1"]
    assert [entry.source for entry in cache.entries()] == ["build"]
    assert not list((cache.root / ".incoming").iterdir())
