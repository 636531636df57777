"""`fleetfix wheels verify` and `list` say what they looked at, an empty cache included."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fleetfix.cli import main
from fleetfix.wheels.cache import Provenance, WheelCache, target_builder
from tests.lab.releases import make_wheel
from tests.unit.test_wheel_contents import elf


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_verify_on_an_empty_cache_says_so(tmp_path: Path) -> None:
    cache = tmp_path / "wheels"
    assert invoke("wheels", "verify", "--wheel-cache", str(cache)) == (0, f"0 entries checked in {cache}\n")
    assert invoke("wheels", "list", "--wheel-cache", str(cache)) == (0, f"0 entries in {cache}\n")


def test_verify_counts_what_it_checked_and_what_is_bad(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "wheels")
    tag = "cp311-cp311-linux_x86_64"
    for version in ("1.0", "2.0"):  # the cache keeps compiled extensions only
        wheel = cache.incoming(f"tiny-{version}-{tag}.whl")
        wheel.write_bytes(make_wheel("tiny", version, tag, {"tiny/_C.so": elf()}))
        cache.store({"name": "tiny", "version": version, "python_tag": "cp311", "machine": "x86_64"}, wheel,
                    Provenance(target_builder("pve1/200")))
    code, output = invoke("wheels", "verify", "--wheel-cache", str(cache.root))
    assert code == 0 and output.endswith(f"2 entries checked in {cache.root}\n"), output
    damaged = next(entry for entry in cache.entries() if entry.key["version"] == "2.0")
    damaged.path.write_bytes(b"changed on disk")
    code, output = invoke("wheels", "verify", "--wheel-cache", str(cache.root))
    assert code == 1 and output.endswith(f"2 entries checked in {cache.root}, 1 bad\n"), output
    assert f"BAD  {damaged.directory.name}: " in output


def test_list_shows_the_sdist_the_controller_measured_sanitised(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "wheels")
    tag = "cp311-cp311-linux_x86_64"
    for version, digest in (("1.0", "ab" * 32), ("2.0", None)):
        wheel = cache.incoming(f"tiny-{version}-{tag}.whl")
        wheel.write_bytes(make_wheel("tiny", version, tag, {"tiny/_C.so": elf()}))
        cache.store({"name": "tiny", "version": version, "python_tag": "cp311", "machine": "x86_64"}, wheel,
                    Provenance(target_builder("pve1/200"), sdist_sha256=digest,
                               sdist="/srv/sdists/tiny-1.0.tar.gz\x1b[2J" if digest else None))
    code, output = invoke("wheels", "list", "--wheel-cache", str(cache.root))
    assert code == 0, output
    lines = [line for line in output.splitlines() if "from sdist" in line]
    assert lines == [f"    built from sdist sha256 {'ab' * 32} (/srv/sdists/tiny-1.0.tar.gz\\x1b[2J)"], output
    code, output = invoke("wheels", "list", "--wheel-cache", str(cache.root), "--json")
    listed = {entry["key"]["version"]: entry for entry in json.loads(output)}
    assert (listed["1.0"]["sdist_sha256"], listed["2.0"]["sdist_sha256"], listed["2.0"]["sdist"]) == (
        "ab" * 32, None, None)
