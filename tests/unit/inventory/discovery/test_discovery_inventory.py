"""The inventory's `proxmox:` section: parsing into sources, one-line errors, and how discovered targets
join static ones (names, duplicates, groups, vars)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pvefakes import ct

from fleetfix.errors import InventoryError
from fleetfix.inventory.discovery import discoverer
from fleetfix.inventory.discovery.model import (
    DiscoveryResult,
    Listing,
    ProxmoxSource,
    listing_from_records,
    targets_from_listing,
)
from fleetfix.inventory.load import Inventory, load_inventory, parse_inventory


class Recorder:
    """A discover function: records the sources it is given and answers from canned PVE records."""

    def __init__(self, *records: dict[str, object], addresses: dict[str, str] | None = None) -> None:
        self.records = list(records)
        self.addresses = addresses or {"pve1": "127.0.0.11", "pve2": "127.0.0.12"}
        self.sources: list[ProxmoxSource] = []

    def __call__(self, source: ProxmoxSource) -> DiscoveryResult:
        self.sources.append(source)
        found = listing_from_records(self.records)
        return targets_from_listing(source, Listing(found.guests, node_addresses=self.addresses))


API_SOURCE = """
proxmox:
  - name: cluster1
    api: https://127.0.0.1:8006
    token_id: fleetfix@pve!audit
    token_secret_env: PVE_TOKEN_SECRET
"""


def load(text: str, discover: Recorder | None = None) -> Inventory:
    return parse_inventory(text, "inv.yaml", discover=discover or Recorder())


def test_api_source_is_parsed_with_defaults_layered_under_its_ssh_section() -> None:
    recorder = Recorder()
    load(
        "defaults: {user: admin, port: 2200, known_hosts: kh}\n"
        + API_SOURCE
        + """
    verify_tls: true
    filter: {tags: [gpu], status: running, name: "train-*", nodes: [pve1]}
    ssh: {port: 22, identity_file: /keys/id}
    node_addresses: {pve1: 127.0.0.6}
    cache_ttl: 300
""",
        recorder,
    )
    (source,) = recorder.sources
    assert source.api is not None and source.ssh is None
    assert (source.api.host, source.api.port, source.api.user, source.api.token_name) == (
        "127.0.0.1",
        8006,
        "fleetfix@pve",
        "audit",
    )
    assert source.api.secret.env == "PVE_TOKEN_SECRET" and source.api.verify_tls
    assert source.filter.tags == ("gpu",) and source.filter.statuses == ("running",)
    assert source.filter.names == ("train-*",) and source.filter.nodes == ("pve1",)
    assert source.filter.kinds == ("lxc",)  # VMs only when the filter names them
    assert (source.node_ssh.user, source.node_ssh.port, source.node_ssh.identity_file) == (
        "admin",
        22,
        "/keys/id",
    )
    assert source.node_ssh.known_hosts == "kh"  # from defaults, relative to the inventory's folder (".")
    assert source.node_addresses == {"pve1": "127.0.0.6"} and source.cache_ttl == 300


def test_via_ssh_source_uses_the_nodes_settings_and_the_node_is_not_a_target() -> None:
    recorder = Recorder(ct(200, "train-a"))
    inventory = load(
        """
nodes:
  - {name: pve1, address: 127.0.0.1, port: 2222}
proxmox:
  - {name: local, via_ssh: pve1}
""",
        recorder,
    )
    (source,) = recorder.sources
    assert source.ssh is not None and source.ssh.pve_node == "pve1"
    assert source.ssh.node.ssh is not None and source.ssh.node.ssh.port == 2222
    assert [t.name for t in inventory.targets] == ["train-a"]  # pve1 itself is only the way in
    assert inventory.targets[0].node is source.ssh.node


def test_discovered_targets_join_static_ones_with_groups_and_vars() -> None:
    inventory = load(
        """
defaults: {vars: {python: python3, layer: defaults}}
nodes:
  - name: static
    address: 127.0.0.20
    containers: [{ctid: 100, name: old, tags: [gpu]}]
"""
        + API_SOURCE
        + """
    tags: [discovered]
    vars: {layer: source}
groups:
  gpu:
    targets: ["tag:gpu"]
    vars: {layer: group, torch: cu128}
