"""Trust across guests, end to end on the test bed (docs/security.md, the wheel cache): root in one container
cannot get code into another through the controller's wheel cache under the default settings.

The reproduction: the attackers are root in their containers and replace the extension's source the build
uses (the same as leaving a wheel where the build looks for one). One builds a pure-Python wheel named like
the real one; the other a wheel that passes every content check (platform-tagged, Root-Is-Purelib: false,
a real x86_64 ELF .so inside: a copy of the container's libz). Both carry a `fleetfix_tiny_cuda` module
that answers the playbook's import check and an `__init__` that writes a marker with its uid at import.
They report the victim's key (all three share the real torch venv and the same arch list). Then
`apply build-extensions` on the victim must build its own wheel, and the marker must never appear there.
Before the trust model the victim reported "installed from the wheel cache (built on <attacker>)" and the
marker said uid 0.

Then the two settings that take the choice away from builders altogether: the controller holds the source
(`extension_sources`, pinned), so the attacker's planted source is not what its build uses and the manifest
records the sha256 the controller measured; and the CI wheelhouse only (`wheels: build: never`), under
which the victim is refused before anything changes until a --wheelhouse has its key, and builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
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
)
from tests.e2e.test_wheel_cache import BUILD, TINY, TOOLKIT, inventory
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.cli import TINY_EXTENSION_IN_CT, add_tiny_extension_source, tiny_extension_sdist
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch

pytestmark = [pytest.mark.slow]

MARKER = "/var/tmp/fleetfix-wheel-trust-marker"
EVIL_INIT = f"""\
import os
with open({MARKER!r}, "a") as marker:
    marker.write("imported as uid %d\\n" % os.getuid())
"""
EVIL_CUDA = "def built_with_cuda():\n    return '13000'\n"
PURE_SETUP = """\
from setuptools import setup
setup(name="fleetfix-tiny-ext", version="0.1.0", packages=["fleetfix_tiny"],
      py_modules=["fleetfix_tiny_cuda"])
"""
# has_ext_modules makes bdist_wheel tag the wheel for this platform and write Root-Is-Purelib: false.
BINARY_SETUP = """\
import glob, shutil
from setuptools import Distribution, setup
class Binary(Distribution):
    def has_ext_modules(self):
        return True
native = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libz.so.1*")) + ["/lib/x86_64-linux-gnu/libc.so.6"]
shutil.copy(native[0], "fleetfix_tiny/_native.so")
setup(name="fleetfix-tiny-ext", version="0.1.0", packages=["fleetfix_tiny"],
      py_modules=["fleetfix_tiny_cuda"], package_data={"fleetfix_tiny": ["_native.so"]}, distclass=Binary)
