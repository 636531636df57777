"""Proxmox discovery: list a cluster's guests (LXC containers and QEMU VMs) and turn the running ones into
Targets.

A source is either the PVE API over HTTPS with an API token (proxmoxer), or `pvesh` run on one node over
fleetfix's own SSH transport (see discovery.clients for why not proxmoxer's SSH backend). Either way the
source yields a `Listing` (guests of every kind + node addresses), which may be cached, and
`targets_from_listing` maps it through the filter to a `DiscoveryResult`: targets, and the guests skipped
with a reason (stopped, a template, no address) - a stopped guest is information, not a failure. Which
Proxmox type is which guest kind comes from the guest drivers (`fleetfix.guests.pve_types`).

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
from fleetfix.guests import pve_types
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target

# The inventory's name pattern (inventory._NAME; a unit test keeps the two equal): hostname-like and free
# of the pattern language's `, ! : * ? [ /`, so a discovered name can never be read as a pattern.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# PVE writes tags `;`-separated; older versions and hand-edited configs also use `,` or spaces.
_TAG_SEPARATORS = re.compile(r"[;,\s]+")
CTID_MIN, CTID_MAX = 100, 999_999_999
CACHE_VERSION = 2  # 2: entries of every guest kind, each with its "kind"
Status = Literal["running", "stopped"]
DEFAULT_KINDS = ("lxc",)  # VMs only when the filter asks for them: a VM needs its guest agent to be reached


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
    pve_node: str  # the node's name inside PVE (its short hostname), for /nodes/<pve_node>/lxc and /qemu
    timeout: float = 30.0


@dataclass(frozen=True)
class GuestFilter:
    """Which guests are in scope: those of the given kinds ("lxc", "vm"), then the other fields. Empty
    fields do not filter; within a field any entry may match."""

    tags: tuple[str, ...] = ()  # globs; a guest matches when one of its tags matches one of them
    statuses: tuple[Status, ...] = ()
    names: tuple[str, ...] = ()  # globs on the PVE name
    nodes: tuple[str, ...] = ()  # globs on the PVE node name
    kinds: tuple[str, ...] = DEFAULT_KINDS

    def matches(self, container: PveGuest) -> bool:
        if container.kind not in self.kinds:
            return False
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
    filter: GuestFilter = GuestFilter()
    # SSH settings for every discovered node, `address` left empty (API sources; filled per node).
    node_ssh: SSHSettings = field(default_factory=lambda: SSHSettings(address=""))
    node_addresses: Mapping[str, str] = field(default_factory=dict)  # PVE node name -> SSH address
    tags: frozenset[str] = frozenset()  # added to every discovered target
    cache_ttl: float = 0.0  # seconds; 0: no cache

    @property
    def label(self) -> str:
        return f"proxmox:{self.name}"

    def fingerprint(self) -> str:
        """What the cache entry must match: the endpoint and identity, not the filter (applied after;
        every source lists every guest kind, so the cache serves any filter)."""
        if self.api is not None:
            parts = ["api", self.api.url, self.api.token_id]
        else:
            assert self.ssh is not None and self.ssh.node.ssh is not None
            settings = self.ssh.node.ssh
            parts = ["ssh", settings.address, str(settings.port), settings.user, self.ssh.pve_node]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# --- what a source answers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PveGuest:
    """One guest as PVE lists it, checked for shape; name and tags not yet judged safe."""

    vmid: int
    node: str
    name: str
    status: str
    tags: tuple[str, ...] = ()
    template: bool = False
    kind: str = "lxc"  # fleetfix's guest kind: "lxc" or "vm"


@dataclass(frozen=True)
class Listing:
    """A source's answer: guests, node name -> address (from /cluster/status), records it rejected."""

    guests: tuple[PveGuest, ...]
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    malformed: tuple[tuple[str, str], ...] = ()  # (label, reason) for records that were not guests
    fetched_at: float = 0.0


@dataclass
class DiscoveryResult:
    """Targets of one source, the in-scope guests that are not targets and why, and warnings."""

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


