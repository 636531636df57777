"""--deep on the test bed with the real torch 2.14.1 cu130: every /dev/nvidia* node is there but CUDA does
not initialise (here there is no GPU behind them, as where a cgroup rule refuses the nodes), and the probe
says so instead of calling the target fine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import run_cli, write_inventory
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch, ensure_real_torch


@pytest.fixture(scope="module")
def real_torch() -> RealTorch:
    return ensure_real_torch()


def test_deep_no_cuda_with_every_device_node_present_is_an_error(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path, real_torch: RealTorch,
) -> None:
    ct = make_ct(share=(str(real_torch.venv),))
    ct.sh(": > /dev/nvidia0; : > /dev/nvidiactl; : > /dev/nvidia-uvm")
    python = f"{real_torch.venv}/bin/python3"
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(ct.ctid, {"pythons": [python]})])
    [shallow] = run_cli("probe", "-i", str(inventory), "--json").json()["targets"]
    assert "CUDA_UNAVAILABLE_WITH_DEVICES" not in [f["code"] for f in shallow["findings"]]   # needs --deep

    [report] = run_cli("probe", "-i", str(inventory), "--deep", "--json").json()["targets"]
    env = report["facts"]["pythons"][0]
    assert env["deep"]["cuda_available"] is False and env["deep"]["error"] is None   # real torch answered
    finding = next(f for f in report["findings"] if f["code"] == "CUDA_UNAVAILABLE_WITH_DEVICES")
    assert finding["severity"] == "error" and finding["evidence"]["interpreter"] == python
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(finding["evidence"]["devices"])
    assert "lxc.cgroup2.devices.allow" in finding["fix"]["hint"]
