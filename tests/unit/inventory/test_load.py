"""The inventory loader: one-line errors with file:line:field, vars layering, groups, paths, ad-hoc targets.

Nothing here connects anywhere: the inventories use documentation addresses (10.1.2.x) only as data.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetfix.errors import ConfigError, InventoryError
from fleetfix.inventory.load import (
    Inventory,
    adhoc_targets,
    load_inventory,
    local_target,
    parse_inventory,
    resolve_inventory_path,
)
from fleetfix.target import NODE, GuestRef

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "inventory"
BAD = sorted((FIXTURES / "bad").glob("*.yaml"))
EXPECT = re.compile(r"# expect: (\d+) (?:-|(\S+):) (.*)")


def by_name(inventory: Inventory) -> dict[str, Any]:
    return {target.name: target for target in inventory.targets}


# --- every validation error is one line naming file, line and field --------------------------------


@pytest.mark.parametrize("path", BAD, ids=[path.stem for path in BAD])
def test_bad_inventory_gives_one_line_with_file_line_and_field(path: Path) -> None:
    # Each fixture's first line says what the error must be: "# expect: LINE FIELD: message part",
    # with "-" for FIELD when the error has none.
    header = EXPECT.match(path.read_text().splitlines()[0])
    assert header, f"{path.name} lacks its '# expect:' header"
    line, field, message = header.groups()
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    text = str(caught.value)
    prefix = f"{path}:{line}: " + (f"{field}: " if field else "")
    assert "\n" not in text
    assert text.startswith(prefix), text
    assert message in text, text
    assert caught.value.exit_code == 2


def test_bad_fixtures_cover_the_required_cases() -> None:
    required = {"unknown_key", "wrong_type", "duplicate_node", "duplicate_target", "duplicate_key",
                "ctid_too_small", "bad_yaml"}
    assert required <= {path.stem for path in BAD}


@pytest.mark.parametrize(("text", "expected"), [
    # a misspelt key alone: named first (not "nodes.0.address: Field required"), with the likely field
    ("nodes:\n  - name: pve1\n    adress: 10.1.2.6\n",
     "inv.yaml:3: nodes.0.adress: unknown field (did you mean 'address'?)"),
    ("nodes:\n  - {name: pve1, address: 10.1.2.6, containers: [{ctid: 200, nmae: a}]}\n",
     "inv.yaml:2: nodes.0.containers.0.nmae: unknown field (did you mean 'name'?)"),
    ("defaults: {identity_fil: k}\nnodes: [{name: pve1, address: 10.1.2.6}]\n",
     "inv.yaml:1: defaults.identity_fil: unknown field (did you mean 'identity_file'?)"),
    ("nodes: [{name: pve1, address: 10.1.2.6}]\ngroups:\n  g: {targetz: [pve1]}\n",
     "inv.yaml:3: groups.g.targetz: unknown field (did you mean 'targets'?)"),
    ("proxmox:\n  - {name: c, via_ssh: pve1, filtre: {}}\n",
     "inv.yaml:2: proxmox.0.filtre: unknown field (did you mean 'filter'?)"),
    # nothing close: the fields it could have been
    ("nodes: [{name: pve1, address: 10.1.2.6}]\ncolour: red\n",
     "inv.yaml:2: colour: unknown field (expected one of: defaults, nodes, proxmox, groups, wheels)"),
])
def test_unknown_keys_are_named_first_with_a_suggestion(text: str, expected: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert str(caught.value) == expected


def test_missing_file_is_one_line_inventory_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError, match=r"^.*nope\.yaml: file not found$"):
        load_inventory(missing)


def test_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "inventory.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(InventoryError, match="empty"):
        load_inventory(empty)


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "nodes:\x0c\n"], ids=["deep", "control-char"])
def test_hostile_yaml_is_one_line_inventory_error(text: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert str(caught.value).startswith("inv.yaml")
    assert "\n" not in str(caught.value)


def test_duplicate_key_is_an_inventory_error_not_just_a_config_error() -> None:
    # The CLI and callers catch InventoryError for every problem in the file.
    with pytest.raises(InventoryError, match=r"^inv\.yaml:3: nodes\.0\.name: duplicate key 'name'$"):
        parse_inventory("nodes:\n  - name: a\n    name: b\n    address: 10.1.2.6\n", "inv.yaml")


@pytest.mark.parametrize(("snippet", "field"), [
    ("    port: 0\n", "nodes.0.port"),
    ("    port: true\n", "nodes.0.port"),  # a YAML boolean is not a port, even though bool is an int
    ("    user: 0\n", "nodes.0.user"),
    ("    tags: gpu\n", "nodes.0.tags"),
    ("    address2: x\n", "nodes.0.address2"),
    ("    connect_timeout: 0\n", "nodes.0.connect_timeout"),
    ("    identity_file: ''\n", "nodes.0.identity_file"),
    ("    vars: {1x: 2}\n", "nodes.0.vars.1x"),
    ("    containers: {ctid: 200}\n", "nodes.0.containers"),
    ("    containers: [{ctid: 1000000000}]\n", "nodes.0.containers.0.ctid"),
    ("    containers: [{ctid: 200, name: 'a/b'}]\n", "nodes.0.containers.0.name"),
])
def test_node_field_errors_point_at_line_four(snippet: str, field: str) -> None:
    text = "nodes:\n  - name: pve1\n    address: 10.1.2.6\n" + snippet
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert str(caught.value).startswith(f"inv.yaml:4: {field}"), str(caught.value)


def test_address_that_looks_like_an_ssh_option_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"nodes\.0\.address: expected a host name"):
        parse_inventory("nodes:\n  - name: a\n    address: -oProxyCommand=touch\n", "inv.yaml")


def test_group_name_equal_to_a_target_name_is_refused() -> None:
    text = "nodes:\n  - name: pve1\n    address: 10.1.2.6\ngroups:\n  pve1: {targets: [pve1]}\n"
    with pytest.raises(InventoryError, match=r"^inv\.yaml:5: groups\.pve1: .*also a target name"):
        parse_inventory(text, "inv.yaml")


def test_group_whose_exclusions_remove_everything_is_refused() -> None:
    text = "nodes:\n  - name: pve1\n    address: 10.1.2.6\ngroups:\n  g: {targets: [pve1, '!pve1']}\n"
    with pytest.raises(InventoryError, match=r"groups\.g\.targets: the exclusions leave this group empty"):
        parse_inventory(text, "inv.yaml")


# --- the shipped example -------------------------------------------------------------------------


def test_example_inventory_loads() -> None:
    inventory = load_inventory(REPO / "inventory.example.yaml")
    targets = by_name(inventory)
    assert list(targets) == ["train-a", "pve1/201", "pve2", "pve2/300", "gpu-host"]
    assert targets["train-a"].vars["python"] == "/opt/venv/bin/python"
    assert targets["pve1/201"].vars["python"] == "python3"
    assert targets["pve2/300"].node.ssh.jump_host == "admin@10.1.2.1:22"
    assert inventory.groups["serving"] == ["pve2/300"]
    assert inventory.groups["gpu"] == ["train-a", "pve1/201", "pve2/300", "gpu-host"]


# --- layering, targets, groups --------------------------------------------------------------------


@pytest.fixture
def layered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Inventory:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return load_inventory(FIXTURES / "layered.yaml")


def test_vars_layer_defaults_groups_node_container(layered: Inventory) -> None:
    targets = by_name(layered)
    # train-a is in both groups: the container's own value wins over everything.
    assert targets["train-a"].vars == {
        "layer": "container", "python": "/opt/venv/bin/python",
        "from_defaults": 1, "from_group_a": 1, "from_group_b": 1, "from_node": 1, "from_container": 1,
    }
    # pve1/201 has no container vars: the node layer wins over both groups.
    assert targets["pve1/201"].vars["layer"] == "node"
    # pve2/300: no groups with vars, no node vars: defaults show through.
    assert targets["pve2/300"].vars == {"layer": "defaults", "from_defaults": 1, "python": "python3"}


@pytest.mark.parametrize(("groups", "winner"), [
    ("  alpha: {targets: [pve1], vars: {layer: alpha, only_alpha: 1}}\n"
     "  beta: {targets: [pve1], vars: {layer: beta}}\n", "beta"),
    ("  beta: {targets: [pve1], vars: {layer: beta}}\n"
     "  alpha: {targets: [pve1], vars: {layer: alpha, only_alpha: 1}}\n", "alpha"),
])
def test_later_group_wins_over_earlier_group(groups: str, winner: str) -> None:
    text = "defaults: {vars: {layer: defaults}}\nnodes:\n  - {name: pve1, address: 10.1.2.6}\ngroups:\n"
    (target,) = parse_inventory(text + groups).targets
    assert target.vars == {"layer": winner, "only_alpha": 1}  # definition order decides, not names


def test_nested_var_values_replace_and_are_not_shared(layered: Inventory) -> None:
    text = """
