"""What the wheel cache reads out of a wheel (fleetfix.wheels.cache): bounded whatever the zip claims, and a
compiled key accepts only a wheel that is a compiled extension for it."""

from __future__ import annotations

import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetfix.wheels.archive import MAX_METADATA_BYTES
from fleetfix.wheels.cache import (
    MAX_DIST_INFO_FILE,
    Provenance,
    WheelCache,
    WheelRefused,
    compiled_wheel_problem,
    name_problem,
    target_builder,
    version_problem,
)
from tests.lab.releases import make_wheel

TAG = "cp311-cp311-linux_x86_64"
KEY = {"name": "demo-ext", "version": "1.0", "python_tag": "cp311", "machine": "x86_64"}
INIT = {"demo_ext/__init__.py": "X = 1\n"}


def elf(machine: int = 62) -> bytes:
    """A 64-bit little-endian ELF header (glibc's elf.h: e_ident, then e_type, e_machine at offset 18)."""
    return b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + machine.to_bytes(2, "little") + \
        bytes(44)


def wheel_file(tmp_path: Path, data: bytes, name: str = f"demo_ext-1.0-{TAG}.whl") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def compiled(**extra: str | bytes) -> bytes:
    return make_wheel("demo_ext", "1.0", TAG, {**INIT, "demo_ext/_C.cpython-311-x86_64-linux-gnu.so": elf(),
                                               **extra})


def test_a_compiled_wheel_for_the_key_is_accepted(tmp_path: Path) -> None:
    assert compiled_wheel_problem(wheel_file(tmp_path, compiled()), KEY) is None


@pytest.mark.parametrize(("name", "members", "problem"), [
    (f"demo_ext-1.0-{TAG}.whl", INIT, "holds no shared object (.so): a pure-Python wheel"),
    ("demo_ext-1.0-py3-none-any.whl", INIT, "tagged py3-none-any: a pure-Python wheel"),
    (f"demo_ext-1.0-{TAG}.whl", {**INIT, "demo_ext/_C.so": b"#!/bin/sh\n" + bytes(30)},
     "demo_ext/_C.so (not ELF)"),
    (f"demo_ext-1.0-{TAG}.whl", {**INIT, "demo_ext/_C.so": elf(183)}, "ELF machine 183, not x86_64's 62"),
    (f"other-1.0-{TAG}.whl", {**INIT, "demo_ext/_C.so": elf()}, "is not demo-ext 1.0"),
    ("demo_ext-1.0-cp312-cp312-linux_x86_64.whl", {**INIT, "demo_ext/_C.so": elf()},
     "is for Python cp312, not the key's cp311"),
    ("demo_ext-1.0-cp311-cp311-linux_aarch64.whl", {**INIT, "demo_ext/_C.so": elf()},
     "is for platform linux_aarch64, not the key's machine x86_64"),
])
def test_what_is_not_a_compiled_extension_for_the_key_is_refused(
        tmp_path: Path, name: str, members: dict[str, str | bytes], problem: str) -> None:
    tag = name.split("-", 2)[2].removesuffix(".whl")
    path = wheel_file(tmp_path, make_wheel("demo_ext", "1.0", tag, members), name)
    found = compiled_wheel_problem(path, KEY)
    assert found is not None and problem in found, found


def test_a_wheel_whose_dist_info_says_purelib_is_refused(tmp_path: Path) -> None:
    path = wheel_file(tmp_path, compiled())
    rewritten = tmp_path / "out" / path.name
    rewritten.parent.mkdir()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(rewritten, "w") as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename.endswith("/WHEEL"):
                data = data.replace(b"Root-Is-Purelib: false", b"Root-Is-Purelib: true")
            target.writestr(member, data)
    found = compiled_wheel_problem(rewritten, KEY)
    assert found is not None and "Root-Is-Purelib: true" in found


