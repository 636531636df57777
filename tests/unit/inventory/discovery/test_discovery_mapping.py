"""From PVE records to targets: filters, skipped containers, and hostile names and tags."""

from __future__ import annotations

import pytest
from pvefakes import api_source, ct

from fleetfix.errors import DiscoveryError
from fleetfix.inventory.discovery.model import (
    SAFE_NAME,
    GuestFilter,
    Listing,
    PveGuest,
    guest_from_record,
    listing_from_records,
    parse_tags,
    targets_from_listing,
)
from fleetfix.inventory.model import NAME_PATTERN
from fleetfix.target import GuestRef

HOSTILE = "x;$(touch /tmp/canary)"
ADDRESSES = {"pve1": "127.0.0.11", "pve2": "127.0.0.12"}


def listing(*records: dict[str, object]) -> Listing:
    found = listing_from_records(list(records))
    return Listing(found.guests, node_addresses=ADDRESSES, malformed=found.malformed)


def test_safe_name_is_the_inventory_name_pattern() -> None:
    assert SAFE_NAME.pattern == NAME_PATTERN.pattern


@pytest.mark.parametrize(
    ("raw", "tags"),
    [
        ("gpu;training", ("gpu", "training")),
        ("gpu,training", ("gpu", "training")),
        ("gpu training", ("gpu", "training")),
        (" gpu ;; gpu;a100 ", ("gpu", "a100")),
        ("", ()),
        (None, ()),
        (["gpu", "a100"], ("gpu", "a100")),
    ],
)
def test_parse_tags_accepts_pve_separators(raw: object, tags: tuple[str, ...]) -> None:
    assert parse_tags(raw) == tags


def test_running_containers_become_targets_on_their_nodes_address() -> None:
    result = targets_from_listing(
        api_source(), listing(ct(200, "train-a", tags="gpu;training"), ct(300, "serve", node="pve2"))
    )
    by_name = {t.name: t for t in result.targets}
    assert set(by_name) == {"train-a", "serve"}
    train = by_name["train-a"]
    assert (train.guest.id, train.node.name, train.tags, train.source) == (
        200,
        "pve1",
        frozenset({"gpu", "training"}),
        "proxmox:lab",
    )
    assert train.node.ssh is not None and train.node.ssh.address == "127.0.0.11"
    assert train.node.ssh.port == 2222  # the source's ssh settings, with the node's address filled in
    assert by_name["serve"].node.ssh is not None and by_name["serve"].node.ssh.address == "127.0.0.12"
    assert result.skipped == []


def test_containers_on_one_node_share_one_node_ref() -> None:
    result = targets_from_listing(api_source(), listing(ct(200, "a"), ct(201, "b")))
    assert result.targets[0].node is result.targets[1].node


def test_stopped_container_is_skipped_with_a_reason_not_a_failure() -> None:
    result = targets_from_listing(api_source(), listing(ct(200, "a"), ct(201, "b", status="stopped")))
    assert [t.name for t in result.targets] == ["a"]
    assert len(result.skipped) == 1
    label, reason = result.skipped[0]
    assert label == "pve1/201" and reason.startswith("stopped")


def test_template_and_unknown_status_are_skipped() -> None:
    result = targets_from_listing(
        api_source(), listing(ct(200, "tmpl", template=1), ct(201, "b", status="unknown"))
    )
    reasons = dict(result.skipped)
    assert result.targets == []
    assert "template" in reasons["pve1/200"]
    assert "offline" in reasons["pve1/201"]


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (GuestFilter(tags=("gpu",)), {"train-a", "train-b"}),
        (GuestFilter(tags=("a1*",)), {"train-b"}),
        (GuestFilter(names=("train-*",)), {"train-a", "train-b"}),
        (GuestFilter(nodes=("pve2",)), {"web"}),
        (GuestFilter(tags=("gpu",), nodes=("pve1",), names=("*-b",)), {"train-b"}),
        (GuestFilter(), {"train-a", "train-b", "web"}),
    ],
)
def test_filters(flt: GuestFilter, expected: set[str]) -> None:
    result = targets_from_listing(
        api_source(flt=flt),
        listing(
            ct(200, "train-a", tags="gpu"), ct(201, "train-b", tags="gpu;a100"), ct(300, "web", node="pve2")
        ),
    )
    assert {t.name for t in result.targets} == expected


def test_status_filter_leaves_stopped_containers_out_of_scope_entirely() -> None:
    records = [ct(200, "a"), ct(201, "b", status="stopped")]
    scoped = targets_from_listing(api_source(flt=GuestFilter(statuses=("running",))), listing(*records))
    assert [t.name for t in scoped.targets] == ["a"] and scoped.skipped == []
    only_stopped = targets_from_listing(
        api_source(flt=GuestFilter(statuses=("stopped",))), listing(*records)
    )
    assert only_stopped.targets == [] and [label for label, _ in only_stopped.skipped] == ["pve1/201"]


def test_hostile_name_is_replaced_by_node_and_vmid_and_reported() -> None:
    result = targets_from_listing(api_source(), listing(ct(201, HOSTILE)))
    assert [t.name for t in result.targets] == ["pve1/201"]
    assert result.targets[0].guest == GuestRef.lxc(201)
    assert any("not a safe name" in w and "pve1/201" in w for w in result.warnings)
    assert all(HOSTILE not in t.name for t in result.targets)


