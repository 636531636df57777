"""API discovery end to end: inventory YAML -> proxmoxer -> TLS -> a fake PVE API on 127.0.0.1 -> targets.

The fake is `fakepve` (PyPI; a PVE API fake built from PVE's API schema, AGPL-3.0, test-only), served by
its pytest plugin's `fakepve` fixture with a throwaway self-signed certificate for 127.0.0.1
(`fakepve_cafile`), so TLS verification stays on: the certificate is given as the source's `ca_file`.
Node addresses are always given as loopback `node_addresses` except where a test reads /cluster/status;
nothing ever connects anywhere but 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from fleetfix.errors import DiscoveryError
from fleetfix.fleet import Fleet
from fleetfix.inventory.discovery.discoverer import Discoverer
from fleetfix.inventory.load import Inventory, load_inventory
from fleetfix.target import SSHSettings
from fleetfix.transport.fake import ANY, FakeTransport

try:
    import fakepve  # noqa: F401  (its pytest plugin provides the fixtures below)
except ImportError:  # pragma: no cover - depends on the environment
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        raise
    pytest.skip("fakepve is not installed (pip install fakepve)", allow_module_level=True)

TOKEN_ID = "fleetfix@pve!audit"
SECRET = "5e1f6a2b-0c3d-4e5f-8a9b-c0d1e2f3a4b5"
SECRET_ENV = "FLEETFIX_E2E_PVE_SECRET"
HOSTILE = "x;$(touch {canary})"


@pytest.fixture
def pve(fakepve: Any, tmp_path: Path) -> Any:
    """The fake cluster: containers on two nodes (running, stopped, hostile), a VM, and our token."""
    fakepve.apitokens[TOKEN_ID] = SECRET
    fakepve.add_ct(200, "train-a", node="pve1", status="running", config={"tags": "gpu;training"})
    fakepve.add_ct(201, "train-b", node="pve1", status="stopped", config={"tags": "gpu"})
    fakepve.add_ct(300, "web", node="pve2", status="running")
    # add_ct stores the hostname as given, the way a hand-edited /etc/pve/lxc/*.conf would reach the API.
    fakepve.add_ct(
        400, HOSTILE.format(canary=tmp_path / "canary"), node="pve2", status="running", config={"tags": "gpu"}
    )
    fakepve.add_vm(100, "a-vm", node="pve1", status="running")
    return fakepve


@pytest.fixture(autouse=True)
def secret_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # the test's TLS and routing must not depend on the host's


def write_inventory(tmp_path: Path, url: str, extra: str = "", *, node_addresses: bool = True) -> Path:
    addresses = "    node_addresses: {pve1: 127.0.0.11, pve2: 127.0.0.12}\n" if node_addresses else ""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"""
