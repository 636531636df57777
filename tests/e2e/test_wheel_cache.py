"""Issue 19's acceptance on the test bed: build once per key, install wherever it is trusted, through the CLI.

Four containers share the real torch 2.14.1 (cu130) venv and get the real nvcc 13.0 (cuda-toolkit.yaml); the
extension is our one-kernel fixture (tests/fixtures/extensions/fleetfix-tiny-ext). Three containers build for
arch 9.0, the fourth for 8.0: two keys. Expected: two builds, four installs that import, a second apply
that changes nothing, and a cache entry whose wheel no longer matches its manifest refused and rebuilt,
never installed. `pytest -s` prints the `[measure]` lines docs/extensions.md quotes (time and bytes moved
for 3 containers of one key: warm cache vs --rebuild, which builds on every target as before the cache).
The --rebuild half builds on one container unless FLEETFIX_MEASURE_REBUILD=3: proving that --rebuild
ignores the cache takes one build; the three-build measurement is ~1.5 min of CI for a number in a doc.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetfix.wheels.cache import WheelCache
from tests.e2e.conftest import CliResult, run_cli
from tests.e2e.test_build_extensions import (  # noqa: F401  # session fixtures, used by name
    import_tiny,
    real_repo,
    real_torch,
    report,
)
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.cli import TINY_EXTENSION_IN_CT, add_tiny_extension_source
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch

pytestmark = [pytest.mark.slow]

TOOLKIT = "playbooks/cuda-toolkit.yaml"
BUILD = "playbooks/build-extensions.yaml"
TINY = f"{TINY_EXTENSION_IN_CT}=fleetfix_tiny_cuda+fleetfix_tiny"


def inventory(path: Path, lab: Lab, cts: Sequence[tuple[Container, str]], python: Path, *,
              share: bool = False) -> Path:
    """The containers with their arch lists; share: they trust each other's builds (`wheels: trust:`, a
    group sharing its builds), else each installs only what it built (the default)."""
    node = lab.node()
    document: dict[str, Any] = {
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{"name": node.name, "address": node.address, "port": node.port, "containers": [
            {"ctid": ct.ctid, "vars": {"python": str(python), "cuda_arch_list": arch}} for ct, arch in cts]}],
    }
    if share:
        everyone = [f"node:{node.name}"]
        document["wheels"] = {"trust": [{"builders": everyone, "install_on": everyone}]}
    path.write_text(yaml.safe_dump(document))
    return path


def wheel_events(state: Path, result: CliResult) -> list[dict[str, Any]]:
    run_id = result.json()["run_id"]
    lines = (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event["kind"] == "wheel"]


def changed(result: CliResult) -> int:
    return sum(target["counts"]["changed"] for target in result.json()["targets"])


@pytest.mark.timeout(3600)
def test_built_once_per_key_installed_everywhere(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch,  # noqa: F811
    real_repo: AptRepo, tmp_path: Path,  # noqa: F811
) -> None:
    cts = [make_ct(share=(str(real_torch.venv),)) for _ in range(4)]  # the venv is hidden unless shared
    for ct in cts:
        add_tiny_extension_source(ct)
    same_key = [(ct, "9.0") for ct in cts[:3]]
    everyone = [*same_key, (cts[3], "8.0")]
    # The containers trust each other's builds (one team's group): built once per key. By default each
    # would build its own (tests/e2e/test_wheel_trust.py).
    inv_all = inventory(tmp_path / "all.yaml", lab, everyone, real_torch.python, share=True)
    inv_same = inventory(tmp_path / "same.yaml", lab, same_key, real_torch.python, share=True)
    state, cache = tmp_path / "state", tmp_path / "wheels"
    common = ["--state-dir", str(state), "--wheel-cache", str(cache)]

    def build(inv: Path, *extra: str) -> tuple[CliResult, float]:
        started = time.monotonic()
        done = run_cli("apply", BUILD, "-i", str(inv), *common, "--var", f"extensions={TINY}",
                       "--var", "pip_args=--no-index", "--json", *extra, timeout=1500)
        assert done.exit_code == 0, done.stdout[-4000:] + done.stderr[-3000:]
        return done, time.monotonic() - started

    toolkit = run_cli("apply", TOOLKIT, "-i", str(inv_all), "--state-dir", str(state),
                      "--var", f"cuda_repo_base={real_repo.base_url}", timeout=900)
    assert toolkit.exit_code == 0, toolkit.stdout[-3000:] + toolkit.stderr[-3000:]

    # 1. Cold cache, two keys, four targets at once: built exactly twice, installed on all four.
    first, first_s = build(inv_all)
    events = wheel_events(state, first)
    assert sorted(e["action"] for e in events) == ["built", "built", "installed-from-cache",
                                                   "installed-from-cache"], events
    assert sorted(e["key"]["arch_list"] for e in events if e["action"] == "built") == ["8.0", "9.0"]
    installed_from = {e["target"]: e["entry"] for e in events}
    built_on = {e["entry"]: e["target"] for e in events if e["action"] == "built"}
    for event in events:  # every target got the wheel of its own key
        assert event["key"]["arch_list"] == ("8.0" if event["target"].endswith(str(cts[3].ctid)) else "9.0")
    assert len(set(installed_from.values())) == 2 and len(built_on) == 2
    for ct in cts:
        assert import_tiny(ct, real_torch) == "13000"
    listed = run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json()
    assert len(listed) == 2 and all(entry["build_seconds"] > 0 for entry in listed)
    wheel_bytes = listed[0]["size"]
    moved = sum(e["size"] for e in events)
    report("4 containers, 2 keys, cold cache", f"{first_s:.0f} s, 2 builds, {moved} wheel bytes moved "
                                               f"(wheel {wheel_bytes} bytes)")

    # 2. The second apply changes nothing (and checks before anything else: no wheel event at all).
    again = run_cli("apply", BUILD, "-i", str(inv_all), *common, "--var", f"extensions={TINY}", "--json")
    assert again.exit_code == 0 and changed(again) == 0, again.stdout[-3000:]
    assert wheel_events(state, again) == []

    def uninstall(targets: Sequence[Container]) -> None:
        for ct in targets:
            ct.sh(f"{real_torch.python} -m pip uninstall -y -q fleetfix-tiny-ext")

    # 3. Measured: N=3 containers of one key, warm cache vs --rebuild (each builds, as without the cache).
    uninstall(cts[:3])
    warm, warm_s = build(inv_same)
    warm_events = wheel_events(state, warm)
    assert [e["action"] for e in warm_events] == ["installed-from-cache"] * 3
    report("3 containers, 1 key, warm cache", f"{warm_s:.0f} s, 0 builds, "
                                              f"{sum(e['size'] for e in warm_events)} wheel bytes pushed")
    rebuilding = cts[:int(os.environ.get("FLEETFIX_MEASURE_REBUILD", "1"))]
    uninstall(rebuilding)
    inv_rebuild = inventory(tmp_path / "rebuild.yaml", lab, [(ct, "9.0") for ct in rebuilding],
                            real_torch.python, share=True)
    rebuilt, rebuilt_s = build(inv_rebuild, "--rebuild")
    rebuilt_events = wheel_events(state, rebuilt)
    assert [e["action"] for e in rebuilt_events] == ["built"] * len(rebuilding)  # the cache had the key
    seconds = sorted(round(e["build_seconds"]) for e in rebuilt_events)
    pulled = sum(e["size"] for e in rebuilt_events)
    report(f"{len(rebuilding)} container(s), 1 key, --rebuild (no cache use)",
           f"{rebuilt_s:.0f} s, {len(rebuilding)} build(s) ({seconds} s each), {pulled} wheel bytes pulled")
    for ct in rebuilding:
        assert import_tiny(ct, real_torch) == "13000"

    # 4. Corrupted entries (their wheels no longer match the manifests' sha256) are refused and rebuilt.
    #    Every 9.0 entry (the first build's, and the --rebuild's when another container made it).
    for entry in run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json():
        if entry["key"]["arch_list"] != "9.0":
            continue
        wheel = cache / WheelCache.entry_name(entry["key"], entry["builder"]) / entry["wheel"]
        corrupted = bytearray(wheel.read_bytes())
        corrupted[len(corrupted) // 2] ^= 0xFF
        wheel.write_bytes(bytes(corrupted))
    assert run_cli("wheels", "verify", "--wheel-cache", str(cache)).exit_code == 1
    uninstall(cts[:1])
    healed, _ = build(inv_all)
    (event,) = wheel_events(state, healed)
    assert event["action"] == "built" and event["target"].endswith(str(cts[0].ctid))
    assert "checksum mismatch" in event["refused"][0]
    assert import_tiny(cts[0], real_torch) == "13000"
    assert changed(healed) == 1  # the other three were already fine
    assert run_cli("wheels", "verify", "--wheel-cache", str(cache)).exit_code == 0
