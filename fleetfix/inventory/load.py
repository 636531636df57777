"""The inventory: a YAML file of Proxmox nodes, their containers and VMs, groups and vars -> a list of
Targets.

Everything is resolved once, here: SSH settings (defaults -> node), vars (defaults -> groups in definition
order -> node -> container or VM), group membership, `~` and relative paths. Every problem is one line,
`file:line: field.path: what was expected`, raised as InventoryError. docs/inventory.md is the user's
reference for the format; keep the two in step.

`proxmox:` entries are sources of targets found at load time (fleetfix.inventory.discovery): the file is
checked first, then each source is discovered, then groups and vars are resolved over static and discovered
targets alike. Discovered guests that are not targets (stopped, say) are kept in `Inventory.skipped`.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fleetfix.errors import ConfigError, InventoryError, InventoryNotFoundError
from fleetfix.inventory.adhoc import CTID_MAX, adhoc_targets, local_target
from fleetfix.inventory.adhoc import resolved_file as _file
from fleetfix.inventory.model import (
    DEFAULT_PATH,
    ENV_VAR,
    PVE_API_PORT,
    RESERVED_NAMES,
    ConnectionFields,
    DefaultsModel,
    InventoryModel,
    NodeModel,
    ProxmoxModel,
    WheelBuilderModel,
)
from fleetfix.inventory.select import Term, apply_terms, check_unknown_prefixes, parse_pattern, select
from fleetfix.secrets import FILE_PREFIX
from fleetfix.target import NODE, Become, GuestRef, NodeRef, SSHSettings, Target, WheelBuilder
from fleetfix.yamlsource import Loc, Locations, load_yaml, parse_yaml, validate

if TYPE_CHECKING:  # imported where a `proxmox:` source is read: most inventories have none (start-up)
    from fleetfix.inventory.discovery.model import DiscoveryResult, ProxmoxSource


@dataclass
class Inventory:
    """A loaded inventory: targets (static in file order, then discovered), each group's member target
    names, and from discovery: the sources' results, what was skipped and why, and warnings."""

    path: Path
    targets: list[Target]
    groups: dict[str, list[str]]
    discovered: list[DiscoveryResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (target or CT label, reason)
    warnings: list[str] = field(default_factory=list)

    def select(self, pattern: str | None) -> list[Target]:
        return select(self.targets, pattern)


# Discovers one source (fleetfix.inventory.discovery.Discoverer in production; tests pass fakes).
Discover = Callable[["ProxmoxSource"], "DiscoveryResult"]


@dataclass(frozen=True)
class _Draft:
    """A target before its groups and vars are known, with its own var layers (applied after groups)."""

    target: Target
    own_vars: tuple[Mapping[str, Any], ...]


def resolve_inventory_path(cli_value: str | None) -> Path:
    """--inventory, else $FLEETFIX_INVENTORY, else ./inventory.yaml; a missing file names which was used."""
    env_value = os.environ.get(ENV_VAR, "").strip()
    if cli_value:
        raw, origin = cli_value, "given by --inventory"
    elif env_value:
        raw, origin = env_value, f"given by ${ENV_VAR}"
    else:
        raw, origin = DEFAULT_PATH, f"the default; pass --inventory FILE or set ${ENV_VAR}"
    path = Path(os.path.expanduser(raw))
    if not path.exists():
        raise InventoryNotFoundError(f"inventory file not found ({origin})", path=str(path))
    if not path.is_file():
        raise InventoryError(f"inventory is not a file ({origin})", path=str(path))
    return path


def load_inventory(path: str | Path, *, discover: Discover | None = None, refresh: bool = False) -> Inventory:
    """Load and check the file, then discover its `proxmox:` sources with `discover` (default: a
    fleetfix.inventory.discovery.Discoverer, which uses the network and the cache; `refresh`: not the
    cache)."""
    with _as_inventory_error(path):
        data, where = load_yaml(path, InventoryError)
    return _build(data, where, Path(path), discover, refresh=refresh)


def parse_inventory(
    text: str, path: str | Path = "<inventory>", *, discover: Discover | None = None,
) -> Inventory:
    """Like load_inventory, from text; relative paths in it resolve against path's folder."""
    with _as_inventory_error(path):
        data, where = parse_yaml(text, str(path), InventoryError)
    return _build(data, where, Path(path), discover)


@contextmanager
def _as_inventory_error(path: str | Path) -> Iterator[None]:
    """Errors from reading the file, as one-line InventoryErrors. yamlsource raises duplicate keys as a
    plain ConfigError, and some PyYAML messages (e.g. a control character) span several lines."""
    try:
        yield
    except ConfigError as exc:
        if isinstance(exc, InventoryError) and "\n" not in str(exc):
            raise
        detail = " ".join(exc.detail.split())
        raise InventoryError(detail, path=exc.path, line=exc.line, field=exc.field) from None
    except RecursionError:  # PyYAML composes recursively: "[[[[...]]]]" thousands deep
        raise InventoryError("invalid YAML: nested too deeply", path=str(path)) from None


def _build(
    data: Any, where: Locations, path: Path, discover: Discover | None, *, refresh: bool = False,
) -> Inventory:
    if data is None:
        raise InventoryError("the file is empty; expected a mapping with a 'nodes' list", path=where.path)
    if not isinstance(data, dict):
        raise _error(where, (), "expected a mapping with a 'nodes' list at the top level")
    model = validate(InventoryModel, data, where, InventoryError)
    if not model.nodes and not model.proxmox:
        raise _error(where, ("nodes",) if "nodes" in data else (),
                     "expected at least one node under 'nodes' or a 'proxmox' source")
    via_ssh = {source.via_ssh for source in model.proxmox if source.via_ssh}
    drafts, node_refs = _drafts(model, where, path, via_ssh)
    sources = _sources(model, where, path, node_refs)
    inventory = Inventory(path=path, targets=[], groups={})
    if sources:
        if discover is None:
            from fleetfix.inventory.discovery.discoverer import Discoverer

            discover = Discoverer(refresh=refresh)
        for source, source_model in sources:
            result = discover(source)
            inventory.discovered.append(result)
            inventory.skipped.extend(result.skipped)
            inventory.warnings.extend(result.warnings)
            _add_discovered(drafts, result, (source_model.vars,), set(model.groups), inventory)
    members = _resolve_groups(model, where, drafts, strict=not sources, warnings=inventory.warnings)
    in_groups: dict[str, list[str]] = {draft.target.name: [] for draft in drafts}
    for group_name, names in members.items():
        for name in names:
            in_groups[name].append(group_name)
    for draft in drafts:
        groups = in_groups[draft.target.name]
        layers = [model.defaults.vars, *(model.groups[name].vars for name in groups), *draft.own_vars]
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(layer)  # top-level keys replace; nested mappings are not merged
        inventory.targets.append(replace(draft.target, vars=copy.deepcopy(merged), groups=frozenset(groups)))
    inventory.groups = members
    if model.wheels.trust:
        inventory.targets = _wheel_trust(model, where, inventory.targets, strict=not sources,
                                         warnings=inventory.warnings)
    if model.wheels.builder is not None:
        if model.wheels.build == "never":
            raise _error(where, ("wheels", "build"), "never: no wheel is built, so wheels.builder would "
                         "never be used; remove one of them")
        inventory.targets = _wheel_builder(model.wheels.builder, where, inventory.targets, node_refs,
                                           strict=not sources, warnings=inventory.warnings)
    if model.wheels.build == "never":
        inventory.targets = [replace(target, wheel_build=False) for target in inventory.targets]
    return inventory


def _wheel_builder(builder: WheelBuilderModel, where: Locations, targets: Sequence[Target],
                   node_refs: Mapping[str, NodeRef], *, strict: bool, warnings: list[str]) -> list[Target]:
    """Each target `install_on` selects, with the dedicated builder whose clones build its wheels. The node
    must be one of `nodes:` (the controller runs `pct clone` there over its connection); the template is
    not a target (a template cannot start, so no playbook runs in it); the clones' ids may not include it."""
    loc: Loc = ("wheels", "builder")
    node = node_refs.get(builder.node)
    if node is None:
        raise _error(where, (*loc, "node"), f"{builder.node!r} is not a node under 'nodes'")
    last = builder.first_id + builder.ids - 1
    if last > CTID_MAX:
        raise _error(where, (*loc, "ids"), f"first_id + ids - 1 = {last} is over the largest id {CTID_MAX}")
    if builder.first_id <= builder.template <= last:
        raise _error(where, (*loc, "first_id"),
                     f"the clones' ids {builder.first_id}..{last} include the template {builder.template}")
    for target in targets:
        if target.node.name == builder.node and target.guest.id == builder.template:
            raise _error(where, (*loc, "template"),
                         f"CT {builder.template} on {builder.node} is the target {target.name!r}: a template "
                         "cannot run playbooks")
    terms = _pattern_terms(builder.install_on, (*loc, "install_on"), where, targets, strict=strict,
                           warnings=warnings)
    spec = WheelBuilder(node, builder.template, builder.first_id, builder.ids, builder.storage)
    chosen = {target.name for target in apply_terms(targets, terms)}
    return [replace(target, wheel_builder=spec) if target.name in chosen else target for target in targets]


def _pattern_terms(patterns: Sequence[str], loc: Loc, where: Locations, targets: Sequence[Target], *,
                   strict: bool, warnings: list[str]) -> list[Term]:
    """The `--limit`-style patterns of an inventory list, parsed; each must match some target (an error,
    or with proxmox sources a warning), naming the entry's file, line and field."""
    terms: list[Term] = []
    for position, entry in enumerate(patterns):
        entry_loc: Loc = (*loc, position)
        try:
            parsed = parse_pattern(entry)
            check_unknown_prefixes(targets, parsed)
        except ConfigError as exc:
            raise _error(where, entry_loc, exc.detail) from None
        if not apply_terms(targets, parsed):
            error = _error(where, entry_loc, f"{entry!r} matched no targets")
            if strict:
                raise error
            warnings.append(str(error))
        terms.extend(parsed)
    return terms


def _wheel_trust(model: InventoryModel, where: Locations, targets: Sequence[Target], *, strict: bool,
                 warnings: list[str]) -> list[Target]:
    """Each target with the names of the targets whose built wheels it installs (`wheels: trust:`). Every
    pattern must match something, as in groups: a typo that silently trusts nobody would hide itself, and
    one that trusts somebody else is what the error is for. With proxmox sources it is a warning."""
    trusted: dict[str, set[str]] = {target.name: set() for target in targets}
    for index, rule in enumerate(model.wheels.trust):
        chosen = []
        for part in ("builders", "install_on"):
            terms = _pattern_terms(getattr(rule, part), ("wheels", "trust", index, part), where, targets,
                                   strict=strict, warnings=warnings)
            chosen.append({target.name for target in apply_terms(targets, terms)} if terms else set())
        builders, consumers = chosen
        for name in consumers:
            trusted[name] |= builders - {name}
    return [replace(target, wheel_builders=frozenset(trusted[target.name])) for target in targets]


def _add_discovered(
    drafts: list[_Draft], result: DiscoveryResult, own_vars: tuple[Mapping[str, Any], ...],
    group_names: set[str], inventory: Inventory,
) -> None:
    """Append a source's targets. A guest already in the inventory (same node connection and id) is
    skipped; a name already taken falls back to `<node>/<id>`, with a warning."""
    taken = {draft.target.name for draft in drafts} | group_names | RESERVED_NAMES
    seen = {_guest_key(draft.target): draft.target for draft in drafts if not draft.target.guest.is_node}
    for target in result.targets:
        first = seen.get(_guest_key(target))
        if first is not None:
            inventory.skipped.append((target.name, f"already in the inventory as {first.name!r} "
                                                   f"(from {first.source})"))
            continue
        name = target.name
        if name in taken:
            fallback = f"{target.node.name}/{target.guest.id}"
            if fallback in taken:
                inventory.skipped.append((name, "its name and its node/ctid name are both taken"))
                continue
            inventory.warnings.append(f"{result.source}: name {name!r} is already taken; using {fallback!r}")
            name = fallback
        taken.add(name)
        target = replace(target, name=name)
        seen[_guest_key(target)] = target
        drafts.append(_Draft(target, own_vars))


def _guest_key(target: Target) -> tuple[Any, int | None]:
    ssh = target.node.ssh
    return (ssh.endpoint if ssh is not None else target.node.name, target.guest.id)


def _pick(node: NodeModel, defaults: DefaultsModel, field: str) -> Any:
    """The node's value if the node sets the field (even to null), else the defaults'."""
    source: ConnectionFields = node if field in node.model_fields_set else defaults
    return getattr(source, field)


def _drafts(
    model: InventoryModel, where: Locations, path: Path, via_ssh: set[str],
) -> tuple[list[_Draft], dict[str, NodeRef]]:
    """Static targets, and every node's NodeRef by name. A node that a `proxmox: via_ssh` source goes
    through need not be a target itself."""
    base = path.parent
    drafts: list[_Draft] = []
    node_refs: dict[str, NodeRef] = {}
    node_lines: dict[str, int | None] = {}
    target_lines: dict[str, int | None] = {}

    def claim(name: str, loc: Loc) -> None:
        if name in RESERVED_NAMES:
            raise _error(where, loc, f"{name!r} is reserved (it selects every target)")
        if name in target_lines:
            raise _error(where, loc, f"duplicate target name {name!r}{_first(target_lines[name])}")
        target_lines[name] = where.line(loc)

    for index, node in enumerate(model.nodes):
        node_loc: Loc = ("nodes", index)
        if node.name in node_lines:
            first = _first(node_lines[node.name])
            raise _error(where, (*node_loc, "name"), f"duplicate node name {node.name!r}{first}")
        node_lines[node.name] = where.line((*node_loc, "name"))
        settings = SSHSettings(
            address=node.address,
            port=_pick(node, model.defaults, "port"),
            user=_pick(node, model.defaults, "user"),
            identity_file=_file(_pick(node, model.defaults, "identity_file"), base),
            known_hosts=_file(_pick(node, model.defaults, "known_hosts"), base),
            accept_new=_pick(node, model.defaults, "accept_new"),
            jump_host=_pick(node, model.defaults, "jump_host"),
            connect_timeout=float(_pick(node, model.defaults, "connect_timeout")),
            keepalive=float(_pick(node, model.defaults, "keepalive")),
            become=_become(functools.partial(_pick, node, model.defaults), base),
        )
        ref = NodeRef(name=node.name, ssh=settings)  # one per node: its guests share the connection
        node_refs[node.name] = ref
        has_guests = bool(node.containers or node.vms)
        discovery_only = not has_guests and node.name in via_ssh
        include_node = node.include_node if node.include_node is not None else (
            not has_guests and not discovery_only)
        if not include_node and not has_guests and not discovery_only:
            raise _error(where, (*node_loc, "include_node"),
                         "a node without containers or VMs must be a target itself (drop include_node)")
        if include_node:
            claim(node.name, (*node_loc, "name"))
            drafts.append(_Draft(Target(node.name, ref, NODE, tags=frozenset(node.tags), source=str(path)),
                                 (node.vars,)))
        # Proxmox gives a node's containers and VMs ids from one space: a CT and a VM never share one.
        id_lines: dict[int, tuple[str, int | None]] = {}
        for section, id_field, kind in _GUEST_SECTIONS:
            for position, guest in enumerate(getattr(node, section)):
                guest_loc: Loc = (*node_loc, section, position)
                guest_id: int = getattr(guest, id_field)
                if guest_id in id_lines:
                    first_field, line = id_lines[guest_id]
                    what = (f"duplicate {id_field} {guest_id}" if first_field == id_field else
                            f"{id_field} {guest_id} is also a {first_field} (containers and VMs share ids)")
                    raise _error(where, (*guest_loc, id_field), f"{what} on node {node.name!r}{_first(line)}")
                id_lines[guest_id] = (id_field, where.line((*guest_loc, id_field)))
                name = guest.name or f"{node.name}/{guest_id}"
                claim(name, (*guest_loc, "name" if guest.name else id_field))
                # A node's tags describe its hardware, which its guests share.
                tags = frozenset(node.tags) | frozenset(guest.tags)
                drafts.append(_Draft(Target(name, ref, GuestRef(kind, guest_id), tags=tags, source=str(path)),
                                     (node.vars, guest.vars)))
    return drafts, node_refs


# A node's guest lists: (inventory key, id field, fleetfix.guests kind).
_GUEST_SECTIONS = (("containers", "ctid", "lxc"), ("vms", "vmid", "vm"))


_API_ONLY = ("token_id", "token_secret_env", "token_secret_file", "verify_tls", "ca_file", "node_addresses",
             "ssh")


def _sources(
    model: InventoryModel, where: Locations, path: Path, node_refs: Mapping[str, NodeRef],
) -> list[tuple[ProxmoxSource, ProxmoxModel]]:
    """The `proxmox:` entries, checked across fields (pydantic checks them one at a time)."""
    if not model.proxmox:
        return []
    from fleetfix.inventory.discovery.model import GuestFilter, ProxmoxSource

    sources: list[tuple[ProxmoxSource, ProxmoxModel]] = []
    lines: dict[str, int | None] = {}
    for index, entry in enumerate(model.proxmox):
        loc: Loc = ("proxmox", index)
        if entry.name in lines:
            first = _first(lines[entry.name])
            raise _error(where, (*loc, "name"), f"duplicate proxmox source {entry.name!r}{first}")
        lines[entry.name] = where.line((*loc, "name"))
        if "token_secret" in entry.model_fields_set:
            raise _error(where, (*loc, "token_secret"), "an inline secret is not accepted (the file would "
                         "hold a credential): use token_secret_env or token_secret_file")
        if (entry.api is None) == (entry.via_ssh is None):
            raise _error(where, loc, "expected exactly one of 'api' (HTTPS with a token) and 'via_ssh'")
        flt = entry.filter
        source = ProxmoxSource(
            name=entry.name, tags=frozenset(entry.tags), cache_ttl=float(entry.cache_ttl),
            filter=GuestFilter(
                tags=tuple(flt.tags), nodes=tuple(flt.nodes),
                statuses=tuple([flt.status] if isinstance(flt.status, str) else flt.status),
                names=tuple([flt.name] if isinstance(flt.name, str) else flt.name),
                kinds=tuple([flt.guests] if isinstance(flt.guests, str) else flt.guests),
            ),
        )
        if entry.via_ssh is not None:
            source = _ssh_source(source, entry, where, loc, node_refs)
        else:
            source = _api_source(source, entry, where, loc, model.defaults, path.parent)
        sources.append((source, entry))
    return sources


def _ssh_source(
    source: ProxmoxSource, entry: ProxmoxModel, where: Locations, loc: Loc, node_refs: Mapping[str, NodeRef],
) -> ProxmoxSource:
    for field_name in _API_ONLY:
        if field_name in entry.model_fields_set:
            raise _error(where, (*loc, field_name), "only for an 'api' source (a via_ssh source uses the "
                         "node's own SSH settings)")
    assert entry.via_ssh is not None
    ref = node_refs.get(entry.via_ssh)
    if ref is None:
        raise _error(where, (*loc, "via_ssh"), f"no node named {entry.via_ssh!r} under 'nodes'")
    from fleetfix.inventory.discovery.model import SshAccess

    access = SshAccess(node=ref, pve_node=entry.pve_node or entry.via_ssh, timeout=entry.timeout)
    return replace(source, ssh=access)


def _api_source(
    source: ProxmoxSource, entry: ProxmoxModel, where: Locations, loc: Loc, defaults: DefaultsModel,
    base: Path,
) -> ProxmoxSource:
    if "pve_node" in entry.model_fields_set:
        raise _error(where, (*loc, "pve_node"), "only for a 'via_ssh' source")
    if entry.token_id is None:
        raise _error(where, loc, "an 'api' source needs token_id (user@realm!tokenname)")
    if (entry.token_secret_env is None) == (entry.token_secret_file is None):
        raise _error(where, loc, "expected exactly one of token_secret_env and token_secret_file")
    if not entry.verify_tls and entry.ca_file is not None:
        raise _error(where, (*loc, "verify_tls"), "verify_tls: false contradicts ca_file; drop one")
    assert entry.api is not None
    url = urlsplit(entry.api)
    assert url.hostname is not None
    from fleetfix.inventory.discovery.model import ApiAccess, TokenSecret

    secret = TokenSecret(env=entry.token_secret_env, file=_file(entry.token_secret_file, base),
                         path=where.path, line=where.line(loc), loc=".".join(map(str, loc)))
    access = ApiAccess(host=url.hostname, port=url.port or PVE_API_PORT, token_id=entry.token_id,
                       secret=secret, verify_tls=entry.verify_tls, ca_file=_file(entry.ca_file, base),
                       timeout=entry.timeout)
    ssh = entry.ssh

    def pick(name: str) -> Any:
        """The source's ssh value if it sets the field, else the inventory defaults'."""
        return getattr(ssh if name in ssh.model_fields_set else defaults, name)

    node_ssh = SSHSettings(
        address="", port=pick("port"), user=pick("user"),
        identity_file=_file(pick("identity_file"), base), known_hosts=_file(pick("known_hosts"), base),
        accept_new=pick("accept_new"), jump_host=pick("jump_host"),
        connect_timeout=float(pick("connect_timeout")), keepalive=float(pick("keepalive")),
        become=_become(pick, base),
    )
    return replace(source, api=access, node_ssh=node_ssh, node_addresses=dict(entry.node_addresses))


def _become(pick: Callable[[str], Any], base: Path) -> Become | None:
    """The node's become settings; a relative @file: password reference is relative to the inventory."""
    if not pick("become"):
        return None
    password: str | None = pick("become_password")
    if password is not None and password.startswith(FILE_PREFIX):
        password = FILE_PREFIX + str(_file(password[len(FILE_PREFIX):], base))
    return Become(user=pick("become_user"), password=password)


def _error(where: Locations, loc: Loc, message: str) -> ConfigError:
    return where.error(loc, message, InventoryError)


def _first(line: int | None) -> str:
    return f" (first at line {line})" if line else ""


def _resolve_groups(
    model: InventoryModel, where: Locations, drafts: Sequence[_Draft], *, strict: bool = True,
    warnings: list[str] | None = None,
) -> dict[str, list[str]]:
    """Each group's members, in definition order. A group may refer only to groups defined above it, so
    membership is computed in one pass with no cycles. Every term must match something: a typo in a
    group silently dropping targets would be worse than an error. With proxmox sources (`strict` off),
    what a term matches changes as containers start and stop, so a term or group that matches nothing
    is a warning instead."""
    target_names = {draft.target.name for draft in drafts}
    group_names = list(model.groups)
    so_far: dict[str, list[str]] = {name: [] for name in target_names}
    members: dict[str, list[str]] = {}
    for index, (group_name, group) in enumerate(model.groups.items()):
        group_loc: Loc = ("groups", group_name)
        if group_name in RESERVED_NAMES:
            raise _error(where, group_loc, f"{group_name!r} is reserved (it selects every target)")
        if group_name in target_names:
            raise _error(where, group_loc, f"group name {group_name!r} is also a target name; "
                         "patterns could not tell them apart")
        not_yet = set(group_names[index:])
        current = [replace(draft.target, groups=frozenset(so_far[draft.target.name])) for draft in drafts]
        terms: list[Term] = []
        for position, entry in enumerate(group.targets):
            entry_loc: Loc = (*group_loc, "targets", position)
            try:
                parsed = parse_pattern(entry)
                check_unknown_prefixes(current, parsed)
            except ConfigError as exc:
                raise _error(where, entry_loc, exc.detail) from None
            for term in parsed:
                if term.kind in ("group", "bare") and term.value in not_yet:
                    raise _error(where, entry_loc, f"{term.text!r} refers to group {term.value!r}, "
                                 "which is not defined above this group")
                if not any(term.matches(target) for target in current):
                    error = _error(where, entry_loc, f"{term.text!r} matched no targets")
                    if strict or warnings is None:
                        raise error
                    warnings.append(str(error))
            terms.extend(parsed)
        chosen = apply_terms(current, terms)
        if not chosen:  # strict: every inclusion matched something, so only exclusions can empty it
            if strict or warnings is None:
                raise _error(where, (*group_loc, "targets"), "the exclusions leave this group empty")
            warnings.append(str(_error(where, (*group_loc, "targets"), "this group is empty")))
        members[group_name] = [target.name for target in chosen]
        for target in chosen:
            so_far[target.name].append(group_name)
    return members


__all__ = [
    "DEFAULT_PATH", "ENV_VAR", "Inventory", "adhoc_targets", "load_inventory", "local_target",
    "parse_inventory", "resolve_inventory_path",
]