""",
        Recorder(ct(200, "train-a", tags="gpu"), ct(201, "web"), ct(202, "off", status="stopped")),
    )
    by_name = {t.name: t for t in inventory.targets}
    assert list(by_name) == ["old", "train-a", "web"]
    assert by_name["train-a"].source == "proxmox:cluster1" and by_name["old"].source == "inv.yaml"
    assert by_name["train-a"].tags == frozenset({"gpu", "discovered"})
    assert inventory.groups["gpu"] == ["old", "train-a"]
    # defaults -> groups -> the source (the node layer of a discovered container)
    assert by_name["train-a"].vars == {"python": "python3", "layer": "source", "torch": "cu128"}
    assert by_name["web"].vars == {"python": "python3", "layer": "source"}
    assert [label for label, _ in inventory.skipped] == ["pve1/202"]
    assert inventory.discovered[0].source == "proxmox:cluster1"


def test_a_discovered_container_already_declared_statically_is_skipped() -> None:
    inventory = load(
        """
nodes:
  - name: pve1
    address: 127.0.0.11
    containers: [{ctid: 200, name: mine}]
"""
        + API_SOURCE,
        Recorder(ct(200, "train-a"), ct(201, "mine")),
    )
    assert [t.name for t in inventory.targets] == ["mine", "pve1/201"]
    reasons = dict(inventory.skipped)
    assert "already in the inventory as 'mine'" in reasons["train-a"]
    assert any("'mine' is already taken; using 'pve1/201'" in w for w in inventory.warnings)


def test_group_terms_matching_nothing_warn_instead_of_failing_with_sources() -> None:
    inventory = load(
        API_SOURCE
        + """
groups:
  gpu: {targets: ["tag:gpu"]}
