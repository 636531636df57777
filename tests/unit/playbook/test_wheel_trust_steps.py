"""Trust across guests in `wheels` steps (docs/security.md, the wheel cache): each test is one way a guest
that builds could get code into another guest through the controller's cache, run through run_playbook on
this machine (local targets, real files, real sh, as test_transfer_and_wheel_steps.py).

A "compiled" wheel here is one whose dist-info says so and that holds an ELF header for x86_64 (what
wheels.cache.compiled_wheel_problem reads); the attacker's wheels are named like the real one."""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import zipfile
from pathlib import Path

from fleetfix.guests.node import NodeGuest
from fleetfix.playbook.runner import FleetAccess, PlaybookRun, RunHooks, RunOptions, run_playbook
from fleetfix.playbook.wheels import WheelOptions
from fleetfix.secrets import MASK, Redactor
from fleetfix.target import Target
from fleetfix.transport.local import LocalTransport
from fleetfix.wheels.cache import WheelCache, canonical_name, key_digest
from tests.unit.playbook.conftest import StandInFleet, make_target, playbook_from
from tests.unit.playbook.test_transfer_and_wheel_steps import ListRecorder

# The build writes demo_ext-1.0 as its kind says: "compiled" (a platform tag, Root-Is-Purelib: false, an
# x86_64 ELF .so), or "pure" (the same file name, but pure Python inside: the reproduction's wheel). Its
# __init__ says which target built it; install copies it to the target's site, verify needs it there.
BOOK = """\
name: trust
steps:
  - name: wheels installed
    wheels:
      items: "['demo-ext']"
      key:
        python_tag: cp311
        torch: "2.14.1+cu130"
        machine: x86_64
      describe: echo {{ described | default('demo-ext 1.0') }}
      build: |
        python3 - "$FLEETFIX_WHEEL_DIR" {{ target.name }} {{ kind | default('compiled') }} <<'EOF'
        import sys, zipfile
        out, who, kind = sys.argv[1:]
        tag = "cp311-cp311-linux_x86_64"
        info = "demo_ext-1.0.dist-info"
        with zipfile.ZipFile(out + "/demo_ext-1.0-" + tag + ".whl", "w") as wheel:
            wheel.writestr("demo_ext/__init__.py", "BUILT_ON = %r\\n" % who)
            if kind == "compiled":
                elf = b"\\x7fELF\\x02\\x01\\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(44)
                wheel.writestr("demo_ext/_C.cpython-311-x86_64-linux-gnu.so", elf)
            wheel.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: demo-ext\\nVersion: 1.0\\n")
            pure = "true" if kind == "pure" else "false"
            wheel.writestr(info + "/WHEEL",
                           "Wheel-Version: 1.0\\nRoot-Is-Purelib: " + pure + "\\nTag: " + tag + "\\n")
        EOF
        echo {{ target.name }} >> {{ builds }}/log
        echo FLEETFIX_WHEEL_SOURCE=https://github.com/Dao-AILab/causal-conv1d/releases/download/v1.0/x.whl
      install: cp "$FLEETFIX_WHEEL" {{ site }}/{{ item }}
      verify: test -s {{ site }}/{{ item }}
"""
KEY = {"python_tag": "cp311", "torch": "2.14.1+cu130", "machine": "x86_64"}


def hosts(tmp_path: Path, *names: str, **extra: str) -> list[Target]:
    (tmp_path / "builds").mkdir(exist_ok=True)
    made = []
    for name in names:
        site = tmp_path / "sites" / name
        site.mkdir(parents=True)
        made.append(make_target(name, None, site=str(site), builds=str(tmp_path / "builds"), **extra))
    return made


def run(tmp_path: Path, targets: list[Target], cache: WheelCache,
        recorder: ListRecorder | None = None, redactor: Redactor | None = None) -> PlaybookRun:
    book = playbook_from(BOOK, tmp_path)
    fleet = StandInFleet({target.name: LocalTransport(target.name) for target in targets})
    return run_playbook(
        book, targets,
        FleetAccess(fleet.map, lambda target, transport: {},
                    lambda target: NodeGuest(target, LocalTransport(target.name))),
        RunOptions(wheels=WheelOptions(cache)),
        RunHooks(recorder=recorder, redactor=redactor))


