"""The two ways to ask a Proxmox cluster for its guests, with every failure mapped to one line.

HTTPS: proxmoxer's `https` backend with an API token. One call, `GET /cluster/resources?type=vm`, lists
every guest of the cluster (`type` lxc or qemu) with its node, vmid, name, status and tags; a second,
`GET /cluster/status`, is made only when some node in use has no `node_addresses` entry (its entries of
type `node` carry `ip`).

SSH: `pvesh get /nodes/<node>/lxc --output-format json`, then the same for `/qemu` (pve-manager and
qemu-server: the per-node indexes, whose entries name no type), run on the node through fleetfix's own SSH
transport (Fleet -> transport.ssh), NOT proxmoxer's `ssh_paramiko` backend: that one connects with
paramiko's AutoAddPolicy (trusts any host key on first use) and never checks the exit status, while
fleetfix verifies host keys against known_hosts and refuses unknown or changed keys. The argv is fixed
words plus a node name that passed the inventory's safe-name check, quoted once by the transport.
"""

from __future__ import annotations

import ipaddress
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from fleetfix import boundedjson
from fleetfix.errors import DiscoveryError, FleetfixError, one_line
from fleetfix.guests import pve_types
from fleetfix.inventory.discovery.model import Listing, ProxmoxSource, listing_from_records, merge_listings
from fleetfix.target import Target

# Makes a proxmoxer-like client: `api(path).get(**params)` returns the decoded `data`.
ApiFactory = Callable[..., Any]


def fetch_listing(source: ProxmoxSource) -> Listing:
    if source.api is not None:
        return fetch_api_listing(source)
    return fetch_ssh_listing(source)


# --- HTTPS API -------------------------------------------------------------------------------------------


def proxmoxer_api(**kwargs: Any) -> Any:
    from proxmoxer import ProxmoxAPI

    return ProxmoxAPI(backend="https", service="PVE", **kwargs)


def fetch_api_listing(source: ProxmoxSource, *, api_factory: ApiFactory = proxmoxer_api) -> Listing:
    access = source.api
    assert access is not None
    secret = access.secret.read()
    verify: bool | str = access.ca_file if access.ca_file else access.verify_tls
    if access.ca_file is not None and not _readable(access.ca_file):
        raise DiscoveryError(f"{source.label}: ca_file {access.ca_file} cannot be read")
    client = api_factory(host=access.host, port=access.port, user=access.user,
                         token_name=access.token_name, token_value=secret, verify_ssl=verify,
                         timeout=access.timeout)
    resources = _api_get(source, client, "cluster/resources", {"type": "vm"}, secret)
    listing = listing_from_records(resources)
    needed = {ct.node for ct in listing.guests if ct.status == "running" and not ct.template}
    if needed - set(source.node_addresses):
        status = _api_get(source, client, "cluster/status", {}, secret)
        listing = Listing(listing.guests, node_addresses=node_addresses_from_status(status),
                          malformed=listing.malformed)
    return listing


def node_addresses_from_status(entries: Any) -> dict[str, str]:
    """/cluster/status entries of type `node` -> {name: ip}; an entry without a valid IP is left out."""
    addresses: dict[str, str] = {}
    if not isinstance(entries, list):
        return addresses
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") != "node":
            continue
        name, ip = entry.get("name"), entry.get("ip")
        if not isinstance(name, str) or not isinstance(ip, str):
            continue
        try:
            addresses[name] = str(ipaddress.ip_address(ip))  # an IP, never a string that reaches ssh options
        except ValueError:
            continue
    return addresses


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def _api_get(source: ProxmoxSource, client: Any, path: str, params: Mapping[str, str], secret: str) -> Any:
    from requests import exceptions as http

    access = source.api
    assert access is not None
    where = f"{source.label}: {access.url}/api2/json/{path}"
    try:
        with warnings.catch_warnings():
            if not access.verify_tls:  # urllib3 warns on every request; one warning per source is ours
                warnings.simplefilter("ignore")
            return client(path).get(**params)
    except http.SSLError as exc:
        raise DiscoveryError(_scrub(
            f"{where}: TLS certificate not trusted ({_tls_reason(exc)}); set ca_file to the cluster's CA "
            "(/etc/pve/pve-root-ca.pem on a node)", secret)) from None
    except http.ConnectTimeout:
        raise DiscoveryError(f"{where}: connect timed out after {access.timeout:g}s") from None
    except http.Timeout:
        raise DiscoveryError(f"{where}: no answer within {access.timeout:g}s") from None
    except http.ConnectionError as exc:
        raise DiscoveryError(_scrub(f"{where}: cannot connect ({_connection_reason(exc)})", secret)) from None
    except http.RequestException as exc:
        raise DiscoveryError(_scrub(f"{where}: request failed: {one_line(exc)}", secret)) from None
    except Exception as exc:  # proxmoxer.core.ResourceException, without importing proxmoxer here
        code = getattr(exc, "status_code", None)
        if not isinstance(code, int):
            raise
        message = _status_message(where, code, exc, access.token_id, access.secret.describe())
        raise DiscoveryError(_scrub(message, secret)) from None


