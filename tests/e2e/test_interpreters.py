"""Interpreter discovery on the test bed: torch in a venv the inventory does not name is found (as a
fact, without running that interpreter) and named as a finding; naming it in the inventory makes the
probe inspect it, and its own problems appear."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.conftest import run_cli, write_inventory
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.torch_stub import install_fla, install_torch

VENV = "/opt/train/venv"
VENV_SITE = f"{VENV}/lib/python3.11/site-packages"


def torch_in_a_venv(ct: Container) -> None:
    ct.sh(f"/usr/bin/python3 -m venv --without-pip {VENV}")
    install_torch(ct, "2.11.0+cu128", "12.8", site=VENV_SITE)
    install_fla(ct, site=VENV_SITE)


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


def test_torch_in_an_unnamed_venv_is_found_and_the_inventory_decides_what_is_inspected(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct(setup=torch_in_a_venv)
    default = write_inventory(tmp_path / "default.yaml", lab, [(ct.ctid, {})])
    [report] = run_cli("probe", "-i", str(default), "--json").json()["targets"]
    # Before issue 17 this target looked healthy: python3 has no torch.
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" not in codes(report)
    venv = next(d for d in report["facts"]["discovered_pythons"] if d["prefix"] == VENV)
    assert (venv["source"], venv["torch"]["cuda"]) == ("venv", "12.8")
    finding = next(f for f in report["findings"]
                   if f["code"] == "TORCH_IN_UNINSPECTED_ENV" and f["evidence"]["prefix"] == VENV)
    assert finding["severity"] == "warning" and f"{VENV}/bin/python3" in finding["fix"]["hint"]

    named = write_inventory(tmp_path / "named.yaml", lab,
                            [(ct.ctid, {"pythons": ["python3", f"{VENV}/bin/python3"]})])
    [report] = run_cli("probe", "-i", str(named), "--json").json()["targets"]
    assert not [f for f in report["findings"]
                if f["code"] == "TORCH_IN_UNINSPECTED_ENV" and f["evidence"]["prefix"] == VENV]
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" in codes(report)   # the venv's own problem, now judged