""",
        Recorder(ct(200, "web")),
    )
    assert inventory.groups["gpu"] == []
    assert any("'tag:gpu' matched no targets" in w for w in inventory.warnings)


def test_a_discovered_name_equal_to_a_group_name_falls_back() -> None:
    inventory = load(API_SOURCE + "groups:\n  web: {targets: ['all']}\n", Recorder(ct(200, "web")))
    assert [t.name for t in inventory.targets] == ["pve1/200"]


@pytest.mark.parametrize(("snippet", "kinds"), [
    ("    filter: {guests: [lxc, vm]}\n", ("lxc", "vm")),
    ("    filter: {guests: vm}\n", ("vm",)),
])
def test_the_filter_can_take_vms_in(snippet: str, kinds: tuple[str, ...]) -> None:
    recorder = Recorder()
    load(API_SOURCE + snippet, recorder)
    assert recorder.sources[0].filter.kinds == kinds


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("    token_secret: abc\n", r"proxmox\.0\.token_secret: an inline secret is not accepted"),
        ("    via_ssh: pve1\n", r"proxmox\.0: expected exactly one of 'api'"),
        (
            "    verify_tls: false\n    ca_file: ca.pem\n",
            r"proxmox\.0\.verify_tls: verify_tls: false contradicts",
        ),
        (
            "    token_secret_file: f\n",
            r"proxmox\.0: expected exactly one of token_secret_env and token_secret_file",
        ),
        ("    pve_node: pve1\n", r"proxmox\.0\.pve_node: only for a 'via_ssh' source"),
        ("    filter: {status: paused}\n", r"proxmox\.0\.filter\.status"),
        ("    filter: {tags: gpu}\n", r"proxmox\.0\.filter\.tags"),
        ("    filter: {guests: [lxc, qemu]}\n", r"proxmox\.0\.filter\.guests"),
        (
            "    node_addresses: {pve1: '-oProxyCommand=x'}\n",
            r"proxmox\.0\.node_addresses\.pve1: expected a host",
        ),
        ("    cache_ttl: -1\n", r"proxmox\.0\.cache_ttl"),
        ("    filtre: {}\n", r"proxmox\.0\.filtre: unknown field"),
    ],
)
def test_api_source_errors_are_one_line(snippet: str, expected: str) -> None:
    with pytest.raises(InventoryError, match=r"^inv\.yaml:\d+: " + expected) as raised:
        load(API_SOURCE + snippet)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("api", "token"),
    [
        ("http://127.0.0.1:8006", "fleetfix@pve!audit"),
        ("https://user:pw@127.0.0.1", "fleetfix@pve!audit"),
        ("https://127.0.0.1:8006/some/path", "fleetfix@pve!audit"),
        ("https://127.0.0.1:99999", "fleetfix@pve!audit"),
        ("https://-oProxy/", "fleetfix@pve!audit"),
        ("https://127.0.0.1", "fleetfix@pve"),
        ("https://127.0.0.1", "fleetfix!audit"),
        ("https://127.0.0.1", "fleet fix@pve!audit"),
    ],
)
def test_bad_api_url_or_token_id(api: str, token: str) -> None:
    text = f"proxmox:\n  - name: c\n    api: '{api}'\n    token_id: '{token}'\n    token_secret_env: X\n"
    with pytest.raises(InventoryError, match=r"^inv\.yaml:\d: proxmox\.0\.(api|token_id): expected"):
        load(text)


def test_ipv6_api_and_default_port() -> None:
    recorder = Recorder()
    load("proxmox:\n  - {name: c, api: 'https://[::1]', token_id: a@pam!t, token_secret_env: X}\n", recorder)
    assert recorder.sources[0].api is not None
    assert recorder.sources[0].api.url == "https://[::1]:8006"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nodes:\n  - {name: pve1, address: 127.0.0.1}\nproxmox:\n  - {name: s, via_ssh: pve9}\n",
            r"proxmox\.0\.via_ssh: no node named 'pve9'",
        ),
        (
            "nodes:\n  - {name: pve1, address: 127.0.0.1}\n"
            "proxmox:\n  - {name: s, via_ssh: pve1, verify_tls: false}\n",
            r"proxmox\.0\.verify_tls: only for an 'api' source",
        ),
        (
            "nodes:\n  - {name: pve1, address: 127.0.0.1}\nproxmox:\n  - {name: s, via_ssh: pve1}\n"
            "  - {name: s, via_ssh: pve1}\n",
            r"proxmox\.1\.name: duplicate proxmox source 's'",
        ),
        ("defaults: {}\n", r"expected at least one node under 'nodes' or a 'proxmox' source"),
        ("nodes: []\n", r"nodes: expected at least one node"),
    ],
)
def test_source_level_errors(text: str, expected: str) -> None:
    with pytest.raises(InventoryError, match=expected):
        load(text)


def test_every_source_is_checked_before_any_is_discovered() -> None:
    recorder = Recorder()
    with pytest.raises(InventoryError, match=r"proxmox\.1\.via_ssh: no node named 'nope'"):
        load(API_SOURCE + "  - {name: second, via_ssh: nope}\n", recorder)
    assert recorder.sources == []  # no network traffic for a file that is wrong


def test_the_proxmox_example_in_the_docs_loads() -> None:
    import re

    docs = (Path(__file__).resolve().parents[4] / "docs" / "inventory.md").read_text()
    block = re.search(r"## Proxmox sources\n.*?```yaml\n(.*?)```", docs, re.S)
    assert block, "docs/inventory.md lost its proxmox example"
    recorder = Recorder(ct(200, "train-a", tags="gpu"))
    load("nodes:\n  - {name: pve3, address: 127.0.0.3}\n" + block.group(1), recorder)
    assert [s.name for s in recorder.sources] == ["cluster1", "pve3-local"]


def test_the_default_discoverer_gets_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `fleetfix probe --refresh` reaches the discoverer the loader makes when it is given none.
    made: list[bool] = []

    class Made(Recorder):
        def __init__(self, *, refresh: bool = False) -> None:
            super().__init__(ct(200, "train-a", node="pve1"))
            made.append(refresh)

    monkeypatch.setattr(discoverer, "Discoverer", Made)
    path = tmp_path / "inv.yaml"
    path.write_text(API_SOURCE)
    for refresh in (True, False):
        names = [target.name for target in load_inventory(path, refresh=refresh).targets]
        assert names == ["train-a"]
    assert made == [True, False]


def test_an_inventory_without_sources_does_not_load_discovery(tmp_path: Path) -> None:
    # Start-up: discovery's modules (dataclasses, hashing, the API clients) are for `proxmox:` sources.
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - {name: pve1, address: 127.0.0.1, containers: [{ctid: 200}]}\n")
    program = (
        "import sys\nfrom fleetfix.inventory.load import load_inventory\n"
        f"assert [t.name for t in load_inventory({str(path)!r}).targets] == ['pve1/200']\n"
        "print(*sorted(m for m in sys.modules if m.startswith('fleetfix.inventory.discovery')))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