def built_on(target: Target) -> str:
    with zipfile.ZipFile(Path(target.vars["site"]) / "demo-ext") as wheel:
        return wheel.read("demo_ext/__init__.py").decode().split("'")[1]


def builds(tmp_path: Path) -> list[str]:
    return (tmp_path / "builds" / "log").read_text().split()


def test_a_wheel_built_on_one_guest_is_not_installed_on_another_by_default(tmp_path: Path) -> None:
    # The attacker reports the victim's key (it can: every field is its own word, e.g. torch's version.py
    # edited), builds first, and its wheel is a well-formed compiled one: only trust can stop it.
    attacker, victim = hosts(tmp_path, "attacker", "victim")
    cache = WheelCache(tmp_path / "cache")
    first = run(tmp_path, [attacker], cache)
    assert "cached as demo-ext-1.0-" in first.targets[0].steps[0].reason  # it is in the cache
    recorder = ListRecorder()
    second = run(tmp_path, [victim], cache, recorder)
    assert second.targets[0].steps[0].status == "changed", second.targets[0].steps[0].reason
    (event,) = recorder.of("wheel")
    assert event["action"] == "built", event
    assert built_on(victim) == "victim" and builds(tmp_path) == ["attacker", "victim"]
    assert sorted(entry.built_on for entry in cache.entries()) == ["attacker", "victim"]


def test_a_builder_the_inventory_trusts_is_installed_where_it_is_trusted(tmp_path: Path) -> None:
    builder, trusting, other = hosts(tmp_path, "builder", "trusting", "other")
    trusting = dataclasses.replace(trusting, wheel_builders=frozenset({"builder"}))
    cache = WheelCache(tmp_path / "cache")
    run(tmp_path, [builder], cache)
    recorder = ListRecorder()
    run(tmp_path, [trusting, other], cache, recorder)
    actions = {event["target"]: event for event in recorder.of("wheel")}
    assert actions["trusting"]["action"] == "installed-from-cache"
    assert actions["trusting"]["built_on"] == "builder" and built_on(trusting) == "builder"
    assert actions["other"]["action"] == "built" and built_on(other) == "other"
    assert builds(tmp_path) == ["builder", "other"]


def test_a_group_that_trusts_itself_builds_once(tmp_path: Path) -> None:
    # Four targets of one key run at once, each trusting the others (a per-group cache): one build.
    names = ("g1", "g2", "g3", "g4")
    group = [dataclasses.replace(host, wheel_builders=frozenset(names) - {host.name})
             for host in hosts(tmp_path, *names)]
    recorder = ListRecorder()
    result = run(tmp_path, group, WheelCache(tmp_path / "cache"), recorder)
    assert {target.steps[0].status for target in result.targets} == {"changed"}
    assert len(builds(tmp_path)) == 1
    assert sorted(event["action"] for event in recorder.of("wheel")) == [
        "built", "installed-from-cache", "installed-from-cache", "installed-from-cache"]
    assert {built_on(host) for host in group} == set(builds(tmp_path))


def test_what_a_builder_prints_decides_no_recorded_fact(tmp_path: Path) -> None:
    (builder,) = hosts(tmp_path, "t1")
    cache = WheelCache(tmp_path / "cache")
    result = run(tmp_path, [builder], cache)
    assert "built in" in result.targets[0].steps[0].reason  # not "downloaded (https://github.com/...)"
    (entry,) = cache.entries()
    manifest = json.loads((entry.directory / "manifest.json").read_text())
    assert manifest["source"] == "build"
    assert manifest["builder"] == "target:t1" and manifest["built_on"] == "t1"
    # The build command is the script the controller rendered and sent, whatever the build printed.
    assert manifest["build_command"].startswith('python3 - "$FLEETFIX_WHEEL_DIR" t1 compiled <<')
    assert manifest["build_command"].rstrip().endswith("v1.0/x.whl")
    assert manifest["sdist_sha256"] is None  # the controller never had the source: not claimed