"""


def plant(ct: Container, setup_py: str) -> None:
    ct.sh(f"rm -rf {TINY_EXTENSION_IN_CT} && mkdir -p {TINY_EXTENSION_IN_CT}/fleetfix_tiny")
    ct.write_file(f"{TINY_EXTENSION_IN_CT}/setup.py", setup_py)
    ct.write_file(f"{TINY_EXTENSION_IN_CT}/fleetfix_tiny/__init__.py", EVIL_INIT)
    ct.write_file(f"{TINY_EXTENSION_IN_CT}/fleetfix_tiny_cuda.py", EVIL_CUDA)


def wheel_events(state: Path, result: CliResult) -> dict[str, dict[str, Any]]:
    run_id = result.json()["run_id"]
    lines = (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return {event["target"]: event for event in map(json.loads, lines) if event["kind"] == "wheel"}


@pytest.mark.timeout(2400)
def test_a_malicious_builder_cannot_get_code_into_another_container(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch,  # noqa: F811
    real_repo: AptRepo, tmp_path: Path,  # noqa: F811
) -> None:
    pure, binary, victim = cts = [make_ct(share=(str(real_torch.venv),)) for _ in range(3)]
    for ct in cts:
        add_tiny_extension_source(ct)
    plant(pure, PURE_SETUP)
    plant(binary, BINARY_SETUP)
    inv_all = inventory(tmp_path / "all.yaml", lab, [(ct, "9.0") for ct in cts], real_torch.python)
    inv_attackers = inventory(tmp_path / "attackers.yaml", lab, [(pure, "9.0"), (binary, "9.0")],
                              real_torch.python)
    inv_victim = inventory(tmp_path / "victim.yaml", lab, [(victim, "9.0")], real_torch.python)
    state, cache = tmp_path / "state", tmp_path / "wheels"
    common = ["--state-dir", str(state), "--wheel-cache", str(cache), "--var", f"extensions={TINY}",
              "--var", "pip_args=--no-index", "--var", "upstream_wheels=false", "--json"]
    toolkit = run_cli("apply", TOOLKIT, "-i", str(inv_all), "--state-dir", str(state),
                      "--var", f"cuda_repo_base={real_repo.base_url}", timeout=900)
    assert toolkit.exit_code == 0, toolkit.stdout[-3000:] + toolkit.stderr[-3000:]

    # 1. The attackers build first; each installs its own wheel (it is its own machine).
    attack = run_cli("apply", BUILD, "-i", str(inv_attackers), *common, timeout=1500)
    assert attack.exit_code == 0, attack.stdout[-4000:] + attack.stderr[-3000:]

    # 2. The victim, same key, default settings: builds its own; the attackers' code never runs there.
    victim_run = run_cli("apply", BUILD, "-i", str(inv_victim), *common, timeout=1500)
    assert victim_run.exit_code == 0, victim_run.stdout[-4000:] + victim_run.stderr[-3000:]
    planted = victim.sh(f"cat {MARKER} 2>/dev/null", check=False).stdout.decode()
    assert planted == "", f"attacker code ran on the victim: {planted.strip()}"
    (event,) = wheel_events(state, victim_run).values()
    assert event["action"] == "built", event
    assert import_tiny(victim, real_torch) == "13000"  # the real, compiled extension
    assert victim.sh(f"test ! -e {MARKER}", check=False).returncode == 0
    assert binary.sh(f"test -e {MARKER}", check=False).returncode == 0  # the plant works where it was put

    # 3. What the cache kept: the pure wheel not at all; the binary one, but only as its builder's, under
    #    the very key the victim had (so only trust kept it out), beside the victim's own.
    def name(ct: Container) -> str:
        return f"{lab.node().name}/{ct.ctid}"

    events = wheel_events(state, attack)
    assert events[name(pure)]["action"] == "built-not-cached"
    assert "pure-Python" in events[name(pure)]["reason"]
    assert events[name(binary)]["action"] == "built"
    listed = run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json()
    assert sorted(entry["built_on"] for entry in listed) == sorted([name(binary), name(victim)])
    assert all(entry["key"] == event["key"] and entry["source"] == "build" for entry in listed)

    # 4. The controller holds the source, pinned: the binary attacker's planted source is still there, and
    #    its build uses the controller's bytes instead; the manifest records their sha256 as measured here.
    started = time.monotonic()
    sdist = tiny_extension_sdist(tmp_path)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    binary.sh(f"{real_torch.python} -m pip uninstall -y -q fleetfix-tiny-ext && rm -f {MARKER}")
    inv_binary = inventory(tmp_path / "binary.yaml", lab, [(binary, "9.0")], real_torch.python)
    document = yaml.safe_load(inv_binary.read_text())  # the operator's inventory names the source
    document["defaults"]["vars"] = {
        "extension_sources": {TINY_EXTENSION_IN_CT: {"url": str(sdist), "sha256": digest}}}
    inv_binary.write_text(yaml.safe_dump(document))
    sourced = run_cli("apply", BUILD, "-i", str(inv_binary), *common, timeout=1500)
    assert sourced.exit_code == 0, sourced.stdout[-4000:] + sourced.stderr[-3000:]
    (event,) = wheel_events(state, sourced).values()
    assert event["action"] == "built" and event["key"]["sdist_sha256"] == digest, event
    assert event["sdist"] == {"location": str(sdist), "sha256": digest, "size": sdist.stat().st_size}
    assert import_tiny(binary, real_torch) == "13000"
    assert binary.sh(f"test ! -e {MARKER}", check=False).returncode == 0  # the real extension, not the plant
    listed = run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json()
    (entry,) = [entry for entry in listed if entry["sdist_sha256"] == digest]
    assert (entry["sdist"], entry["built_on"]) == (str(sdist), name(binary))
    print(f"\n[measure] step 4 (one build from the controller's sdist): {time.monotonic() - started:.0f} s")

    # 5. The CI wheelhouse only: the victim, its extension removed, is refused before anything changes (its
    #    own cached build is not used either), then installs the wheel a --wheelhouse has for its key.
    started = time.monotonic()
    victim.sh(f"{real_torch.python} -m pip uninstall -y -q fleetfix-tiny-ext")
    document = yaml.safe_load(inv_victim.read_text())
    document["wheels"] = {"build": "never"}
    inv_never = tmp_path / "never.yaml"
    inv_never.write_text(yaml.safe_dump(document))
    refused = run_cli("apply", BUILD, "-i", str(inv_never), *common, timeout=900)
    assert refused.exit_code != 0, refused.stdout[-3000:]
    steps = {step["name"]: step for step in refused.json()["targets"][0]["steps"]}
    assert steps["build requirements installed"]["status"] == "skipped"
    assert steps["compiler present"]["status"] == "skipped"
    failed = steps["extensions built"]
    assert failed["status"] == "failed" and "wheels: build: never" in failed["reason"], failed
    assert "nothing changed: build it in CI for this key" in failed["reason"]
    assert [event["action"] for event in wheel_events(state, refused).values()] == ["refused-no-build"]
    assert victim.sh(f"{real_torch.python} -c 'import fleetfix_tiny_cuda'", check=False).returncode != 0
    house = tmp_path / "ci-wheelhouse"
    (own,) = [entry for entry in listed if entry["built_on"] == name(victim)]
    own_dir = cache / WheelCache.entry_name(own["key"], own["builder"])
    shutil.copytree(own_dir, house / own_dir.name)  # what a CI run of this key would have left
    installed = run_cli("apply", BUILD, "-i", str(inv_never), *common, "--wheelhouse", str(house),
                        timeout=900)
    assert installed.exit_code == 0, installed.stdout[-4000:] + installed.stderr[-3000:]
    (event,) = wheel_events(state, installed).values()
    assert event["action"] == "installed-from-cache" and event["entry"] == own_dir.name, event
    assert import_tiny(victim, real_torch) == "13000"
    assert victim.sh(f"test ! -e {MARKER}", check=False).returncode == 0
    print(f"[measure] step 5 (two applies under build: never): {time.monotonic() - started:.0f} s")
