"""Provenance the controller measures, and the CI wheelhouse only (docs/security.md, the wheel cache), in
`wheels` steps run through run_playbook on this machine (local targets, real files, real sh, as
test_wheel_trust_steps.py).

The build below writes demo_ext's wheel with, inside it, the sha256 of the file it was handed as
$FLEETFIX_SOURCE, as sha256sum computed it in the target: so a test can tell which bytes a build used."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetfix.guests.node import NodeGuest
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.target import Target
from fleetfix.transport.local import LocalTransport
from fleetfix.wheels.cache import WheelCache
from fleetfix.wheels.source import SourceRefused, Sources
from tests.unit.playbook.conftest import StandInFleet, playbook_from
from tests.unit.playbook.test_transfer_and_wheel_steps import ListRecorder
from tests.unit.playbook.test_wheel_trust_steps import hosts

BOOK = """\
name: sources
steps:
  - name: wheels installed
    wheels:
      items: "['demo-ext']"
      key:
        python_tag: cp311
        machine: x86_64
      source: "{{ src | default('') }}"
      source_sha256: "{{ pin | default('') }}"
      describe: |
        echo described >> {{ builds }}/log
        echo demo-ext 1.0
      build: |
        echo {{ target.name }} >> {{ builds }}/log
        test -n "${FLEETFIX_SOURCE:-}" && built_from=$(sha256sum "$FLEETFIX_SOURCE" | cut -c1-64) \\
          || built_from=none
        python3 - "$FLEETFIX_WHEEL_DIR" "$built_from" <<'EOF'
        import sys, zipfile
        out, built_from = sys.argv[1:]
        tag = "cp311-cp311-linux_x86_64"
        info = "demo_ext-1.0.dist-info"
        with zipfile.ZipFile(out + "/demo_ext-1.0-" + tag + ".whl", "w") as wheel:
            wheel.writestr("demo_ext/__init__.py", "BUILT_FROM = %r\\n" % built_from)
            elf = b"\\x7fELF\\x02\\x01\\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(44)
            wheel.writestr("demo_ext/_C.cpython-311-x86_64-linux-gnu.so", elf)
            wheel.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: demo-ext\\nVersion: 1.0\\n")
            wheel.writestr(info + "/WHEEL",
                           "Wheel-Version: 1.0\\nRoot-Is-Purelib: false\\nTag: " + tag + "\\n")
        EOF
        echo "sdist sha256 0000 (a builder's word, never recorded)"
      install: cp "$FLEETFIX_WHEEL" {{ site }}/{{ item }}
      verify: test -s {{ site }}/{{ item }}