defaults: {vars: {pip: {index: a, extra: [x]}}}
nodes:
  - name: pve1
    address: 10.1.2.6
    containers:
      - {ctid: 200, vars: {pip: {index: b}}}
      - {ctid: 201}
      - {ctid: 202}
"""
    targets = by_name(parse_inventory(text))
    assert targets["pve1/200"].vars["pip"] == {"index": "b"}  # replaced, not deep-merged
    targets["pve1/201"].vars["pip"]["extra"].append("y")
    assert targets["pve1/202"].vars["pip"]["extra"] == ["x"]


def test_targets_order_names_and_include_node(layered: Inventory) -> None:
    names = [target.name for target in layered.targets]
    # pve1's containers only; pve2 itself (include_node) then its CT; gpu-host has no CTs so is a target.
    assert names == ["train-a", "pve1/201", "pve1/202", "pve2", "pve2/300", "gpu-host"]
    targets = by_name(layered)
    assert targets["pve2"].guest.is_node
    assert targets["pve2/300"].guest == GuestRef.lxc(300)
    assert all(target.source == str(FIXTURES / "layered.yaml") for target in layered.targets)


def test_containers_of_a_node_share_one_node_ref(layered: Inventory) -> None:
    targets = by_name(layered)
    assert targets["train-a"].node is targets["pve1/201"].node is targets["pve1/202"].node
    assert targets["pve2"].node is targets["pve2/300"].node
    assert targets["train-a"].node is not targets["pve2"].node


def test_ssh_settings_inherit_defaults_and_expand_paths(layered: Inventory, tmp_path: Path) -> None:
    targets = by_name(layered)
    pve1 = targets["train-a"].node.ssh
    assert pve1 is not None
    assert (pve1.address, pve1.port, pve1.user) == ("10.1.2.6", 22, "deploy")
    assert pve1.identity_file == str(FIXTURES / "keys" / "fleet_ed25519")  # relative to the file
    assert pve1.known_hosts == str(tmp_path / "home" / "fleet_known_hosts")  # ~ expanded
    assert pve1.jump_host == "admin@bastion.example:2200"
    pve2 = targets["pve2"].node.ssh
    assert pve2 is not None
    assert (pve2.port, pve2.user, pve2.jump_host) == (2222, "root", None)  # explicit null beats defaults


def test_tags_and_group_membership(layered: Inventory) -> None:
    targets = by_name(layered)
    assert targets["train-a"].tags == {"a100", "training"}  # node tags are inherited
    assert targets["pve2"].tags == frozenset()
    assert targets["train-a"].groups == {"second_listed_first", "everything_on_pve1", "gpu"}
    assert targets["pve1/202"].groups == frozenset()  # excluded by !ctid:202, and not a training CT
    assert layered.groups == {
        "second_listed_first": ["train-a", "pve1/201"],
        "everything_on_pve1": ["train-a", "pve1/201"],
        "gpu": ["train-a", "pve1/201", "gpu-host"],
    }


def test_inventory_select_uses_groups(layered: Inventory) -> None:
    assert [t.name for t in layered.select("gpu,!tag:notebooks")] == ["train-a", "gpu-host"]
    with pytest.raises(ConfigError, match="matched no targets"):
        layered.select("group:nothing-here")


# --- path resolution ------------------------------------------------------------------------------


def test_resolve_prefers_cli_then_env_then_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("cli.yaml", "env.yaml", "inventory.yaml"):
        (tmp_path / name).write_text("nodes: []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEETFIX_INVENTORY", str(tmp_path / "env.yaml"))
    assert resolve_inventory_path(str(tmp_path / "cli.yaml")) == tmp_path / "cli.yaml"
    assert resolve_inventory_path(None) == tmp_path / "env.yaml"
    monkeypatch.delenv("FLEETFIX_INVENTORY")
    assert resolve_inventory_path(None).resolve() == tmp_path / "inventory.yaml"


@pytest.mark.parametrize(("cli", "env", "origin"), [
    ("missing-cli.yaml", None, "--inventory"),
    (None, "missing-env.yaml", "$FLEETFIX_INVENTORY"),
    (None, None, "the default"),
])
def test_resolve_missing_file_says_where_the_path_came_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: str | None, env: str | None, origin: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv("FLEETFIX_INVENTORY", raising=False)
    else:
        monkeypatch.setenv("FLEETFIX_INVENTORY", env)
    with pytest.raises(InventoryError) as caught:
        resolve_inventory_path(cli)
    text = str(caught.value)
    assert "\n" not in text
    assert "not found" in text
    assert origin in text
    assert (cli or env or "inventory.yaml") in text


def test_resolve_refuses_a_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="not a file"):
        resolve_inventory_path(str(tmp_path))


# --- ad-hoc and local targets ---------------------------------------------------------------------


def test_adhoc_without_ctids_is_the_node_itself() -> None:
    (target,) = adhoc_targets("127.0.0.1", port=2222, user="admin", known_hosts="/k/known", accept_new=True)
    assert (target.name, target.guest, target.source) == ("127.0.0.1", NODE, "cli")
    assert target.node.ssh is not None
    assert (target.node.ssh.port, target.node.ssh.user, target.node.ssh.known_hosts) == (2222, "admin",
                                                                                         "/k/known")
    assert target.node.ssh.accept_new is True


def test_adhoc_ctids_share_one_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    targets = adhoc_targets("127.0.0.1", ctids=[201, 200], identity_file="~/.ssh/key", connect_timeout=3)
    assert [(t.name, t.guest.id) for t in targets] == [("127.0.0.1/201", 201), ("127.0.0.1/200", 200)]
    assert targets[0].node is targets[1].node
    assert targets[0].node.ssh is not None
    assert targets[0].node.ssh.identity_file == str(tmp_path / ".ssh" / "key")
    assert targets[0].node.ssh.connect_timeout == 3.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ctids": [99]}, "--ct 99"),
    ({"ctids": [200, 200]}, "given twice"),
    ({"port": 0}, "--port 0"),
    ({"user": "a b"}, "--user"),
])
def test_adhoc_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        adhoc_targets("127.0.0.1", **kwargs)


@pytest.mark.parametrize("host", ["", "-oProxyCommand=x", "a b", "host\nname"])
def test_adhoc_rejects_bad_hosts(host: str) -> None:
    with pytest.raises(ConfigError, match="--host"):
        adhoc_targets(host)


def test_vms_sit_beside_containers_with_the_same_names_tags_and_vars() -> None:
    text = """
