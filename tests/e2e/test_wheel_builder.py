"""The dedicated builder on the test bed (docs/extensions.md, docs/security.md): with `wheels: builder:`,
each key is built in a throw-away clone of the CT template the operator trusts, never in a tenant's CT.

The template is a container with the real torch 2.14.1 (cu130) venv, the real nvcc 13.0 (cuda-toolkit.yaml)
and the tiny extension's source, turned into a template (`pct template`); two consumers have the same key.
`fleetfix apply build-extensions.yaml` must clone the template (`pct clone`), build the real extension in the
clone, destroy the clone, and install the clone's wheel on both consumers, which build nothing; a second
apply changes nothing, and check mode clones nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import CliResult, run_cli
from tests.e2e.test_build_extensions import (  # noqa: F401  # session fixtures, used by name
    import_tiny,
    real_repo,
    real_torch,
)
from tests.e2e.test_wheel_cache import BUILD, TINY, TOOLKIT, changed, inventory
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.cli import add_tiny_extension_source
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch

pytestmark = [pytest.mark.slow]

FIRST_CLONE_ID = 9900


def events(state: Path, result: CliResult, kind: str) -> list[dict[str, Any]]:
    run_id = result.json()["run_id"]
    lines = (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event["kind"] == kind]


def clone_calls(lab: Lab) -> list[list[str]]:
    return [call for call in lab.node().state.pct_calls() if call[:1] == ["clone"]]


@pytest.mark.timeout(2400)
def test_a_clone_of_the_template_builds_and_two_consumers_install_its_wheel(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch,  # noqa: F811
    real_repo: AptRepo, tmp_path: Path,  # noqa: F811
) -> None:
    template, *consumers, later = cts = [make_ct(share=(str(real_torch.venv),)) for _ in range(4)]
    earlier = len(clone_calls(lab))  # the session's node: other tests may have cloned on it before

    def clones() -> list[list[str]]:
        return clone_calls(lab)[earlier:]

    for ct in cts:
        add_tiny_extension_source(ct)
    node = lab.node()
    state, cache = tmp_path / "state", tmp_path / "wheels"
    inv_all = inventory(tmp_path / "all.yaml", lab, [(ct, "9.0") for ct in cts], real_torch.python)
    toolkit = run_cli("apply", TOOLKIT, "-i", str(inv_all), "--state-dir", str(state),
                      "--var", f"cuda_repo_base={real_repo.base_url}", timeout=900)
    assert toolkit.exit_code == 0, toolkit.stdout[-3000:] + toolkit.stderr[-3000:]
    assert lab.ssh(None, ["pct", "stop", str(template.ctid)]).returncode == 0
    assert lab.ssh(None, ["pct", "template", str(template.ctid)]).returncode == 0

    def with_builder(path: Path, targets: list[tuple[Container, str]]) -> list[str]:
        document = yaml.safe_load(inventory(path, lab, targets, real_torch.python).read_text())
        document["wheels"] = {"builder": {"node": node.name, "template": template.ctid,
                                          "first_id": FIRST_CLONE_ID}}
        path.write_text(yaml.safe_dump(document))
        return ["-i", str(path), "--state-dir", str(state), "--wheel-cache", str(cache), "--var",
                f"extensions={TINY}", "--var", "pip_args=--no-index", "--var", "upstream_wheels=false",
                "--json"]

    common = with_builder(tmp_path / "consumers.yaml", [(ct, "9.0") for ct in consumers])
    builder = f"clone:{node.name}/{template.ctid}"
    try:
        # Check mode clones nothing.
        checked = run_cli("apply", BUILD, *common, "--check", timeout=600)
        assert checked.exit_code == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
        assert clones() == []

        first = run_cli("apply", BUILD, *common, timeout=1800)
        assert first.exit_code == 0, first.stdout[-6000:] + first.stderr[-3000:]
        # One clone, of the template, into the first free id; gone afterwards.
        assert clones() == [["clone", str(template.ctid), str(FIRST_CLONE_ID), "--hostname",
                                     f"fleetfix-build-{FIRST_CLONE_ID}"]]
        assert node.state.id_owner(FIRST_CLONE_ID) is None
        assert f"fleetfix-build-{FIRST_CLONE_ID}" not in lab.ssh(None, ["pct", "list"]).stdout.decode()
        lifecycle = [(e["action"], e.get("ctid")) for e in events(state, first, "wheel-clone")]
        assert lifecycle == [("cloned", FIRST_CLONE_ID), ("destroyed", FIRST_CLONE_ID)]

        wheel_events = events(state, first, "wheel")
        by_target = {e["target"]: e for e in wheel_events}
        clone_event = by_target.pop(f"fleetfix-build-{FIRST_CLONE_ID}")
        assert clone_event["action"] == "built"  # the real extension, compiled in the clone
        assert sorted(by_target) == sorted(f"{node.name}/{ct.ctid}" for ct in consumers)
        for event in by_target.values():  # neither consumer built anything
            assert event["action"] == "installed-from-cache", event
            assert event["built_on"] == builder and event["key"] == clone_event["key"]
        for target in first.json()["targets"]:
            wheels_step = next(s for s in target["steps"] if "installed from the wheel cache" in s["reason"])
            assert f"built on {builder}" in wheels_step["reason"]
        for ct in consumers:
            assert import_tiny(ct, real_torch) == "13000"
        (entry,) = run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json()
        assert (entry["built_on"], entry["source"]) == (builder, "build")

        # A second apply changes nothing and clones nothing.
        again = run_cli("apply", BUILD, *common, timeout=600)
        assert again.exit_code == 0 and changed(again) == 0, again.stdout[-3000:]
        assert len(clones()) == 1

        # A consumer of another key (its arch list, an inventory var the clone runs with too) gets a clone of
        # its own, in the id the first one freed; the first two are left as they are.
        more = run_cli("apply", BUILD, *with_builder(tmp_path / "more.yaml", [
            *((ct, "9.0") for ct in consumers), (later, "8.0")]), timeout=1800)
        assert more.exit_code == 0 and changed(more) == 1, more.stdout[-6000:] + more.stderr[-3000:]
        assert clones()[1][:3] == ["clone", str(template.ctid), str(FIRST_CLONE_ID)]
        assert node.state.id_owner(FIRST_CLONE_ID) is None
        later_events = {e["target"]: e for e in events(state, more, "wheel")}
        assert later_events[f"fleetfix-build-{FIRST_CLONE_ID}"]["key"]["arch_list"] == "8.0"
        mine = later_events[f"{node.name}/{later.ctid}"]
        assert (mine["action"], mine["built_on"], mine["key"]["arch_list"]) == (
            "installed-from-cache", builder, "8.0")
        assert import_tiny(later, real_torch) == "13000"
    finally:
        for ctid in range(FIRST_CLONE_ID, FIRST_CLONE_ID + 100):
            if node.state.id_owner(ctid) == "CT":
                node.state.container(ctid).destroy()