"""


def sdist(folder: Path, content: bytes, name: str = "demo_ext-1.0.tar.gz") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


def run(tmp_path: Path, targets: list[Target], cache: WheelCache | None,
        recorder: ListRecorder | None = None, *, rebuild: bool = False) -> PlaybookRun:
    book = playbook_from(BOOK, tmp_path)
    fleet = StandInFleet({target.name: LocalTransport(target.name) for target in targets})
    return run_playbook(book, targets,
                        FleetAccess(fleet.map, lambda target, transport: {},
                                    lambda target: NodeGuest(target, LocalTransport(target.name))),
                        RunOptions(wheels=WheelOptions(cache, rebuild=rebuild)), RunHooks(recorder=recorder))


def built_from(target: Target) -> str:
    with zipfile.ZipFile(Path(target.vars["site"]) / "demo-ext") as wheel:
        return wheel.read("demo_ext/__init__.py").decode().split("'")[1]


def log(tmp_path: Path) -> list[str]:
    path = tmp_path / "builds" / "log"
    return path.read_text().split() if path.exists() else []


def test_the_manifest_records_the_sha256_of_the_source_the_controller_handed_the_build(
        tmp_path: Path) -> None:
    source = sdist(tmp_path / "sdists", b"the real source archive\n")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    (host,) = hosts(tmp_path, "t1", src=str(source))
    cache = WheelCache(tmp_path / "cache")
    recorder = ListRecorder()
    result = run(tmp_path, [host], cache, recorder)
    assert result.targets[0].steps[0].status == "changed", result.targets[0].steps[0].reason
    assert built_from(host) == digest  # the build used exactly the controller's bytes
    assert log(tmp_path) == ["t1"]  # describe never ran: NAME VERSION came from the archive's name
    (entry,) = cache.entries()
    manifest = json.loads((entry.directory / "manifest.json").read_text())
    assert manifest["sdist_sha256"] == digest and manifest["sdist"] == str(source)
    assert manifest["key"]["sdist_sha256"] == digest and manifest["key"]["name"] == "demo-ext"
    (event,) = recorder.of("wheel")
    assert event["sdist"] == {"location": str(source), "sha256": digest, "size": source.stat().st_size}
    assert not list((tmp_path / "cache" / ".incoming").iterdir())  # the run's copy is gone


def test_another_source_of_the_same_name_and_version_is_another_key(tmp_path: Path) -> None:
    first = sdist(tmp_path / "a", b"release as published\n")
    second = sdist(tmp_path / "b", b"release with a patch\n")
    one, two = hosts(tmp_path, "one", "two")
    share = frozenset({"one", "two"})
    cache = WheelCache(tmp_path / "cache")
    run(tmp_path, [dataclasses.replace(one, wheel_builders=share, vars={**one.vars, "src": str(first)})],
        cache)
    recorder = ListRecorder()
    run(tmp_path, [dataclasses.replace(two, wheel_builders=share, vars={**two.vars, "src": str(second)})],
        cache, recorder)
    assert [event["action"] for event in recorder.of("wheel")] == ["built"]  # not one's wheel
    assert built_from(two) == hashlib.sha256(second.read_bytes()).hexdigest()
    assert sorted(entry.sdist_sha256 or "" for entry in cache.entries()) == sorted(
        hashlib.sha256(path.read_bytes()).hexdigest() for path in (first, second))


@pytest.mark.parametrize("pin", ["0" * 64, "sha256:" + "F" * 64])
def test_a_pinned_sha256_that_differs_refuses_before_anything_is_built(tmp_path: Path, pin: str) -> None:
    source = sdist(tmp_path / "sdists", b"tampered on the mirror\n")
    (host,) = hosts(tmp_path, "t1", src=f"file://{source}", pin=pin)
    result = run(tmp_path, [host], WheelCache(tmp_path / "cache"))
    step = result.targets[0].steps[0]
    assert step.status == "failed" and "is not the pinned" in step.reason, step.reason
    assert log(tmp_path) == []  # neither describe nor build ran
    assert not (Path(host.vars["site"]) / "demo-ext").exists()


def test_a_wrong_pin_on_one_item_spoils_no_other_items_take_of_the_same_location(tmp_path: Path) -> None:
    source = sdist(tmp_path / "sdists", b"one archive, two items\n")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    sources, cache = Sources(max_bytes=1 << 20), WheelCache(tmp_path / "cache")
    with pytest.raises(SourceRefused, match="is not the pinned"):
        sources.take(str(source), "0" * 64, cache)
    assert sources.take(str(source), "", cache).sha256 == digest
    assert sources.take(str(source), digest, cache).sha256 == digest
    sources.close()


def test_a_pin_that_matches_builds(tmp_path: Path) -> None:
    source = sdist(tmp_path / "sdists", b"as pinned\n")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    (host,) = hosts(tmp_path, "t1", src=str(source), pin=f"sha256:{digest.upper()}")
    result = run(tmp_path, [host], None)  # no cache: still built from the controller's bytes
    assert result.targets[0].steps[0].status == "changed", result.targets[0].steps[0].reason
    assert built_from(host) == digest


@pytest.mark.parametrize(("location", "expected"), [
    ("sdists/demo_ext-1.0.tar.gz", "use an absolute path, a file:// URL or an https:// URL"),
    ("ftp://127.0.0.1/demo_ext-1.0.tar.gz", "use an absolute path, a file:// URL or an https:// URL"),
    ("file://otherhost/srv/demo_ext-1.0.tar.gz", "names a file on this controller, not on otherhost"),
    ("http://127.0.0.1:9/demo_ext-1.0.tar.gz", "refused plain http"),  # refused before connecting
    ("/nonexistent/demo_ext-1.0.tar.gz", "No such file or directory"),
    ("{tmp}/sdists/demo_ext.tar.gz", "is not an sdist's file name"),
    ("{tmp}/sdists", "is not an sdist's file name"),
    ("{tmp}/sdists/demo_ext-1.0.tar.gz/", "is not an sdist's file name"),
])
def test_a_source_the_controller_cannot_take_refuses_the_item(tmp_path: Path, location: str,
                                                              expected: str) -> None:
    sdist(tmp_path / "sdists", b"x")
    (host,) = hosts(tmp_path, "t1", src=location.format(tmp=tmp_path))
    step = run(tmp_path, [host], WheelCache(tmp_path / "cache")).targets[0].steps[0]
    assert step.status == "failed" and "source refused" in step.reason and expected in step.reason, \
        step.reason
    assert log(tmp_path) == []


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A plain-http server on loopback over tmp_path/served: (its base URL, the paths asked for)."""
    root, asked = tmp_path / "served", []
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_source_is_taken_once_per_run_and_a_lock_pin_authenticates_plain_http(
        tmp_path: Path, served: tuple[str, list[str]]) -> None:
    base, asked = served
    content = b"sdist bytes on a mirror\n"
    (tmp_path / "served" / "demo_ext-1.0.tar.gz").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    url = f"{base}/demo_ext-1.0.tar.gz"
    cache = WheelCache(tmp_path / "cache")
    pins = {url: (digest, "wheels.lock:4")}
    sources = Sources(max_bytes=1 << 20, lock_pin=pins.get)
    first, again = sources.take(url, "", cache), sources.take(url, "", cache)
    assert first is again and (first.sha256, first.name, first.version) == (digest, "demo-ext", "1.0")
    assert first.path.read_bytes() == content and asked == ["/demo_ext-1.0.tar.gz"]
    sources.close()
    assert not first.path.exists()
    # The lock pins another digest: refused (and removed) as it arrives.
    wrong = Sources(max_bytes=1 << 20, lock_pin={url: ("0" * 64, "wheels.lock:4")}.get)
    with pytest.raises(SourceRefused, match=r"wheels\.lock:4"):
        wrong.take(url, "", cache)
    # Not pinned anywhere: plain http is refused before a request is made (https only).
    with pytest.raises(SourceRefused, match="refused plain http"):
        Sources(max_bytes=1 << 20).take(url, "", cache)
    assert len(asked) == 2
    assert not [path for path in (tmp_path / "cache" / ".incoming").rglob("*") if path.is_file()]


