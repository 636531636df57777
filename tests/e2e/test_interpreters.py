"""Interpreter discovery on the test bed: torch in an env the inventory does not name is found and judged
like a named one (its whole chain, its interpreter named in each finding); an inventory that pins
`pythons` inspects exactly those and discovers nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import run_cli, write_inventory
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch, ensure_real_torch
from tests.lab.torch_stub import install_fla, install_torch

VENV = "/opt/train/venv"
VENV_SITE = f"{VENV}/lib/python3.11/site-packages"


def torch_in_a_venv(ct: Container) -> None:
    ct.sh(f"/usr/bin/python3 -m venv --without-pip {VENV}")
    install_torch(ct, "2.11.0+cu128", "12.8", site=VENV_SITE)
    install_fla(ct, site=VENV_SITE)


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


def test_torch_in_an_unnamed_venv_gets_its_whole_chain_and_pythons_pins_the_list(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct(setup=torch_in_a_venv)
    python = f"{VENV}/bin/python3"
    default = write_inventory(tmp_path / "default.yaml", lab, [(ct.ctid, {})])
    [report] = run_cli("probe", "-i", str(default), "--json").json()["targets"]
    # Before, this target said "torch found in /opt/train/venv, not inspected" and "nothing CUDA-related
    # to check". Now the venv is inspected: its CUDA 12.8 torch has no toolkit here, and fla there lacks
    # causal-conv1d, a finding whose evidence and fix name the venv's interpreter.
    env = next(p for p in report["facts"]["pythons"] if p["interpreter"] == python)
    assert env["discovered"] == "venv" and env["torch"]["cuda"] == "12.8"
    assert "TORCH_NOT_FOUND" not in codes(report)
    runtime = next(f for f in report["findings"] if f["code"] == "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert runtime["evidence"]["torch_version"] == "2.11.0+cu128"
    missing = next(f for f in report["findings"] if f["code"] == "EXTENSION_MISSING")
    assert missing["evidence"]["interpreter"] == python and missing["fix"]["vars"]["python"] == python
    [found] = [d for d in report["facts"]["discovered_pythons"] if d["prefix"] == VENV]
    assert found["inspected"] is True

    pinned = write_inventory(tmp_path / "pinned.yaml", lab, [(ct.ctid, {"pythons": ["python3"]})])
    [report] = run_cli("probe", "-i", str(pinned), "--json").json()["targets"]
    assert [p["interpreter"] for p in report["facts"]["pythons"]] == ["python3"]
    assert report["facts"]["discovered_pythons"] == []
    assert codes(report) == ["TORCH_NOT_FOUND"]

    named = write_inventory(tmp_path / "named.yaml", lab, [(ct.ctid, {"pythons": ["python3", python]})])
    [report] = run_cli("probe", "-i", str(named), "--json").json()["targets"]
    env = next(p for p in report["facts"]["pythons"] if p["interpreter"] == python)
    assert env["discovered"] is None and "CUDA_RUNTIME_WITHOUT_TOOLKIT" in codes(report)


@pytest.fixture(scope="module")
def real_torch() -> RealTorch:
    return ensure_real_torch()


def test_the_real_torch_venv_unnamed_is_judged_like_a_named_one(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path, real_torch: RealTorch,
) -> None:
    # The real torch 2.14.1 cu130 wheel (tests/lab/realtorch.py), in a venv under /opt that no inventory
    # names: the probe runs that interpreter, which reads its own torch, and judges it.
    ct = make_ct(share=(str(real_torch.venv),))
    python = f"{real_torch.venv}/bin/python3"
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(ct.ctid, {})])
    [report] = run_cli("probe", "-i", str(inventory), "--json").json()["targets"]
    env = next(p for p in report["facts"]["pythons"] if p["interpreter"] == python)
    assert env["discovered"] == "venv" and env["error"] is None
    assert env["torch"]["version"].startswith(real_torch.version) and env["torch"]["cuda"] == real_torch.cuda
    runtime = next(f for f in report["findings"] if f["code"] == "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert runtime["evidence"]["torch_version"] == env["torch"]["version"]
    assert runtime["fix"]["vars"]["cuda_version"] == real_torch.cuda