proxmox:
  - name: lab
    api: {url}
    token_id: '{TOKEN_ID}'
    token_secret_env: {SECRET_ENV}
{addresses}{extra}""")
    return path


def load(path: Path, tmp_path: Path, **kwargs: Any) -> Inventory:
    return load_inventory(path, discover=Discoverer(state_dir=tmp_path / "state", **kwargs))


def api_requests(pve: Any) -> list[str]:
    return [path for method, path, _ in pve.requests if method == "GET"]


def test_token_auth_filters_and_a_stopped_container_skipped(
    pve: Any, fakepve_cafile: str, tmp_path: Path
) -> None:
    path = write_inventory(tmp_path, pve.url, f"    ca_file: {fakepve_cafile}\n    filter: {{tags: [gpu]}}\n")
    inventory = load(path, tmp_path)
    by_name = {t.name: t for t in inventory.targets}
    assert set(by_name) == {"train-a", "pve2/400"}  # web has no gpu tag; the VM is not a container
    train = by_name["train-a"]
    assert (train.guest.id, train.node.name, train.source) == (200, "pve1", "proxmox:lab")
    assert train.tags == frozenset({"gpu", "training"})
    assert train.node.ssh is not None and train.node.ssh.address == "127.0.0.11"
    assert [label for label, _ in inventory.skipped] == ["pve1/201"]
    assert inventory.skipped[0][1].startswith("stopped")
    assert any("not a safe name" in w for w in inventory.warnings)
    # One API call: every node in use has a node_addresses entry, so /cluster/status is not needed.
    assert api_requests(pve) == ["/api2/json/cluster/resources"]


def test_status_filter_and_node_addresses_from_cluster_status(
    pve: Any,
    fakepve_cafile: str,
    tmp_path: Path,
) -> None:
    path = write_inventory(
        tmp_path,
        pve.url,
        f"    ca_file: {fakepve_cafile}\n    filter: {{status: running, nodes: [pve2], name: 'w*'}}\n",
        node_addresses=False,
    )
    inventory = load(path, tmp_path)
    assert [t.name for t in inventory.targets] == ["web"] and inventory.skipped == []
    ssh = inventory.targets[0].node.ssh
    assert ssh is not None and ssh.address  # whatever the fake's /cluster/status says (never connected to)
    assert api_requests(pve) == ["/api2/json/cluster/resources", "/api2/json/cluster/status"]


def test_bad_token_is_a_clear_one_line_error_without_the_secret(
    pve: Any,
    fakepve_cafile: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = "wrong-" + SECRET
    monkeypatch.setenv(SECRET_ENV, wrong)
    caplog.set_level("DEBUG")
    path = write_inventory(tmp_path, pve.url, f"    ca_file: {fakepve_cafile}\n")
    with pytest.raises(DiscoveryError) as raised:
        load(path, tmp_path)
    message = str(raised.value)
    assert "authentication failed (401" in message and TOKEN_ID in message and f"${SECRET_ENV}" in message
    assert "\n" not in message
    for secret in (wrong, SECRET):
        assert secret not in message and secret not in caplog.text


def test_tls_is_verified_by_default_and_an_untrusted_certificate_refused(pve: Any, tmp_path: Path) -> None:
    path = write_inventory(tmp_path, pve.url)  # no ca_file: the system CAs, which do not know the fake's cert
    with pytest.raises(DiscoveryError) as raised:
        load(path, tmp_path)
    message = str(raised.value)
    assert "TLS certificate not trusted" in message and "certificate verify failed" in message
    assert "set ca_file" in message and "\n" not in message
    assert api_requests(pve) == []  # refused during the handshake: the token was never sent


def test_verify_tls_false_works_but_warns(pve: Any, tmp_path: Path) -> None:
    path = write_inventory(tmp_path, pve.url, "    verify_tls: false\n")
    inventory = load(path, tmp_path)
    assert {t.name for t in inventory.targets} == {"train-a", "web", "pve2/400"}
    assert any("TLS verification is OFF" in w for w in inventory.warnings)


def test_cache_spares_the_api_until_refresh(pve: Any, fakepve_cafile: str, tmp_path: Path) -> None:
    path = write_inventory(tmp_path, pve.url, f"    ca_file: {fakepve_cafile}\n    cache_ttl: 300\n")
    first = load(path, tmp_path)
    calls = len(api_requests(pve))
    second = load(path, tmp_path)
    assert len(api_requests(pve)) == calls and second.discovered[0].from_cache
    assert [t.name for t in second.targets] == [t.name for t in first.targets]
    load(path, tmp_path, refresh=True)
    assert len(api_requests(pve)) > calls


def test_unreachable_api_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_inventory(tmp_path, f"https://127.0.0.1:{port}")
    with pytest.raises(DiscoveryError, match=r"cannot connect \(connection refused\)$"):
        load(path, tmp_path)


def test_a_hostile_pve_name_never_reaches_a_command(pve: Any, fakepve_cafile: str, tmp_path: Path) -> None:
    path = write_inventory(tmp_path, pve.url, f"    ca_file: {fakepve_cafile}\n")
    inventory = load(path, tmp_path)
    node = FakeTransport("node").on(ANY, rc=0)

    def connect(settings: SSHSettings) -> FakeTransport:
        assert settings.address.startswith("127.")
        return node

    with Fleet(connect=connect) as fleet:
        outcomes = fleet.map(inventory.targets, lambda _t, transport: transport.execute(["true"]))
    seen = [call.text + "\n" + call.stdin.decode(errors="replace") for call in node.calls]
    assert all(outcome.ok for outcome in outcomes) and len(seen) == 3
    assert sorted(text.split(" --")[0] for text in seen) == ["pct exec 200", "pct exec 300", "pct exec 400"]
    assert not any("canary" in text or "$(" in text for text in seen)
    assert not (tmp_path / "canary").exists()
