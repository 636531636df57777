"""Proxmox discovery: list a cluster's LXC containers and turn the running ones into Targets.

A source is either the PVE API over HTTPS with an API token (proxmoxer), or `pvesh` run on one node over
fleetfix's own SSH transport (see discovery.clients for why not proxmoxer's SSH backend). Either way the
source yields a `Listing` (containers + node addresses), which may be cached, and `targets_from_listing`
maps it through the filter to a `DiscoveryResult`: targets, and the containers skipped with a reason
(stopped, a template, no address) - a stopped container is information, not a failure.

Everything a PVE answers is untrusted input. Names and tags are only ever labels (commands use the
integer vmid), and even so a name outside the inventory's safe pattern is replaced by `<node>/<vmid>`
and a tag outside it is dropped, each with a warning, so nothing odd reaches a pattern, a log or a shell.
The token secret is read at call time and lives only in the client object; it is never in a repr, an
error, the cache or a log line.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from fleetfix.errors import DiscoveryError, InventoryError
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target

# The inventory's name pattern (inventory._NAME; a unit test keeps the two equal): hostname-like and free
# of the pattern language's `, ! : * ? [ /`, so a discovered name can never be read as a pattern.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# PVE writes tags `;`-separated; older versions and hand-edited configs also use `,` or spaces.
_TAG_SEPARATORS = re.compile(r"[;,\s]+")
CTID_MIN, CTID_MAX = 100, 999_999_999
CACHE_VERSION = 1
Status = Literal["running", "stopped"]


# --- configuration (built by fleetfix.inventory from the `proxmox:` section) ----------------------------


@dataclass(frozen=True)
class TokenSecret:
    """Where the API token's secret is: an environment variable or a file. Never holds the value."""

    env: str | None = None
    file: str | None = None
    # Where the source is declared, so a missing secret is reported like any inventory error.
    path: str | None = None
    line: int | None = None
    loc: str = "proxmox"

    def describe(self) -> str:
        return f"${self.env}" if self.env else f"file {self.file}"

    def read(self) -> str:
        """The secret, stripped; InventoryError (never showing the value) when it is missing or malformed."""
        if self.env is not None:
            value = os.environ.get(self.env, "")
            if not value.strip():
                raise self._error("token_secret_env", f"${self.env} is not set or empty")
        elif self.file is not None:
            try:
                value = Path(self.file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                raise self._error("token_secret_file", f"cannot read {self.file}: {why}") from None
            if not value.strip():
                raise self._error("token_secret_file", f"{self.file} is empty")
        else:
            raise self._error("token_id", "neither token_secret_env nor token_secret_file is set")
        value = value.strip()
        # The secret becomes an HTTP header value: a newline in it would be header injection.
        if any(char.isspace() or ord(char) < 32 for char in value):
            raise self._error("token_secret_env" if self.env else "token_secret_file",
                              f"the secret from {self.describe()} contains whitespace or control characters")
        return value

    def _error(self, field_name: str, message: str) -> InventoryError:
        return InventoryError(message, path=self.path, line=self.line, field=f"{self.loc}.{field_name}")

    def loose_permissions(self) -> int | None:
        """The file's mode when group or others may read it (a warning, not an error), else None."""
        if self.file is None:
            return None
        try:
            mode = stat.S_IMODE(os.stat(self.file).st_mode)
        except OSError:
            return None
        return mode if mode & 0o077 else None


@dataclass(frozen=True)
class ApiAccess:
    """The HTTPS API of one cluster, with an API token."""

    host: str
    port: int
    token_id: str  # user@realm!tokenname
    secret: TokenSecret
    verify_tls: bool = True
    ca_file: str | None = None
    timeout: float = 10.0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    @property
    def user(self) -> str:
        return self.token_id.partition("!")[0]

    @property
    def token_name(self) -> str:
        return self.token_id.partition("!")[2]


@dataclass(frozen=True)
class SshAccess:
    """`pvesh` on one node, over that node's SSH settings (the node as declared under `nodes:`)."""

    node: NodeRef  # the inventory node: its name labels the targets, its SSH settings reach them
    pve_node: str  # the node's name inside PVE (its short hostname), for /nodes/<pve_node>/lxc
    timeout: float = 30.0


@dataclass(frozen=True)
class ContainerFilter:
    """Which containers are in scope. Empty fields do not filter; within a field any entry may match."""

    tags: tuple[str, ...] = ()  # globs; a container matches when one of its tags matches one of them
    statuses: tuple[Status, ...] = ()
    names: tuple[str, ...] = ()  # globs on the PVE name
    nodes: tuple[str, ...] = ()  # globs on the PVE node name

    def matches(self, container: PveContainer) -> bool:
        if self.statuses and container.status not in self.statuses:
            return False
        if self.names and not any(fnmatchcase(container.name, glob) for glob in self.names):
            return False
        if self.nodes and not any(fnmatchcase(container.node, glob) for glob in self.nodes):
            return False
        return not self.tags or any(fnmatchcase(tag, glob) for tag in container.tags for glob in self.tags)


@dataclass(frozen=True)
class ProxmoxSource:
    """One `proxmox:` entry of the inventory, resolved. Exactly one of api / ssh is set."""

    name: str
    api: ApiAccess | None = None
    ssh: SshAccess | None = None
    filter: ContainerFilter = ContainerFilter()
    # SSH settings for every discovered node, `address` left empty (API sources; filled per node).
    node_ssh: SSHSettings = field(default_factory=lambda: SSHSettings(address=""))
    node_addresses: Mapping[str, str] = field(default_factory=dict)  # PVE node name -> SSH address
    tags: frozenset[str] = frozenset()  # added to every discovered target
    cache_ttl: float = 0.0  # seconds; 0: no cache

    @property
    def label(self) -> str:
        return f"proxmox:{self.name}"

    def fingerprint(self) -> str:
        """What the cache entry must match: the endpoint and identity, not the filter (applied after)."""
        if self.api is not None:
            parts = ["api", self.api.url, self.api.token_id]
        else:
            assert self.ssh is not None and self.ssh.node.ssh is not None
            settings = self.ssh.node.ssh
            parts = ["ssh", settings.address, str(settings.port), settings.user, self.ssh.pve_node]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# --- what a source answers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PveContainer:
    """One LXC container as PVE lists it, checked for shape; name and tags not yet judged safe."""

    vmid: int
    node: str
    name: str
    status: str
    tags: tuple[str, ...] = ()
    template: bool = False


@dataclass(frozen=True)
class Listing:
    """A source's answer: containers, node name -> address (from /cluster/status), records it rejected."""

    containers: tuple[PveContainer, ...]
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    malformed: tuple[tuple[str, str], ...] = ()  # (label, reason) for records that were not containers
    fetched_at: float = 0.0


@dataclass
class DiscoveryResult:
    """Targets of one source, the in-scope containers that are not targets and why, and warnings."""

    source: str  # "proxmox:<name>"
    targets: list[Target]
    skipped: list[tuple[str, str]]
    warnings: list[str] = field(default_factory=list)
    from_cache: bool = False
    fetched_at: float = 0.0


def parse_tags(raw: Any) -> tuple[str, ...]:
    """PVE's tag string (`a;b`, also `a,b` / `a b`) or a list of tags -> tags in order, without repeats."""
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else _TAG_SEPARATORS.split(str(raw))
    seen: dict[str, None] = {}
    for item in items:
        text = str(item).strip()
        if text:
            seen.setdefault(text, None)
    return tuple(seen)


def container_from_record(record: Any, *, node: str | None = None) -> PveContainer | tuple[str, str]:
    """A /cluster/resources or /nodes/<n>/lxc entry -> PveContainer, or (label, reason) when malformed.

    `node` is the node the listing was for (/nodes/<n>/lxc): its entries carry no node field, and every
    container it lists is on that node whatever an entry claims."""
    if not isinstance(record, dict):
        return ("?", "PVE returned an entry that is not an object")
    vmid = record.get("vmid")
    if isinstance(vmid, str) and vmid.isdigit():
        vmid = int(vmid)  # pvesh prints numbers as JSON numbers, but be lenient about strings
    if isinstance(vmid, bool) or not isinstance(vmid, int) or not CTID_MIN <= vmid <= CTID_MAX:
        return ("?", f"PVE returned a container without a valid vmid ({_shown(vmid)})")
    where = node if node is not None else record.get("node")
    if not isinstance(where, str) or not where:
        return (f"lxc/{vmid}", "PVE returned no node for this container")
    name = record.get("name")
    status = record.get("status")
    if not isinstance(status, str):
        return (f"lxc/{vmid}", "PVE returned no status for this container")
    template = record.get("template") in (1, True, "1")
    return PveContainer(vmid=vmid, node=where, name=name if isinstance(name, str) else "",
                        status=status, tags=parse_tags(record.get("tags")), template=template)


def _shown(value: Any, limit: int = 60) -> str:
    """A hostile value, made safe to print: repr (escapes control characters), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listing_from_records(records: Any, *, node: str | None = None, lxc_only: bool = True) -> Listing:
    """Containers from a list of PVE records (QEMU guests and other types are ignored)."""
    if not isinstance(records, list):
        raise DiscoveryError(f"PVE answered {type(records).__name__} where a list was expected")
    containers: list[PveContainer] = []
    malformed: list[tuple[str, str]] = []
    for record in records:
        if lxc_only and isinstance(record, dict) and record.get("type") != "lxc":
            continue
        parsed = container_from_record(record, node=node)
        if isinstance(parsed, PveContainer):
            containers.append(parsed)
        else:
            malformed.append(parsed)
    containers.sort(key=lambda ct: (ct.node, ct.vmid))
    return Listing(tuple(containers), malformed=tuple(malformed))


# --- from a listing to targets ---------------------------------------------------------------------------


def targets_from_listing(source: ProxmoxSource, listing: Listing) -> DiscoveryResult:
    """Apply the filter and map every in-scope running container to a Target on its node's SSH address."""
    result = DiscoveryResult(source=source.label, targets=[], skipped=list(listing.malformed),
                             fetched_at=listing.fetched_at)
    in_scope = [ct for ct in listing.containers if source.filter.matches(ct)]
    name_counts: dict[str, int] = {}
    for ct in in_scope:
        name_counts[ct.name] = name_counts.get(ct.name, 0) + 1
    node_refs: dict[str, NodeRef] = {}
    for ct in in_scope:
        if not SAFE_NAME.fullmatch(ct.node):
            result.skipped.append((f"lxc/{ct.vmid}", f"node name {_shown(ct.node)} is not a safe name"))
            continue
        fallback = f"{_node_label(source, ct.node)}/{ct.vmid}"
        if ct.template:
            result.skipped.append((fallback, "a template, not a container that runs"))
            continue
        if ct.status != "running":
            why = "status unknown (is its node offline?)" if ct.status == "unknown" else ct.status
            result.skipped.append((fallback, f"{why}: only running containers can be reached (pct exec)"))
            continue
        ref = node_refs.get(ct.node)
        if ref is None:
            made = _node_ref(source, ct.node, listing.node_addresses)
            if isinstance(made, str):
                result.skipped.append((fallback, made))
                continue
            ref = node_refs[ct.node] = made
        name = _target_name(ct, fallback, name_counts, result.warnings)
        tags = set(source.tags)
        for tag in ct.tags:
            if SAFE_NAME.fullmatch(tag):
                tags.add(tag)
            else:
                result.warnings.append(f"{source.label}: {name}: dropped tag {_shown(tag)} (not a safe name)")
        result.targets.append(Target(name=name, node=ref, guest=GuestRef.lxc(ct.vmid), tags=frozenset(tags),
                                     source=source.label))
    return result


def _node_label(source: ProxmoxSource, pve_node: str) -> str:
    """The node's name in fleetfix: the inventory node for an SSH source, else PVE's node name."""
    return source.ssh.node.name if source.ssh is not None else pve_node


def _node_ref(source: ProxmoxSource, pve_node: str, discovered: Mapping[str, str]) -> NodeRef | str:
    """The NodeRef for a PVE node, or why there is none."""
    if source.ssh is not None:
        return source.ssh.node
    address = source.node_addresses.get(pve_node) or discovered.get(pve_node)
    if not address:
        return f"no SSH address for node {pve_node!r} (not in /cluster/status; set node_addresses)"
    return NodeRef(name=pve_node, ssh=replace(source.node_ssh, address=address))


def _target_name(ct: PveContainer, fallback: str, counts: Mapping[str, int], warnings: list[str]) -> str:
    if not ct.name:
        return fallback
    if not SAFE_NAME.fullmatch(ct.name) or ct.name == "all":
        warnings.append(f"{fallback}: PVE name {_shown(ct.name)} is not a safe name; using {fallback!r}")
        return fallback
    if counts.get(ct.name, 0) > 1:
        warnings.append(f"{fallback}: PVE name {ct.name!r} is used by several containers; using {fallback!r}")
        return fallback
    return ct.name