defaults: {vars: {layer: defaults}}
nodes:
  - name: pve1
    address: 10.1.2.6
    tags: [a100]
    vars: {layer: node, from_node: 1}
    containers:
      - {ctid: 200, name: train-a}
    vms:
      - {vmid: 300, name: gpu-vm, tags: [passthrough], vars: {layer: vm}}
      - {vmid: 301}
groups:
  vms: {targets: ["ctid:300-399"], vars: {from_group: 1}}
"""
    inventory = parse_inventory(text)
    targets = by_name(inventory)
    assert list(targets) == ["train-a", "gpu-vm", "pve1/301"]  # the node has guests: not a target
    assert targets["gpu-vm"].guest == GuestRef.vm(300) and targets["pve1/301"].guest == GuestRef.vm(301)
    assert targets["train-a"].guest == GuestRef.lxc(200)
    assert targets["gpu-vm"].node is targets["train-a"].node  # one connection for the node's guests
    assert targets["gpu-vm"].tags == {"a100", "passthrough"}
    assert targets["gpu-vm"].vars == {"layer": "vm", "from_node": 1, "from_group": 1}
    assert targets["pve1/301"].vars == {"layer": "node", "from_node": 1, "from_group": 1}
    assert inventory.groups["vms"] == ["gpu-vm", "pve1/301"]


def test_a_node_with_only_vms_is_not_a_target_unless_asked() -> None:
    text = "nodes:\n  - {name: pve1, address: 10.1.2.6, vms: [{vmid: 300}]}\n"
    assert [t.name for t in parse_inventory(text).targets] == ["pve1/300"]
    with_node = parse_inventory(text.replace("vms:", "include_node: true, vms:"))
    assert [t.name for t in with_node.targets] == ["pve1", "pve1/300"]


def test_a_vm_name_clashing_with_a_container_name_is_refused() -> None:
    text = ("nodes:\n  - name: pve1\n    address: 10.1.2.6\n    containers: [{ctid: 200, name: a}]\n"
            "    vms: [{vmid: 300, name: a}]\n")
    expected = r"<inventory>:5: nodes\.0\.vms\.0\.name: duplicate target name 'a'"
    with pytest.raises(InventoryError, match=expected):
        parse_inventory(text)


def test_adhoc_vms_and_containers_share_one_node() -> None:
    targets = adhoc_targets("127.0.0.1", ctids=[200], vmids=[300, 301])
    assert [(t.name, t.guest) for t in targets] == [
        ("127.0.0.1/200", GuestRef.lxc(200)), ("127.0.0.1/300", GuestRef.vm(300)),
        ("127.0.0.1/301", GuestRef.vm(301))]
    assert targets[0].node is targets[1].node is targets[2].node


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"vmids": [99]}, "--vm 99: expected a Proxmox VM id"),
    ({"vmids": [300, 300]}, "--vm 300 is given twice"),
    ({"ctids": [300], "vmids": [300]}, "--vm 300 is also given as --ct 300: a node's containers and VMs"),
])
def test_adhoc_rejects_bad_vm_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        adhoc_targets("127.0.0.1", **kwargs)


def test_local_target() -> None:
    target = local_target()
    assert (target.name, target.node.name, target.node.ssh, target.guest) == ("local", "local", None, NODE)


# --- fuzz: whatever the file holds, the loader answers with an Inventory or one InventoryError ----

KEYS = ["defaults", "nodes", "groups", "name", "address", "port", "user", "identity_file", "known_hosts",
        "jump_host", "vars", "containers", "ctid", "tags", "targets", "include_node", "connect_timeout",
        "keepalive", "accept_new", "all", "pve1", "x"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10, max_value=10**10), st.floats(allow_nan=True),
    st.sampled_from(["pve1", "pve1/200", "10.1.2.6", "tag:gpu", "!pve1", "group:g", "ctid:200-300", "~/k",
                     "", "a b", "all", "tga:x", "2024-01-01"]),
    st.text(max_size=8),
)
yamlish = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.integers(100, 300)), children, max_size=5),
    ),
    max_leaves=30,
)


def assert_loads_or_one_line_error(text: str) -> None:
    try:
        inventory = parse_inventory(text, "fuzz.yaml")
    except InventoryError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("fuzz.yaml")
    else:
        assert inventory.targets  # a valid inventory always has at least one target


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(yamlish)
def test_fuzz_structured_documents(document: Any) -> None:
    assert_loads_or_one_line_error(yaml.safe_dump(document))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "äß\u00a0\ufeff", max_size=200))
def test_fuzz_raw_text(text: str) -> None:
    assert_loads_or_one_line_error(text)


EXAMPLE_LINES = (REPO / "inventory.example.yaml").read_text().splitlines()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(EXAMPLE_LINES) - 1), st.sampled_from(["drop", "dup", "cut"])),
                min_size=1, max_size=4))
def test_fuzz_mangled_example(edits: list[tuple[int, str]]) -> None:
    lines = list(EXAMPLE_LINES)
    for index, edit in edits:
        index %= len(lines)
        if edit == "drop":
            del lines[index]
        elif edit == "dup":
            lines.insert(index, lines[index])
        else:
            lines[index] = lines[index][: len(lines[index]) // 2]
        if not lines:
            break
    assert_loads_or_one_line_error("\n".join(lines))


def test_format_example_in_the_docs_loads(tmp_path: Path) -> None:
    docs = (REPO / "docs" / "inventory.md").read_text()
    block = re.search(r"## The format\n\n```yaml\n(.*?)```", docs, re.S)
    assert block, "docs/inventory.md lost its format example"
    inventory = parse_inventory(block.group(1), tmp_path / "inventory.yaml")
    targets = by_name(inventory)
    assert list(targets) == ["train-a", "pve1/201"]
    assert targets["train-a"].vars["python"] == "/opt/venv/bin/python"
    assert inventory.groups["training"] == ["train-a", "pve1/201"]
