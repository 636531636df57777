"""copy / fetch / wheels steps through run_playbook, on this machine: each target is a "node" whose guest is
NodeGuest over LocalTransport (real files, the real guest-side scripts, real sh), so only SSH and pct are
left out (tests/e2e/test_transfer.py and test_wheel_cache.py drive those)."""

from __future__ import annotations

import dataclasses
import json
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import PlaybookError
from fleetfix.guests.node import NodeGuest
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.target import Target
from fleetfix.transport.local import LocalTransport
from fleetfix.wheels.cache import WheelCache
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from


class ListRecorder:
    run_id = None

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def event(self, kind: str, /, **fields: Any) -> None:
        with self._lock:
            self.events.append({"kind": kind, **fields})

    def add_secrets(self, values: object) -> None:
        return None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["kind"] == kind]


def run(book_text: str, tmp_path: Path, targets: list[Target], *, check: bool = False,
        cache: WheelCache | None = None, rebuild: bool = False, recorder: ListRecorder | None = None,
        cli_vars: dict[str, Any] | None = None) -> PlaybookRun:
    book = playbook_from(book_text, tmp_path)
    fleet = StandInFleet({target.name: LocalTransport(target.name) for target in targets})
    return run_playbook(
        book, targets,
        FleetAccess(fleet.map, lambda target, transport: {},
                    lambda target: NodeGuest(target, LocalTransport(target.name))),
        RunOptions(vars=cli_vars or {}, check_mode=check, wheels=WheelOptions(cache, rebuild=rebuild)),
        RunHooks(recorder=recorder))


def statuses(result: PlaybookRun) -> dict[str, list[str]]:
    return {target.target: [step.status for step in target.steps] for target in result.targets}


# --- copy / fetch ----------------------------------------------------------------------------------

COPY_FETCH = """\
name: files
steps:
  - name: config pushed
    copy: {src: files/app.conf, dest: "{{ out }}/app.conf", mode: "0640"}
    register: pushed
  - name: log fetched
    fetch: {src: "{{ out }}/app.conf", dest: "fetched/{{ target.name }}/app.conf"}
  - name: sees the sha
    check: test {{ registered.pushed.sha256 }} = "$(sha256sum < {{ out }}/app.conf | cut -d' ' -f1)"
"""


def test_copy_and_fetch_are_idempotent_by_checksum(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "app.conf").write_text("threads = 4\n")
    out = tmp_path / "guest"
    out.mkdir()
    target = make_target("node-a", None, out=str(out))
    before = sorted(p.name for p in out.iterdir())

    checked = run(COPY_FETCH, tmp_path, [target], check=True)
    assert statuses(checked)["node-a"][:2] == ["would-change", "would-change"]
    assert sorted(p.name for p in out.iterdir()) == before  # check mode changed nothing

    recorder = ListRecorder()
    first = run(COPY_FETCH, tmp_path, [target], recorder=recorder)
    assert statuses(first)["node-a"] == ["changed", "changed", "ok"], first.targets[0].reason
    assert (out / "app.conf").read_text() == "threads = 4\n"
    assert oct((out / "app.conf").stat().st_mode & 0o777) == "0o640"
    fetched = tmp_path / "fetched" / "node-a" / "app.conf"
    assert fetched.read_text() == "threads = 4\n" and oct(fetched.stat().st_mode & 0o777) == "0o600"
    events = recorder.of("transfer")
    assert [(e["op"], e["status"]) for e in events] == [
        ("copy", "changed"), ("fetch", "changed")]
    assert events[0]["sha256"] == events[1]["sha256"] and events[0]["size"] == 12

    again = run(COPY_FETCH, tmp_path, [target])
    assert statuses(again)["node-a"] == ["ok", "ok", "ok"]
    assert "matches (sha256" in again.targets[0].steps[0].reason

    (tmp_path / "files" / "app.conf").write_text("threads = 8\n")
    changed = run(COPY_FETCH, tmp_path, [target])
    assert statuses(changed)["node-a"] == ["changed", "changed", "ok"]
    assert "was differs" in changed.targets[0].steps[0].reason