def test_a_metadata_within_the_archive_limit_is_still_read_with_the_tighter_cap(tmp_path: Path) -> None:
    # The zip directory's limit for a dist-info file is wheels.archive's; METADATA, read into memory, has
    # a tighter one of its own.
    size = MAX_DIST_INFO_FILE + 1
    assert size < MAX_METADATA_BYTES
    path = tmp_path / f"demo_ext-1.0-{TAG}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("demo_ext/_C.cpython-311-x86_64-linux-gnu.so", elf())
        wheel.writestr("demo_ext-1.0.dist-info/WHEEL",
                       f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {TAG}\n")
        header = b"Metadata-Version: 2.1\nName: demo-ext\nVersion: 1.0\n\n"
        wheel.writestr("demo_ext-1.0.dist-info/METADATA", header + b"x" * (size - len(header)))
    found = compiled_wheel_problem(path, KEY)
    assert found is not None and f"METADATA is {size} bytes, more than {MAX_DIST_INFO_FILE}" in found, found


def test_store_refuses_a_pure_wheel_and_keeps_nothing(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    incoming = cache.incoming(f"demo_ext-1.0-{TAG}.whl")
    incoming.write_bytes(make_wheel("demo_ext", "1.0", TAG, INIT))
    with pytest.raises(WheelRefused, match="pure-Python"):
        cache.store(KEY, incoming, Provenance(target_builder("t1")))
    assert cache.entries() == []


@pytest.fixture(scope="module")
def metadata_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1 MB wheel whose METADATA inflates to 1 GiB (zeros deflate ~1000:1), written as a stream."""
    path = tmp_path_factory.mktemp("bomb") / f"demo_ext-1.0-{TAG}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as wheel:
        wheel.writestr("demo_ext/_C.cpython-311-x86_64-linux-gnu.so", elf())
        wheel.writestr("demo_ext-1.0.dist-info/WHEEL",
                       f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {TAG}\n")
        with wheel.open("demo_ext-1.0.dist-info/METADATA", "w", force_zip64=True) as member:
            member.write(b"Metadata-Version: 2.1\nName: demo-ext\nVersion: 1.0\n\n")
            chunk = bytes(1024 * 1024)
            for _ in range(1024):
                member.write(chunk)
    assert path.stat().st_size < 2 * 1024 * 1024
    return path


CHECK_UNDER_A_MEMORY_LIMIT = """\
import resource, sys
from pathlib import Path
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from fleetfix.wheels.cache import wheel_problem
print(wheel_problem(Path(sys.argv[1]), name="demo-ext", version="1.0", tag="cp311-cp311-linux_x86_64"))
"""


def test_a_metadata_bomb_is_refused_with_bounded_memory(metadata_bomb: Path) -> None:
    # Run in a child whose address space is capped at 512 MiB: reading the 1 GiB member whole cannot fit,
    # so only a check that looks at the declared size first, and reads with a cap, can answer.
    limit = 512 * 1024 * 1024
    assert resource.getrlimit(resource.RLIMIT_AS)[0] in (resource.RLIM_INFINITY,) or \
        resource.getrlimit(resource.RLIMIT_AS)[0] > limit
    done = subprocess.run([sys.executable, "-c", CHECK_UNDER_A_MEMORY_LIMIT, str(metadata_bomb), str(limit)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    said = f"METADATA' unpacks to {1024**3 + 51} bytes, over the limit of {MAX_METADATA_BYTES}"
    assert said in done.stdout, done.stdout


def test_a_metadata_bomb_is_never_stored(tmp_path: Path, metadata_bomb: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    incoming = cache.incoming(metadata_bomb.name)
    incoming.write_bytes(metadata_bomb.read_bytes())
    with pytest.raises(WheelRefused, match="METADATA' unpacks to"):
        cache.store(KEY, incoming, Provenance(target_builder("t1")))


@pytest.mark.parametrize("name", ["/tmp/x", "../x", "x/../../y", "", "-x", "x y", "x\n", "ä"])
def test_a_name_that_is_not_a_distribution_name_is_refused(name: str) -> None:
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", ["causal-conv1d", "causal_conv1d", "Flash.Attn", "x"])
def test_distribution_names_are_accepted(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(("version", "ok"), [
    ("1.7.0", True), ("2.14.1+cu130", True), ("1!2.0rc1.post2.dev3", True), ("0.1.0", True),
    ("../1", False), ("1.0-1", False), ("1 0", False), ("", False), ("1/0", False),
])
def test_versions(version: str, ok: bool) -> None:
    assert (version_problem(version) is None) is ok


def test_entry_paths_stay_under_the_root(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    for name in ("/tmp/x", "../x"):
        with pytest.raises(ValueError, match="not a distribution name"):
            cache.entry_dir({**KEY, "name": name}, target_builder("t1"))
    assert cache.entry_dir(KEY, target_builder("t1")).parent == cache.root