def test_the_recorded_build_command_masks_the_runs_secrets(tmp_path: Path) -> None:
    (builder,) = hosts(tmp_path, "t1")
    redactor = Redactor()
    redactor.add(["Dao-AILab/causal-conv1d"])  # stands for a token in an index URL of pip_args
    cache = WheelCache(tmp_path / "cache")
    run(tmp_path, [builder], cache, redactor=redactor)
    (entry,) = cache.entries()
    assert entry.build_command is not None
    assert "Dao-AILab/causal-conv1d" not in entry.build_command and MASK in entry.build_command


def test_a_pure_python_wheel_is_installed_on_its_builder_but_never_cached(tmp_path: Path) -> None:
    (attacker,) = hosts(tmp_path, "attacker", kind="pure")
    cache = WheelCache(tmp_path / "cache")
    recorder = ListRecorder()
    result = run(tmp_path, [attacker], cache, recorder)
    step = result.targets[0].steps[0]
    assert step.status == "changed", step.reason
    assert "not cached (" in step.reason and "pure-Python wheel" in step.reason, step.reason
    (event,) = recorder.of("wheel")
    assert event["action"] == "built-not-cached"
    assert cache.entries() == []


def test_a_described_name_that_is_a_path_stays_text(tmp_path: Path) -> None:
    # describe names the package "/tmp/.../x": the entry's directory would be that absolute path. Before,
    # the lookup read a manifest there and removed the directory as a refused entry.
    outside = Path("/tmp") / f"ffescape{secrets.token_hex(6)}"
    name = f"{outside}/x"
    key = {**KEY, "name": canonical_name(name), "version": "1.0"}
    planted = outside / f"{canonical_name(name)}-1.0-{key_digest(key)[:16]}"
    planted.mkdir(parents=True)
    (planted / "manifest.json").write_text("{}")
    try:
        (target,) = hosts(tmp_path, "t1", described=f"{name} 1.0")
        cache = WheelCache(tmp_path / "cache")
        result = run(tmp_path, [target], cache)
        assert (planted / "manifest.json").is_file(), "a directory outside the cache was removed"
        step = result.targets[0].steps[0]
        assert step.status == "failed"
        assert "is not a distribution name" in step.reason, step.reason
        assert not (tmp_path / "builds" / "log").exists()
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_a_wheelhouse_the_operator_names_is_used_whoever_built_it(tmp_path: Path) -> None:
    # CI's output (another controller's cache, its builder one of CI's containers) named with --wheelhouse.
    (tmp_path / "ci").mkdir()
    (ci,) = hosts(tmp_path / "ci", "ci-7")
    ci_cache = WheelCache(tmp_path / "ci-wheels")
    run(tmp_path / "ci", [ci], ci_cache)
    (target,) = hosts(tmp_path, "t1")
    recorder = ListRecorder()
    run(tmp_path, [target], WheelCache(tmp_path / "cache", wheelhouses=[ci_cache.root]), recorder)
    (event,) = recorder.of("wheel")
    assert event["action"] == "installed-from-cache" and event["built_on"] == "ci-7"
    assert built_on(target) == "ci-7" and not (tmp_path / "builds" / "log").exists()


def test_an_entry_from_before_builders_were_recorded_is_never_used_from_the_cache(tmp_path: Path) -> None:
    (target,) = hosts(tmp_path, "t1")
    cache = WheelCache(tmp_path / "cache")
    run(tmp_path, [target], cache)
    (entry,) = cache.entries()
    manifest = json.loads((entry.directory / "manifest.json").read_text())
    manifest["fleetfix_wheel_cache"] = 1  # as version 1 wrote it: no builder; and under its old name
    del manifest["builder"]
    old = cache.root / f"demo-ext-1.0-{manifest['key_digest'][:16]}"
    entry.directory.rename(old)
    (old / "manifest.json").write_text(json.dumps(manifest))
    (Path(target.vars["site"]) / "demo-ext").unlink()
    recorder = ListRecorder()
    run(tmp_path, [target], cache, recorder)
    (event,) = recorder.of("wheel")
    assert event["action"] == "built"
    problems = dict((e.directory.name, problem) for e, problem in cache.verify())
    assert "written before fleetfix recorded builders" in str(problems[old.name])
