"""The HTTPS client (against a fake proxmoxer object) and the pvesh-over-SSH client (against a fake node
connection): the calls made, and every failure as one line without the secret."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from proxmoxer.core import ResourceException
from pvefakes import CLUSTER_STATUS, SECRET, SECRET_ENV, FakeProxmox, api_source, ct
from requests import exceptions as http

from fleetfix.errors import ConnectError, DiscoveryError, InventoryError
from fleetfix.fleet import Fleet
from fleetfix.inventory.discovery.clients import (
    fetch_api_listing,
    fetch_ssh_listing,
    node_addresses_from_status,
)
from fleetfix.inventory.discovery.discoverer import Discoverer
from fleetfix.inventory.discovery.model import GuestFilter, ProxmoxSource, SshAccess, TokenSecret
from fleetfix.target import NodeRef, SSHSettings
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import ANY, FakeTransport

RESOURCES = [
    ct(200, "train-a", tags="gpu"),
    ct(201, "idle", status="stopped"),
    {"id": "qemu/100", "type": "qemu", "vmid": 100, "name": "vm", "node": "pve1", "status": "running"},
]


def test_one_call_when_node_addresses_cover_every_node(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": RESOURCES})
    found = fetch_api_listing(api_source(node_addresses={"pve1": "127.0.0.5"}), api_factory=fake.factory)
    assert fake.calls == [("cluster/resources", {"type": "vm"})]
    # Every guest of the cluster is in the listing, a qemu one as a VM; the filter decides later.
    assert [(c.kind, c.vmid) for c in found.guests] == [("vm", 100), ("lxc", 200), ("lxc", 201)]


def test_cluster_status_supplies_node_addresses_when_needed(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": RESOURCES, "cluster/status": CLUSTER_STATUS})
    found = fetch_api_listing(api_source(), api_factory=fake.factory)
    assert [path for path, _ in fake.calls] == ["cluster/resources", "cluster/status"]
    assert found.node_addresses == {"pve1": "127.0.0.11", "pve2": "127.0.0.12"}


def test_token_and_tls_settings_reach_proxmoxer(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": [], "cluster/status": []})
    fetch_api_listing(api_source(), api_factory=fake.factory)
    kwargs = fake.init_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["user"], kwargs["token_name"]) == (
        "127.0.0.1",
        8006,
        "fleetfix@pve",
        "audit",
    )
    assert kwargs["token_value"] == SECRET
    assert kwargs["verify_ssl"] is True  # verification is on unless the inventory turns it off


def test_ca_file_is_passed_as_verify(secret_env: str, tmp_path: Path) -> None:
    ca = tmp_path / "pve-root-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    fake = FakeProxmox({"cluster/resources": []})
    fetch_api_listing(
        api_source(ca_file=str(ca), node_addresses={"pve1": "127.0.0.1"}), api_factory=fake.factory
    )
    assert fake.init_kwargs["verify_ssl"] == str(ca)


def test_missing_ca_file_is_one_line(secret_env: str, tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"^proxmox:lab: ca_file .*missing\.pem cannot be read$"):
        fetch_api_listing(
            api_source(ca_file=str(tmp_path / "missing.pem")), api_factory=FakeProxmox({}).factory
        )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ResourceException(401, "Unauthorized", "authentication failure"), "authentication failed (401"),
        (ResourceException(403, "Forbidden", ""), "permission denied (403"),
        (ResourceException(500, "Internal Server Error", "boom"), "HTTP 500 Internal Server Error: boom"),
        (
            http.SSLError(
                "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate "
                "(_ssl.c:1006)"
            ),
            "TLS certificate not trusted (certificate verify failed: self-signed",
        ),
        (
            http.ConnectionError("Failed to establish a new connection: [Errno 111] Connection refused"),
            "cannot connect (connection refused)",
        ),
        (http.ConnectTimeout("x"), "connect timed out after 10s"),
        (http.ReadTimeout("x"), "no answer within 10s"),
    ],
)
def test_api_failures_are_one_line_discovery_errors_without_the_secret(
    secret_env: str,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    expected: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake = FakeProxmox({"cluster/resources": error})
    with pytest.raises(DiscoveryError) as raised:
        fetch_api_listing(api_source(), api_factory=fake.factory)
    message = str(raised.value)
    assert expected in message
    assert message.startswith("proxmox:lab: https://127.0.0.1:8006/api2/json/cluster/resources: ")
    assert "\n" not in message
    assert SECRET not in message and SECRET not in repr(raised.value) and SECRET not in caplog.text


def test_401_names_the_token_and_where_the_secret_came_from(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": ResourceException(401, "Unauthorized", "")})
    with pytest.raises(
        DiscoveryError, match=rf"token_id 'fleetfix@pve!audit' and the secret from \${SECRET_ENV}"
    ):
        fetch_api_listing(api_source(), api_factory=fake.factory)


def test_a_library_message_echoing_the_secret_is_scrubbed(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": ResourceException(400, "Bad Request", f"bad token {SECRET}")})
    with pytest.raises(DiscoveryError) as raised:
        fetch_api_listing(api_source(), api_factory=fake.factory)
    assert SECRET not in str(raised.value) and "***" in str(raised.value)


def test_missing_secret_env_is_an_inventory_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    secret = TokenSecret(env=SECRET_ENV, path="inv.yaml", line=7, loc="proxmox.0")
    with pytest.raises(
        InventoryError,
        match=rf"^inv\.yaml:7: proxmox\.0\.token_secret_env: \${SECRET_ENV} is not set or empty$",
    ):
        fetch_api_listing(api_source(secret=secret), api_factory=FakeProxmox({}).factory)


def test_secret_from_a_file_and_loose_permissions_warn(tmp_path: Path) -> None:
    path = tmp_path / "pve-token"
    path.write_text(SECRET + "\n")
    os.chmod(path, 0o644)
    source = api_source(secret=TokenSecret(file=str(path)), node_addresses={"pve1": "127.0.0.1"})
    fake = FakeProxmox({"cluster/resources": RESOURCES})
    result = Discoverer(fetch=lambda s: fetch_api_listing(s, api_factory=fake.factory)).discover(source)
    assert fake.init_kwargs["token_value"] == SECRET  # stripped of the newline
    assert any("readable by group or others (mode 0644)" in w for w in result.warnings)
    os.chmod(path, 0o600)
    quiet = Discoverer(fetch=lambda s: fetch_api_listing(s, api_factory=fake.factory)).discover(source)
    assert not any("readable" in w for w in quiet.warnings)


@pytest.mark.parametrize("content", ["", "  \n", "abc\ndef", "abc def"])
def test_bad_secret_file_content_is_refused_without_showing_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "pve-token"
    path.write_text(content)
    with pytest.raises(InventoryError) as raised:
        TokenSecret(file=str(path)).read()
    assert "def" not in str(raised.value)


def test_secret_is_in_no_repr(secret_env: str) -> None:
    source = api_source()
    fake = FakeProxmox({"cluster/resources": RESOURCES, "cluster/status": CLUSTER_STATUS})
    result = Discoverer(fetch=lambda s: fetch_api_listing(s, api_factory=fake.factory)).discover(source)
    assert SECRET not in repr(source) and SECRET not in repr(result)


def test_verify_off_warns(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": RESOURCES, "cluster/status": CLUSTER_STATUS})
    result = Discoverer(fetch=lambda s: fetch_api_listing(s, api_factory=fake.factory)).discover(
        api_source(verify_tls=False)
    )
    assert fake.init_kwargs["verify_ssl"] is False
    assert any("TLS verification is OFF" in w for w in result.warnings)


def test_no_visible_containers_warns_about_token_privileges(secret_env: str) -> None:
    fake = FakeProxmox({"cluster/resources": []})
    result = Discoverer(fetch=lambda s: fetch_api_listing(s, api_factory=fake.factory)).discover(api_source())
    assert result.targets == [] and any("privilege-separated" in w for w in result.warnings)


def test_node_addresses_from_status_keeps_only_real_ips() -> None:
    entries = [
        {"type": "node", "name": "a", "ip": "127.0.0.7"},
        {"type": "node", "name": "b", "ip": "-oX"},
        {"type": "node", "name": "c"},
        {"type": "cluster", "name": "d", "ip": "127.0.0.8"},
        "junk",
    ]
    assert node_addresses_from_status(entries) == {"a": "127.0.0.7"}
    assert node_addresses_from_status({"not": "a list"}) == {}


# --- pvesh over fleetfix's SSH transport ------------------------------------------------------------------


def node_answering(result: CommandResult, vms: CommandResult | None = None) -> FakeTransport:
    """A node connection answering pvesh (`result` for the container index, `vms` for the VM index;
    `result` for both when `vms` is not given), recording what it was asked."""
    node = FakeTransport("pve1")
    if vms is not None:
        node.on(re.compile(r"/qemu\b"), vms)
    return node.on(ANY, result)


def ssh_source(settings: SSHSettings | None = None) -> ProxmoxSource:
    node = NodeRef("pve1", settings or SSHSettings(address="127.0.0.1", port=2222))
    return ProxmoxSource(name="pve1-ssh", ssh=SshAccess(node=node, pve_node="pve1"))


def pvesh_ok(records: object) -> CommandResult:
    return CommandResult(0, json.dumps(records), "", 0.1)


def test_ssh_discovery_runs_pvesh_through_fleetfix_transport() -> None:
    connection = node_answering(
        pvesh_ok(
            [
                {"vmid": 200, "name": "train-a", "status": "running", "tags": "gpu", "type": "lxc"},
                {"vmid": 201, "name": "x;$(touch /tmp/canary)", "status": "running", "type": "lxc"},
                {"vmid": 202, "name": "off", "status": "stopped", "type": "lxc"},
            ]
        ),
        vms=pvesh_ok([{"vmid": 300, "name": "gpu-vm", "status": "running"}]),  # no "type" in this index
    )
    seen: list[SSHSettings] = []

    def connect(settings: SSHSettings) -> FakeTransport:
        seen.append(settings)
        return connection

    source = ssh_source()
    assert source.ssh is not None
    with Fleet(connect=connect) as fleet:
        found = fetch_ssh_listing(source, fleet=fleet)
    assert [call.argv for call in connection.calls] == [
        ("pvesh", "get", "/nodes/pve1/lxc", "--output-format", "json"),
        ("pvesh", "get", "/nodes/pve1/qemu", "--output-format", "json")]
    assert seen == [source.ssh.node.ssh]  # the node's own settings: known_hosts policy and all
    assert [(guest.kind, guest.vmid) for guest in found.guests] == [
        ("lxc", 200), ("lxc", 201), ("lxc", 202), ("vm", 300)]
    result = Discoverer(fetch=lambda _: found).discover(source)
    assert sorted(t.name for t in result.targets) == ["pve1/201", "train-a"]  # VMs only when asked for
    assert all(t.node is source.ssh.node for t in result.targets)
    assert [label for label, _ in result.skipped] == ["pve1/202"]
    with_vms = replace(source, filter=GuestFilter(kinds=("lxc", "vm")))
    both = Discoverer(fetch=lambda _: found).discover(with_vms)
    assert {t.name: (t.guest.kind, t.guest.id) for t in both.targets} == {
        "train-a": ("lxc", 200), "pve1/201": ("lxc", 201), "gpu-vm": ("vm", 300)}


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (CommandResult(127, "", "sh: 1: pvesh: not found", 0.0), "exit 127 (is this a Proxmox VE node?)"),
        (CommandResult(2, "", "no such resource '/nodes/pve1/lxc'", 0.0), "exit 2: no such resource"),
        (CommandResult(0, "Use of uninitialized value", "", 0.0), "not JSON"),
        (CommandResult(124, "", "", 30.0, timed_out=True), "no answer within 30s"),
    ],
)
def test_ssh_discovery_failures_are_one_line(result: CommandResult, expected: str) -> None:
    with (
        Fleet(connect=lambda _: node_answering(result)) as fleet,
        pytest.raises(DiscoveryError) as raised,
    ):
        fetch_ssh_listing(ssh_source(), fleet=fleet)
    assert str(raised.value).startswith("proxmox:pve1-ssh: pvesh on pve1: ")
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_ssh_connect_failure_becomes_a_discovery_error() -> None:
    def refuse(settings: SSHSettings) -> FakeTransport:
        raise ConnectError(f"{settings.address}:{settings.port}: connection refused")

    with (
        Fleet(connect=refuse) as fleet,
        pytest.raises(DiscoveryError, match=r"127\.0\.0\.1:2222: connection refused"),
    ):
        fetch_ssh_listing(ssh_source(), fleet=fleet)
