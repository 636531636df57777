"""Issue 6's SSH discovery through the real CLI: `proxmox: [{via_ssh: <node>}]` runs `pvesh` on a test-bed
node over fleetfix's own SSH transport, and the discovered containers are targets for `exec`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from tests.e2e.conftest import run_cli
from tests.lab.bed import Lab

HOSTILE = "x;$(touch /canary)"  # a PVE name is untrusted input: it must never reach a shell


def ssh_inventory(path: Path, lab: Lab) -> Path:
    node = lab.node()
    document = {
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{"name": node.name, "address": node.address, "port": node.port}],
        "proxmox": [{"name": "lab", "via_ssh": node.name}],
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_ssh_discovery_lists_execs_and_never_runs_a_hostile_name(
    lab_factory: Callable[..., Lab], tmp_path: Path,
) -> None:
    lab = lab_factory()  # a private node: exactly these containers, nothing left over from other tests
    canary = Path("/canary")
    assert not canary.exists(), "a stale /canary on this machine would make this test meaningless"
    train = lab.add_container(None, 210, name="train-a", tags=("gpu", "training"))
    other = lab.add_container(None, 211, name="infer-b")
    lab.add_container(None, 212, name="idle-c", running=False)
    hostile = lab.add_container(None, 213, name=HOSTILE)
    inventory = str(ssh_inventory(tmp_path / "inventory.yaml", lab))
    env = {"FLEETFIX_STATE_DIR": str(tmp_path / "state")}

    listed = run_cli("inventory", "list", "-i", inventory, "--json", env=env)
    assert listed.exit_code == 0, listed.stdout + listed.stderr
    data = listed.json()
    targets = {t["name"]: t for t in data["targets"]}
    # The hostile name is replaced by node/vmid (with a warning); the node itself is not a target.
    assert set(targets) == {"train-a", "infer-b", "pve1/213"}
    for name, ctid in (("train-a", 210), ("infer-b", 211), ("pve1/213", 213)):
        target = targets[name]
        assert (target["source"], target["node"], target["ctid"]) == ("proxmox:lab", "pve1", ctid)
        assert (target["address"], target["port"]) == (lab.node().address, lab.node().port)
    assert {"gpu", "training"} <= set(targets["train-a"]["tags"])
    [skipped] = data["skipped"]
    assert skipped["target"] == "pve1/212" and skipped["reason"].startswith("stopped")
    assert "pve1/213" in listed.stderr and "not a safe name" in listed.stderr

    ran = run_cli("exec", "-i", inventory, "--json", "--", "cat", "/etc/hostname", env=env)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    outputs = {record["target"]: record["stdout"] for record in ran.json()}
    # Each command ran inside its own container (by vmid): every CT answers with its own hostname.
    assert outputs == {"train-a": "train-a\n", "infer-b": "infer-b\n", "pve1/213": HOSTILE + "\n"}

    text = run_cli("inventory", "list", "-i", inventory, env=env)
    assert text.exit_code == 0 and "skipped: pve1/212: stopped" in text.stdout

    # Nothing anywhere ran the name: no canary on the node (this machine) or in any container.
    assert not canary.exists()
    for ct in (train, other, hostile):
        assert not (ct.upper_dir / "canary").exists()
        assert ct.sh("test -e /canary", check=False).returncode == 1