def test_a_missing_source_fails_the_step(tmp_path: Path) -> None:
    out = tmp_path / "guest"
    out.mkdir()
    result = run(COPY_FETCH, tmp_path, [make_target("node-a", None, out=str(out))])
    assert statuses(result)["node-a"] == ["failed"]
    assert "does not exist on the controller" in result.targets[0].steps[0].reason


@pytest.mark.parametrize(("step", "message"), [
    ("copy: {src: a, dest: /b}\n    apply: echo", "apply: not with copy"),
    ("copy: {src: a, dest: /b, mode: 644}", "Input should be a valid string"),
    ("copy: {src: a, dest: /b, mode: \"999\"}", "an octal mode as a quoted string"),
    ("copy: {src: a, dest: /b}\n    fetch: {src: /b, dest: a}", "a step is one of copy, fetch or wheels"),
    ("fetch: {src: /b, dest: a}\n    env: {X: 1}", "env: not with fetch"),
    ("wheels: {items: 'x', describe: d, build: b, install: i, verify: v}\n    apply: echo",
     "apply: not with wheels"),
    ("wheels: {items: 'x', key: {name: n}, describe: d, build: b, install: i, verify: v}",
     "a key field is an identifier other than name and version"),
])
def test_load_errors_name_the_field(tmp_path: Path, step: str, message: str) -> None:
    with pytest.raises(PlaybookError, match=message):
        playbook_from(f"name: bad\nsteps:\n  - name: s\n    {step}\n", tmp_path)


def test_a_relative_target_path_is_refused_at_plan_time(tmp_path: Path) -> None:
    book = "name: b\nsteps:\n  - name: s\n    copy: {src: a, dest: relative/path}\n"
    result = run(book, tmp_path, [make_target("node-a", None)])
    assert result.exit_code == 2 and "a target path must be absolute" in str(result.error)


# --- wheels ----------------------------------------------------------------------------------------

# Each target's "site" is a directory; an item is installed when site/<name> holds the wheel's bytes.
# The build writes a real (tiny) wheel file and logs the build to the builds dir, so the test can count.
WHEELS = """\
name: wheels
vars:
  flavour: a
steps:
  - name: wheels installed
    wheels:
      items: "['demo-ext']"
      key:
        flavour: "{{ flavour }}"
        python: cp311
      describe: echo demo-ext 1.0
      build: |
        python3 - "$FLEETFIX_WHEEL_DIR" {{ flavour }} <<'EOF'
        import sys, zipfile
        tag, info = "cp311-cp311-linux_x86_64", "demo_ext-1.0.dist-info"
        with zipfile.ZipFile(sys.argv[1] + "/demo_ext-1.0-" + tag + ".whl", "w") as z:
            z.writestr("demo_ext/__init__.py", "FLAVOUR = %r\\n" % sys.argv[2])
            # what the cache keeps: a compiled extension (an x86_64 ELF header stands in for the module)
            z.writestr("demo_ext/_C.so", b"\\x7fELF\\x02\\x01\\x01" + bytes(11) + b"\\x3e\\x00" + bytes(44))
            z.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: demo-ext\\nVersion: 1.0\\n")
            z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: false\\nTag: " + tag + "\\n")
        EOF
        echo {{ target.name }} >> {{ builds }}/log
      install: cp "$FLEETFIX_WHEEL" {{ site }}/{{ item }}
      verify: test -s {{ site }}/{{ item }}
"""


def wheel_targets(tmp_path: Path) -> list[Target]:
    """Four targets that trust each other's builds (an inventory group trusting itself, `wheels: trust:`;
    by default each would build its own, test_wheel_trust_steps.py)."""
    (tmp_path / "builds").mkdir()
    targets = []
    names = frozenset({"t1", "t2", "t3", "t4"})
    for name, flavour in (("t1", "a"), ("t2", "a"), ("t3", "a"), ("t4", "b")):
        site = tmp_path / "sites" / name
        site.mkdir(parents=True)
        target = make_target(name, None, site=str(site), flavour=flavour, builds=str(tmp_path / "builds"))
        targets.append(dataclasses.replace(target, wheel_builders=names - {name}))
    return targets


def flavour_of(path: Path) -> str:
    with zipfile.ZipFile(path) as wheel:
        return wheel.read("demo_ext/__init__.py").decode().split("'")[1]


