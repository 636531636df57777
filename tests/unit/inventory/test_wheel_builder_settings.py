"""`wheels: builder:` in the inventory: the CT template whose throw-away clones build every key
(docs/inventory.md). Documentation addresses only; nothing connects anywhere."""

from __future__ import annotations

import pytest

from fleetfix.errors import InventoryError
from fleetfix.inventory.load import parse_inventory
from fleetfix.target import WheelBuilder

NODES = """\
nodes:
  - name: pve1
    address: 10.1.2.6
    containers:
      - {ctid: 101, name: gpu-a, tags: [gpu]}
      - {ctid: 102, name: gpu-b, tags: [gpu]}
      - {ctid: 103, name: lab}
  - name: pve2
    address: 10.1.2.7
    containers:
      - {ctid: 201, name: gpu-c}
"""


def builders(text: str) -> dict[str, WheelBuilder | None]:
    inventory = parse_inventory(NODES + text, "inv.yaml")
    return {target.name: target.wheel_builder for target in inventory.targets}


def test_without_a_builder_no_target_has_one() -> None:
    assert set(builders("").values()) == {None}


def test_every_target_uses_the_builder_by_default_with_its_nodes_connection() -> None:
    found = builders("wheels:\n  builder: {node: pve1, template: 9000}\n")
    spec = found["gpu-c"]  # a target of another node still gets its wheels from pve1's clones
    assert spec is not None and set(found.values()) == {spec}
    assert (spec.template, spec.first_id, spec.ids, spec.storage) == (9000, 9900, 100, None)
    assert spec.node.name == "pve1" and spec.node.ssh is not None and spec.node.ssh.address == "10.1.2.6"
    assert spec.builder_id == "clone:pve1/9000"


def test_install_on_limits_who_uses_it_and_the_clone_settings_are_kept() -> None:
    found = builders("wheels:\n  builder: {node: pve2, template: 9001, first_id: 5000, ids: 10, "
                     "storage: local-zfs, install_on: ['tag:gpu']}\n")
    assert found["lab"] is None and found["gpu-c"] is None
    spec = found["gpu-a"]
    assert spec is not None and found["gpu-b"] == spec
    assert (spec.node.name, spec.template, spec.first_id, spec.ids, spec.storage) == (
        "pve2", 9001, 5000, 10, "local-zfs")


@pytest.mark.parametrize(("text", "expected"), [
    ("wheels:\n  builder: {node: pve9, template: 9000}\n",
     "inv.yaml:13: wheels.builder.node: 'pve9' is not a node under 'nodes'"),
    ("wheels:\n  builder: {node: pve1, template: 99}\n",
     "inv.yaml:13: wheels.builder.template: expected a Proxmox CT id"),
    ("wheels:\n  builder: {node: pve1, template: '9000'}\n",
     "inv.yaml:13: wheels.builder.template:"),
    ("wheels:\n  builder: {template: 9000}\n",
     "inv.yaml:13: wheels.builder.node:"),
    ("wheels:\n  builder: {node: pve1, template: 103}\n",
     "inv.yaml:13: wheels.builder.template: CT 103 on pve1 is the target 'lab': a template cannot run"),
    ("wheels:\n  builder: {node: pve1, template: 9950}\n",
     "inv.yaml:13: wheels.builder.first_id: the clones' ids 9900..9999 include the template 9950"),
    ("wheels:\n  builder: {node: pve1, template: 9000, first_id: 999999999, ids: 2}\n",
     "inv.yaml:13: wheels.builder.ids: first_id + ids - 1 = 1000000000 is over the largest id"),
    ("wheels:\n  builder: {node: pve1, template: 9000, ids: 0}\n",
     "inv.yaml:13: wheels.builder.ids:"),
    ("wheels:\n  builder: {node: pve1, template: 9000, install_on: [nope]}\n",
     "inv.yaml:13: wheels.builder.install_on.0: 'nope' matched no targets"),
    ("wheels:\n  builder: {node: pve1, template: 9000, clone: full}\n",
     "inv.yaml:13: wheels.builder.clone:"),
])
def test_a_bad_builder_is_one_line_naming_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(NODES + text, "inv.yaml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(expected), message
    assert caught.value.exit_code == 2