def _status_message(where: str, code: int, exc: BaseException, token_id: str, secret_from: str) -> str:
    reason = one_line(getattr(exc, "status_message", "") or "")
    if code == 401:
        return (f"{where}: authentication failed (401 {reason}): check token_id {token_id!r} "
                f"and the secret from {secret_from}")
    if code == 403:
        return (f"{where}: permission denied (403 {reason}): the token {token_id!r} lacks a privilege "
                "(discovery needs VM.Audit; node addresses need /cluster/status or node_addresses)")
    content = one_line(getattr(exc, "content", "") or "")
    return f"{where}: HTTP {code} {reason}" + (f": {content[:200]}" if content else "")


def _tls_reason(exc: BaseException) -> str:
    text = one_line(exc)
    marker = "certificate verify failed:"
    if marker in text:
        return text[text.index(marker):].split("(_ssl")[0].strip(" )")
    if "hostname" in text.lower() and "match" in text.lower():
        return "the certificate does not name this host"
    return text[-160:]


def _connection_reason(exc: BaseException) -> str:
    text = one_line(exc)
    for known in ("Connection refused", "Name or service not known", "No route to host",
                  "Network is unreachable", "Temporary failure in name resolution"):
        if known in text:
            return known.lower()
    return text[-160:]


def _scrub(message: str, secret: str) -> str:
    """Belt and braces: no library message we pass on should contain the secret, but never let it."""
    return message.replace(secret, "***") if secret else message


# --- pvesh over SSH --------------------------------------------------------------------------------------


def pvesh_argv(pve_node: str, pve_type: str = "lxc") -> list[str]:
    return ["pvesh", "get", f"/nodes/{pve_node}/{pve_type}", "--output-format", "json"]


def fetch_ssh_listing(source: ProxmoxSource, *, fleet: Any = None) -> Listing:
    """Run pvesh on the source's node over a fleetfix SSH connection (host keys verified), once per guest
    type. Every type, whatever the filter says: the listing may be cached, and the filter applies after."""
    from fleetfix.fleet import Fleet

    access = source.ssh
    assert access is not None
    owned = fleet is None
    runner = Fleet(forks=1, channels_per_node=1) if fleet is None else fleet
    where = f"{source.label}: pvesh on {access.node.name}"
    try:
        transport = runner.privileged_transport(Target(access.node.name, access.node))  # pvesh: root
        return merge_listings(*(
            _pvesh_listing(where, transport.execute(pvesh_argv(access.pve_node, pve_type),
                                                    timeout=access.timeout), access.timeout, access.pve_node,
                           kind)
            for pve_type, kind in pve_types().items()
        ))
    except DiscoveryError:
        raise
    except FleetfixError as exc:
        raise DiscoveryError(f"{where}: {exc}") from None
    finally:
        if owned:
            runner.close()


def _pvesh_listing(where: str, result: Any, timeout: float, pve_node: str, kind: str) -> Listing:
    if result.timed_out:
        raise DiscoveryError(f"{where}: no answer within {timeout:g}s")
    if result.exit_code != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        hint = " (is this a Proxmox VE node?)" if result.exit_code == 127 else ""
        raise DiscoveryError(f"{where}: exit {result.exit_code}{hint}: {one_line(last[0])[:200]}")
    try:
        records = boundedjson.loads(result.stdout)
    except ValueError:
        raise DiscoveryError(f"{where}: pvesh printed something that is not JSON") from None
    return listing_from_records(records, node=pve_node, kind=kind)


__all__ = [
    "fetch_api_listing", "fetch_listing", "fetch_ssh_listing", "node_addresses_from_status",
    "proxmoxer_api", "pvesh_argv",
]
