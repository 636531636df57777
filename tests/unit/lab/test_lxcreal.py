"""The real-LXC part of the test bed (tests/lab/lxcreal.py): its config and the argv `pct exec` runs."""

from __future__ import annotations

import os
from pathlib import Path

from tests.lab import lxcreal
from tests.lab.container import NodeState


def test_a_real_container_gets_an_lxc_config_over_the_same_overlay_layers(tmp_path: Path) -> None:
    node = NodeState.create(tmp_path / "pve", "pve1")
    ct = node.create_container(200, hostname="gpu-a", real_lxc=True)
    plain = node.create_container(201)
    assert ct.real_lxc and not plain.real_lxc
    config = Path(lxcreal.config_path(node.dir, 200)).read_text()
    assert f"lxc.rootfs.path = overlay:/:{ct.upper_dir}\n" in config
    assert "lxc.uts.name = gpu-a\n" in config and "lxc.net.0.type = none\n" in config
    assert f"lxc.include = {lxcreal.LXC_COMMON_CONFIG}\n" in config
    # The init LXC starts lives in the upper dir: the lower dir (this machine's /) is never written.
    init = ct.upper_dir / lxcreal.INIT_PATH
    assert init.read_text() == lxcreal.INIT_SCRIPT and os.access(init, os.X_OK)
    assert not Path("/", lxcreal.INIT_PATH).exists()
    ct.destroy()
    assert not Path(lxcreal.config_path(node.dir, 200)).exists() and not ct.real_lxc


def test_attach_argv_is_pcts_lxc_attach_with_the_nodes_lxcpath(tmp_path: Path) -> None:
    node_dir = str(tmp_path)
    assert lxcreal.attach_argv(node_dir, 200, True, ["sh", "-c", "x; y"]) == [
        "/usr/bin/lxc-attach", "-P", f"{node_dir}/lxc-real", "-n", "200", "--keep-env",
        "--", "sh", "-c", "x; y",
    ]
    assert "--clear-env" in lxcreal.attach_argv(node_dir, 200, False, ["env"])