def test_built_once_per_key_installed_everywhere(tmp_path: Path) -> None:
    targets = wheel_targets(tmp_path)
    cache = WheelCache(tmp_path / "cache")
    recorder = ListRecorder()
    first = run(WHEELS, tmp_path, targets, cache=cache, recorder=recorder)
    assert all(status == ["changed"] for status in statuses(first).values()), first.targets
    # Four targets run concurrently; the per-key lock makes exactly one builder per key.
    builds = (tmp_path / "builds" / "log").read_text().split()
    assert len(builds) == 2 and "t4" in builds
    actions = sorted(event["action"] for event in recorder.of("wheel"))
    assert actions == ["built", "built", "installed-from-cache", "installed-from-cache"]
    for target in targets:  # every target got the wheel of its own key
        installed = Path(target.vars["site"]) / "demo-ext"
        assert flavour_of(installed) == target.vars["flavour"]
    entries = cache.entries()
    assert sorted(entry.key["flavour"] for entry in entries) == ["a", "b"]
    assert oct(cache.root.stat().st_mode & 0o777) == "0o700"
    for entry in entries:
        assert oct(entry.path.stat().st_mode & 0o777) == "0o600"
        manifest = json.loads((entry.directory / "manifest.json").read_text())
        assert set(manifest) >= {"key", "sha256", "built_on", "built_at", "build_seconds"}

    again = run(WHEELS, tmp_path, targets, cache=cache)
    assert all(status == ["ok"] for status in statuses(again).values())
    assert len((tmp_path / "builds" / "log").read_text().split()) == 2


def test_a_corrupt_entry_is_refused_and_rebuilt_never_installed(tmp_path: Path) -> None:
    targets = wheel_targets(tmp_path)[:1]
    cache = WheelCache(tmp_path / "cache")
    run(WHEELS, tmp_path, targets, cache=cache)
    entry = cache.entries()[0]
    entry.path.write_bytes(b"tampered")  # same size no longer, and another sha256
    site = Path(targets[0].vars["site"])
    (site / "demo-ext").unlink()  # the target lost it: it needs the wheel again

    recorder = ListRecorder()
    result = run(WHEELS, tmp_path, targets, cache=cache, recorder=recorder)
    assert statuses(result) == {"t1": ["changed"]}
    (event,) = recorder.of("wheel")
    assert event["action"] == "built" and "checksum mismatch" in event["refused"][0]
    assert "refused" in result.targets[0].steps[0].reason
    assert (site / "demo-ext").read_bytes() != b"tampered" and flavour_of(site / "demo-ext") == "a"
    assert len((tmp_path / "builds" / "log").read_text().split()) == 2
    assert cache.verify()[0][1] is None  # the rebuilt entry is sound


def test_rebuild_ignores_the_cache_and_check_mode_changes_nothing(tmp_path: Path) -> None:
    targets = wheel_targets(tmp_path)[:2]
    cache = WheelCache(tmp_path / "cache")
    run(WHEELS, tmp_path, targets[:1], cache=cache)
    checked = run(WHEELS, tmp_path, targets[1:], cache=cache, check=True)
    assert statuses(checked) == {"t2": ["would-change"]}
    assert "would install from the wheel cache or build: demo-ext" in checked.targets[0].steps[0].reason
    assert not (Path(targets[1].vars["site"]) / "demo-ext").exists()
    rebuilt = run(WHEELS, tmp_path, targets[1:], cache=cache, rebuild=True)
    assert statuses(rebuilt) == {"t2": ["changed"]} and "built in" in rebuilt.targets[0].steps[0].reason
    assert (tmp_path / "builds" / "log").read_text().split() == ["t1", "t2"]


def test_an_incomplete_key_builds_without_caching(tmp_path: Path) -> None:
    targets = wheel_targets(tmp_path)[:2]
    cache = WheelCache(tmp_path / "cache")
    result = run(WHEELS, tmp_path, targets, cache=cache, cli_vars={"flavour": ""})
    reasons = [target.steps[0].reason for target in result.targets]
    assert all("not cached (key incomplete: flavour unknown)" in reason for reason in reasons), reasons
    assert cache.entries() == []