def guest_from_record(
    record: Any, *, node: str | None = None, kind: str = "lxc",
) -> PveGuest | tuple[str, str]:
    """A /cluster/resources, /nodes/<n>/lxc or /nodes/<n>/qemu entry -> PveGuest of that kind, or
    (label, reason) when malformed.

    `node` is the node the listing was for (/nodes/<n>/...): its entries carry no node field, and every
    guest it lists is on that node whatever an entry claims."""
    if not isinstance(record, dict):
        return ("?", "PVE returned an entry that is not an object")
    vmid = record.get("vmid")
    if isinstance(vmid, str) and vmid.isdigit():
        vmid = int(vmid)  # pvesh prints numbers as JSON numbers, but be lenient about strings
    if isinstance(vmid, bool) or not isinstance(vmid, int) or not CTID_MIN <= vmid <= CTID_MAX:
        return ("?", f"PVE returned a guest without a valid vmid ({_shown(vmid)})")
    where = node if node is not None else record.get("node")
    if not isinstance(where, str) or not where:
        return (f"{kind}/{vmid}", "PVE returned no node for this guest")
    name = record.get("name")
    if name == f"VM {vmid}":
        name = ""  # PVE's stand-in for a VM without a name (QemuServer::vmstatus), not a name
    status = record.get("status")
    if not isinstance(status, str):
        return (f"{kind}/{vmid}", "PVE returned no status for this guest")
    template = record.get("template") in (1, True, "1")
    return PveGuest(vmid=vmid, node=where, name=name if isinstance(name, str) else "",
                    status=status, tags=parse_tags(record.get("tags")), template=template, kind=kind)


def _shown(value: Any, limit: int = 60) -> str:
    """A hostile value, made safe to print: repr (escapes control characters), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listing_from_records(records: Any, *, node: str | None = None, kind: str | None = None) -> Listing:
    """Guests from a list of PVE records.

    With `kind`, every record is a guest of that kind (a /nodes/<n>/lxc or /qemu index: its entries name
    no type). Without, each record says what it is: PVE's `type` ("lxc", "qemu": /cluster/resources) or
    fleetfix's `kind` (the cache); records of any other type are not guests and are ignored."""
    if not isinstance(records, list):
        raise DiscoveryError(f"PVE answered {type(records).__name__} where a list was expected")
    types = pve_types()
    guests: list[PveGuest] = []
    malformed: list[tuple[str, str]] = []
    for record in records:
        record_kind = kind
        if record_kind is None and isinstance(record, dict):
            record_kind = types.get(str(record.get("type")))
            if record_kind is None and record.get("kind") in types.values():
                record_kind = str(record["kind"])
            if record_kind is None:
                continue
        parsed = guest_from_record(record, node=node, kind=record_kind or "?")
        if isinstance(parsed, PveGuest):
            guests.append(parsed)
        else:
            malformed.append(parsed)
    guests.sort(key=lambda guest: (guest.node, guest.vmid))
    return Listing(tuple(guests), malformed=tuple(malformed))


def merge_listings(*listings: Listing) -> Listing:
    """One listing of several (pvesh's per-kind indexes of one node)."""
    guests = sorted((guest for listing in listings for guest in listing.guests),
                    key=lambda guest: (guest.node, guest.vmid))
    malformed = tuple(item for listing in listings for item in listing.malformed)
    return Listing(tuple(guests), malformed=malformed)


# --- from a listing to targets ---------------------------------------------------------------------------


def targets_from_listing(source: ProxmoxSource, listing: Listing) -> DiscoveryResult:
    """Apply the filter and map every in-scope running guest to a Target on its node's SSH address."""
    result = DiscoveryResult(source=source.label, targets=[], skipped=list(listing.malformed),
                             fetched_at=listing.fetched_at)
    in_scope = [ct for ct in listing.guests if source.filter.matches(ct)]
    name_counts: dict[str, int] = {}
    for ct in in_scope:
        name_counts[ct.name] = name_counts.get(ct.name, 0) + 1
    node_refs: dict[str, NodeRef] = {}
    for ct in in_scope:
        if not SAFE_NAME.fullmatch(ct.node):
            result.skipped.append((f"{ct.kind}/{ct.vmid}", f"node name {_shown(ct.node)} is not a safe name"))
            continue
        fallback = f"{_node_label(source, ct.node)}/{ct.vmid}"
        if ct.template:
            result.skipped.append((fallback, "a template, not a guest that runs"))
            continue
        if ct.status != "running":
            why = "status unknown (is its node offline?)" if ct.status == "unknown" else ct.status
            result.skipped.append((fallback, f"{why}: only running guests can be reached"))
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
        result.targets.append(Target(name=name, node=ref, guest=GuestRef(ct.kind, ct.vmid),
                                     tags=frozenset(tags), source=source.label))
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


def _target_name(ct: PveGuest, fallback: str, counts: Mapping[str, int], warnings: list[str]) -> str:
    if not ct.name:
        return fallback
    if not SAFE_NAME.fullmatch(ct.name) or ct.name == "all":
        warnings.append(f"{fallback}: PVE name {_shown(ct.name)} is not a safe name; using {fallback!r}")
        return fallback
    if counts.get(ct.name, 0) > 1:
        warnings.append(f"{fallback}: PVE name {ct.name!r} is used by several guests; using {fallback!r}")
        return fallback
    return ct.name