# -- the CI wheelhouse only (inventory `wheels: build: never`) ----------------------------------------------

def test_build_never_installs_a_wheelhouse_entry_and_builds_nothing(tmp_path: Path) -> None:
    ci, host = hosts(tmp_path, "ci", "t1")
    house = WheelCache(tmp_path / "ci-wheelhouse")
    run(tmp_path, [ci], house)  # the CI's run fills its wheelhouse
    recorder = ListRecorder()
    result = run(tmp_path, [dataclasses.replace(host, wheel_build=False)],
                 WheelCache(tmp_path / "cache", wheelhouses=[house.root]), recorder)
    assert result.targets[0].steps[0].status == "changed", result.targets[0].steps[0].reason
    assert log(tmp_path) == ["described", "ci", "described"]  # t1 described its item, and built nothing
    assert [event["action"] for event in recorder.of("wheel")] == ["installed-from-cache"]


def test_build_never_refuses_a_key_with_no_wheel_before_changing_anything(tmp_path: Path) -> None:
    (host,) = hosts(tmp_path, "t1")
    cache = WheelCache(tmp_path / "cache")
    run(tmp_path, [host], cache)  # its own build, from before the inventory said never
    Path(host.vars["site"], "demo-ext").unlink()
    recorder = ListRecorder()
    result = run(tmp_path, [dataclasses.replace(host, wheel_build=False)], cache, recorder)
    step = result.targets[0].steps[0]
    assert step.status == "failed", step.reason
    assert "and the inventory says wheels: build: never (the CI wheelhouse only); nothing changed: " \
           "build it in CI for this key" in step.reason and "--wheelhouse DIR (demo-ext-1.0-*)" in step.reason
    assert "\n" not in step.reason
    assert log(tmp_path) == ["described", "t1", "described"]  # the earlier build only
    assert not (Path(host.vars["site"]) / "demo-ext").exists()  # its own old entry is not used either
    (event,) = recorder.of("wheel")
    assert event["action"] == "refused-no-build"


def test_build_never_and_rebuild_refuse(tmp_path: Path) -> None:
    (host,) = hosts(tmp_path, "t1")
    result = run(tmp_path, [dataclasses.replace(host, wheel_build=False)], WheelCache(tmp_path / "cache"),
                 rebuild=True)
    step = result.targets[0].steps[0]
    assert step.status == "failed" and step.reason.startswith(
        "demo-ext: --rebuild asks for a build, and the inventory says wheels: build: never"), step.reason
    assert log(tmp_path) == ["described"]
