"""`wheels: trust:` in the inventory: who may build wheels that which targets install (docs/inventory.md).
Documentation addresses only; nothing connects anywhere."""

from __future__ import annotations

import pytest

from fleetfix.errors import InventoryError
from fleetfix.inventory.load import parse_inventory

NODES = """\
nodes:
  - name: pve1
    address: 10.1.2.6
    containers:
      - {ctid: 100, name: builder}
      - {ctid: 101, name: gpu-a}
      - {ctid: 102, name: gpu-b}
      - {ctid: 103, name: lab}
groups:
  gpu: {targets: [gpu-a, gpu-b]}
"""


def trust(text: str) -> dict[str, frozenset[str]]:
    inventory = parse_inventory(NODES + text, "inv.yaml")
    return {target.name: target.wheel_builders for target in inventory.targets}


def test_by_default_nobody_installs_another_targets_build() -> None:
    assert set(trust("").values()) == {frozenset()}


def test_a_trusted_builder_for_a_group() -> None:
    found = trust("wheels:\n  trust:\n    - {builders: [builder], install_on: [gpu]}\n")
    assert found["gpu-a"] == {"builder"} and found["gpu-b"] == {"builder"}
    assert found["builder"] == frozenset() and found["lab"] == frozenset()


def test_a_group_that_shares_its_own_builds() -> None:
    found = trust("wheels:\n  trust:\n    - {builders: [gpu], install_on: [gpu]}\n")
    assert found["gpu-a"] == {"gpu-b"} and found["gpu-b"] == {"gpu-a"}  # never itself: that is implied
    assert found["builder"] == frozenset() and found["lab"] == frozenset()


def test_rules_add_up() -> None:
    found = trust("wheels:\n  trust:\n    - {builders: [builder], install_on: [gpu, lab]}\n"
                  "    - {builders: ['gpu-a'], install_on: ['gpu-b']}\n")
    assert found["gpu-b"] == {"builder", "gpu-a"} and found["lab"] == {"builder"}
    assert found["gpu-a"] == {"builder"}


@pytest.mark.parametrize(("text", "expected"), [
    ("wheels:\n  trust:\n    - {builders: [nope], install_on: [gpu]}\n",
     "inv.yaml:13: wheels.trust.0.builders.0: 'nope' matched no targets"),
    ("wheels:\n  trust:\n    - {builders: [builder], install_on: ['tga:x']}\n",
     "inv.yaml:13: wheels.trust.0.install_on.0: unknown selector 'tga:'"),
    ("wheels:\n  trust:\n    - {builders: [], install_on: [gpu]}\n",
     "inv.yaml:13: wheels.trust.0.builders:"),
    ("wheels:\n  trust:\n    - {builders: [builder]}\n",
     "inv.yaml:13: wheels.trust.0.install_on:"),
    ("wheels:\n  trusted: []\n", "inv.yaml:12: wheels.trusted:"),
    ("wheels:\n  build: no\n", "inv.yaml:12: wheels.build: Input should be 'allowed' or 'never'"),
    ("wheels:\n  build: never\n  builder: {node: pve1, template: 9000}\n",
     "inv.yaml:12: wheels.build: never: no wheel is built, so wheels.builder would never be used"),
])
def test_a_bad_rule_is_one_line_naming_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(NODES + text, "inv.yaml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(expected), message
    assert caught.value.exit_code == 2


def test_build_never_is_the_ci_wheelhouse_only_for_every_target() -> None:
    def builds(text: str) -> set[bool]:
        return {target.wheel_build for target in parse_inventory(NODES + text, "inv.yaml").targets}

    assert builds("") == {True} and builds("wheels:\n  build: allowed\n") == {True}
    assert builds("wheels:\n  build: never\n") == {False}