@pytest.mark.parametrize(
    "name", ["all", "a,b", "!x", "tag:gpu", "a*", "-oProxyCommand=x", "a/b", "a" * 64, "é", "a\nb"]
)
def test_names_outside_the_safe_pattern_fall_back(name: str) -> None:
    result = targets_from_listing(api_source(), listing(ct(210, name)))
    assert [t.name for t in result.targets] == ["pve1/210"]


def test_duplicate_pve_names_fall_back_for_every_holder() -> None:
    result = targets_from_listing(api_source(), listing(ct(200, "same"), ct(300, "same", node="pve2")))
    assert sorted(t.name for t in result.targets) == ["pve1/200", "pve2/300"]


def test_hostile_tags_are_dropped_with_a_warning_and_safe_ones_kept() -> None:
    result = targets_from_listing(api_source(), listing(ct(200, "a", tags="gpu;$(reboot);c++")))
    assert result.targets[0].tags == frozenset({"gpu"})
    assert sum("dropped tag" in w for w in result.warnings) == 2


def test_hostile_node_name_skips_its_containers() -> None:
    found = listing(ct(200, "a", node="pve1;rm -rf /"))
    result = targets_from_listing(api_source(), found)
    assert result.targets == []
    assert result.skipped[0][0] == "lxc/200" and "not a safe name" in result.skipped[0][1]


def test_node_without_address_is_skipped_and_node_addresses_override_wins() -> None:
    found = listing_from_records([ct(200, "a", node="pve3"), ct(201, "b")])
    no_ip = targets_from_listing(
        api_source(), Listing(found.guests, node_addresses={"pve1": "127.0.0.11"})
    )
    assert [t.name for t in no_ip.targets] == ["b"]
    assert "node_addresses" in dict(no_ip.skipped)["pve3/200"]
    override = targets_from_listing(
        api_source(node_addresses={"pve1": "127.0.0.99", "pve3": "127.0.0.3"}),
        Listing(found.guests, node_addresses={"pve1": "127.0.0.11"}),
    )
    addresses = {t.name: t.node.ssh.address for t in override.targets if t.node.ssh}
    assert addresses == {"a": "127.0.0.3", "b": "127.0.0.99"}


def test_qemu_guests_are_vms_other_types_ignored_and_malformed_records_reported() -> None:
    records = [
        {"type": "qemu", "vmid": 100, "name": "vm", "node": "pve1", "status": "running"},
        {"type": "storage", "id": "storage/pve1/local", "node": "pve1", "status": "available"},
        ct(200, "a"),
        {"type": "lxc", "vmid": "x"},
        {"type": "lxc", "vmid": True, "node": "pve1"},
        {"type": "lxc", "vmid": 202, "node": "pve1"},
        {"type": "qemu", "vmid": 203, "status": "running"},
        "junk",
    ]
    found = listing_from_records(records)
    assert [(c.kind, c.vmid) for c in found.guests] == [("vm", 100), ("lxc", 200)]
    assert [(label, reason.split(" (")[0]) for label, reason in found.malformed] == [
        ("?", "PVE returned a guest without a valid vmid"),
        ("?", "PVE returned a guest without a valid vmid"),
        ("lxc/202", "PVE returned no status for this guest"),
        ("vm/203", "PVE returned no node for this guest"),
        ("?", "PVE returned an entry that is not an object"),
    ]


def test_vms_are_targets_only_when_the_filter_asks_for_them() -> None:
    records = [ct(200, "train-a"), {"type": "qemu", "vmid": 300, "name": "gpu-vm", "node": "pve1",
                                    "status": "running"},
               {"type": "qemu", "vmid": 301, "name": "VM 301", "node": "pve1", "status": "stopped"}]
    default = targets_from_listing(api_source(), listing(*records))
    assert [t.name for t in default.targets] == ["train-a"] and default.skipped == []
    both = targets_from_listing(api_source(flt=GuestFilter(kinds=("lxc", "vm"))), listing(*records))
    assert {t.name: (t.guest.kind, t.guest.id) for t in both.targets} == {
        "train-a": ("lxc", 200), "gpu-vm": ("vm", 300)}
    # PVE's "VM <id>" is no name (no unsafe-name warning); a stopped VM is skipped like a stopped CT.
    assert both.skipped == [("pve1/301", "stopped: only running guests can be reached")]
    assert both.warnings == []
    only_vms = targets_from_listing(api_source(flt=GuestFilter(kinds=("vm",))), listing(*records))
    assert [t.name for t in only_vms.targets] == ["gpu-vm"]


def test_a_listing_that_is_not_a_list_is_an_error() -> None:
    with pytest.raises(DiscoveryError, match="where a list was expected"):
        listing_from_records({"errors": "nope"})


def test_node_listing_pins_every_container_to_that_node() -> None:
    parsed = guest_from_record(
        {"vmid": 200, "name": "a", "status": "running", "node": "elsewhere"}, node="pve1"
    )
    assert isinstance(parsed, PveGuest) and parsed.node == "pve1"
