"""The inventory: a YAML file of Proxmox nodes, their containers, groups and vars -> a list of Targets.

Everything is resolved once, here: SSH settings (defaults -> node), vars (defaults -> groups in definition
order -> node -> container), group membership, `~` and relative paths. Every problem is one line,
`file:line: field.path: what was expected`, raised as InventoryError. docs/inventory.md is the user's
reference for the format; keep the two in step.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from fleetfix.errors import ConfigError, InventoryError
from fleetfix.selection import Term, apply_terms, check_unknown_prefixes, parse_pattern, select
from fleetfix.target import NodeRef, SSHSettings, Target
from fleetfix.yamlsource import Loc, Locations, load_yaml, parse_yaml, validate

ENV_VAR = "FLEETFIX_INVENTORY"
DEFAULT_PATH = "inventory.yaml"
# Proxmox VE accepts VMIDs 100..999999999 (ids below 100 are reserved).
CTID_MIN, CTID_MAX = 100, 999_999_999
# Hostname-like, and free of the pattern language's `, ! : * ? [ /`, so a name is never read as a pattern.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # usable as a jinja2 identifier
_ADDRESS = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]{0,252}")  # never starts with '-'
_JUMP_HOST = re.compile(  # [user@]host[:port], host possibly a bracketed IPv6; never starts with '-'
    r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.%]+\])(?::(\d{1,5}))?")
RESERVED_NAMES = frozenset({"all"})  # `all` selects every target


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise PydanticCustomError(
            "name", "expected a name: letters, digits, '.', '_', '-'; starting with a letter or digit; "
                    "at most 63 characters")
    return value


def _check_var_name(value: str) -> str:
    if not _VAR_NAME.fullmatch(value):
        raise PydanticCustomError(
            "var_name", "expected a var name: letters, digits and '_', not starting with a digit")
    return value


def _check_port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise PydanticCustomError("port", "expected a TCP port, 1..65535")
    return value


def _check_ctid(value: int) -> int:
    if not CTID_MIN <= value <= CTID_MAX:
        raise PydanticCustomError("ctid", f"expected a Proxmox CT id, {CTID_MIN}..{CTID_MAX}")
    return value


def _check_address(value: str) -> str:
    if not _ADDRESS.fullmatch(value):
        raise PydanticCustomError("address", "expected a host name or IP address")
    return value


def _check_jump_host(value: str) -> str:
    found = _JUMP_HOST.fullmatch(value)
    if found is None or (found.group(1) is not None and not 1 <= int(found.group(1)) <= 65535):
        raise PydanticCustomError("jump_host", "expected [user@]host[:port]")
    return value


def _check_path(value: str) -> str:
    if not value.strip() or "\0" in value:
        raise PydanticCustomError("path", "expected a file path")
    return value


def _check_json_value(value: Any) -> Any:
    """Vars reach jinja2 templates and `--json` output, so only JSON-shaped values are accepted."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list):
        return [_check_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _check_json_value(item) for key, item in value.items()}
    raise PydanticCustomError(
        "var_value", "expected a string, number, boolean, null, list or mapping with string keys "
                     "(quote dates and other special YAML values)")


Name = Annotated[str, AfterValidator(_check_name)]
VarName = Annotated[str, AfterValidator(_check_var_name)]
Port = Annotated[int, AfterValidator(_check_port)]
CTID = Annotated[int, AfterValidator(_check_ctid)]
Address = Annotated[str, AfterValidator(_check_address)]
JumpHost = Annotated[str, AfterValidator(_check_jump_host)]
FilePath = Annotated[str, AfterValidator(_check_path)]
Seconds = Annotated[float, Field(gt=0, le=3600)]
KeepaliveSeconds = Annotated[float, Field(ge=0, le=3600)]  # 0: no keepalives
Vars = dict[VarName, Annotated[Any, AfterValidator(_check_json_value)]]


class _Model(BaseModel):
    # strict: YAML already yields typed values; "22" for a port or `yes` for a name is a mistake to report.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ConnectionFields(_Model):
    """SSH settings shared by `defaults` and each node. A node's value wins when the node sets it."""

    user: Name = "root"
    port: Port = 22
    identity_file: FilePath | None = None  # None: ssh-agent and the default keys
    known_hosts: FilePath | None = None  # None: ~/.ssh/known_hosts
    accept_new: bool = False
    jump_host: JumpHost | None = None
    connect_timeout: Seconds = 10.0
    keepalive: KeepaliveSeconds = 15.0
    vars: Vars = {}


class DefaultsModel(ConnectionFields):
    pass


class ContainerModel(_Model):
    ctid: CTID
    name: Name | None = None  # None: "<node>/<ctid>"
    tags: list[Name] = []
    vars: Vars = {}


class NodeModel(ConnectionFields):
    name: Name
    address: Address
    tags: list[Name] = []
    include_node: bool | None = None  # None: the node is a target only when it lists no containers
    containers: list[ContainerModel] = []


class GroupModel(_Model):
    targets: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    vars: Vars = {}


class InventoryModel(_Model):
    defaults: DefaultsModel = DefaultsModel()
    nodes: list[NodeModel] = Field(min_length=1)
    groups: dict[Name, GroupModel] = {}


@dataclass
class Inventory:
    """A loaded inventory: targets in file order, and each group's member target names."""

    path: Path
    targets: list[Target]
    groups: dict[str, list[str]]

    def select(self, pattern: str | None) -> list[Target]:
        return select(self.targets, pattern)


@dataclass(frozen=True)
class _Draft:
    """A target before its groups and vars are known, with the models its vars come from."""

    target: Target
    node: NodeModel
    container: ContainerModel | None


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
        raise InventoryError(f"inventory file not found ({origin})", path=str(path))
    if not path.is_file():
        raise InventoryError(f"inventory is not a file ({origin})", path=str(path))
    return path


def load_inventory(path: str | Path) -> Inventory:
    with _as_inventory_error(path):
        data, where = load_yaml(path, InventoryError)
    return _build(data, where, Path(path))


def parse_inventory(text: str, path: str | Path = "<inventory>") -> Inventory:
    """Like load_inventory, from text; relative paths in it resolve against path's folder."""
    with _as_inventory_error(path):
        data, where = parse_yaml(text, str(path), InventoryError)
    return _build(data, where, Path(path))


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


def _build(data: Any, where: Locations, path: Path) -> Inventory:
    if data is None:
        raise InventoryError("the file is empty; expected a mapping with a 'nodes' list", path=where.path)
    if not isinstance(data, dict):
        raise _error(where, (), "expected a mapping with a 'nodes' list at the top level")
    model = validate(InventoryModel, data, where, InventoryError)
    drafts = _drafts(model, where, path)
    members = _resolve_groups(model, where, drafts)
    in_groups: dict[str, list[str]] = {draft.target.name: [] for draft in drafts}
    for group_name, names in members.items():
        for name in names:
            in_groups[name].append(group_name)
    targets = []
    for draft in drafts:
        groups = in_groups[draft.target.name]
        layers = [model.defaults.vars, *(model.groups[name].vars for name in groups), draft.node.vars]
        if draft.container is not None:
            layers.append(draft.container.vars)
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(layer)  # top-level keys replace; nested mappings are not merged
        targets.append(replace(draft.target, vars=copy.deepcopy(merged), groups=frozenset(groups)))
    return Inventory(path=path, targets=targets, groups=members)


def _pick(node: NodeModel, defaults: DefaultsModel, field: str) -> Any:
    """The node's value if the node sets the field (even to null), else the defaults'."""
    source: ConnectionFields = node if field in node.model_fields_set else defaults
    return getattr(source, field)


def _file(value: str | None, base: Path) -> str | None:
    if value is None:
        return None
    expanded = Path(os.path.expanduser(value))
    return str(expanded if expanded.is_absolute() else base / expanded)


def _drafts(model: InventoryModel, where: Locations, path: Path) -> list[_Draft]:
    base = path.parent
    drafts: list[_Draft] = []
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
        )
        ref = NodeRef(name=node.name, ssh=settings)  # one per node: its containers share the connection
        include_node = node.include_node if node.include_node is not None else not node.containers
        if not include_node and not node.containers:
            raise _error(where, (*node_loc, "include_node"),
                         "a node without containers must be a target itself (drop include_node)")
        if include_node:
            claim(node.name, (*node_loc, "name"))
            drafts.append(_Draft(Target(node.name, ref, None, tags=frozenset(node.tags), source=str(path)),
                                 node, None))
        ctid_lines: dict[int, int | None] = {}
        for position, container in enumerate(node.containers):
            ct_loc: Loc = (*node_loc, "containers", position)
            if container.ctid in ctid_lines:
                first = _first(ctid_lines[container.ctid])
                raise _error(where, (*ct_loc, "ctid"),
                             f"duplicate ctid {container.ctid} on node {node.name!r}{first}")
            ctid_lines[container.ctid] = where.line((*ct_loc, "ctid"))
            name = container.name or f"{node.name}/{container.ctid}"
            name_loc: Loc = (*ct_loc, "name" if container.name else "ctid")
            claim(name, name_loc)
            # A node's tags describe its hardware, which its containers share.
            tags = frozenset(node.tags) | frozenset(container.tags)
            drafts.append(_Draft(Target(name, ref, container.ctid, tags=tags, source=str(path)),
                                 node, container))
    return drafts


def _error(where: Locations, loc: Loc, message: str) -> ConfigError:
    return where.error(loc, message, InventoryError)


def _first(line: int | None) -> str:
    return f" (first at line {line})" if line else ""


def _resolve_groups(
    model: InventoryModel, where: Locations, drafts: Sequence[_Draft],
) -> dict[str, list[str]]:
    """Each group's members, in definition order. A group may refer only to groups defined above it, so
    membership is computed in one pass with no cycles. Every term must match something: a typo in a
    group silently dropping targets would be worse than an error."""
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
                    raise _error(where, entry_loc, f"{term.text!r} matched no targets")
            terms.extend(parsed)
        chosen = apply_terms(current, terms)
        if not chosen:
            raise _error(where, (*group_loc, "targets"), "the exclusions leave this group empty")
        members[group_name] = [target.name for target in chosen]
        for target in chosen:
            so_far[target.name].append(group_name)
    return members


def adhoc_targets(
    host: str,
    *,
    port: int = 22,
    user: str = "root",
    identity_file: str | None = None,
    known_hosts: str | None = None,
    accept_new: bool = False,
    ctids: Sequence[int] = (),
    connect_timeout: float = 10.0,
) -> list[Target]:
    """Targets from `--host/--ct`: the node itself, or one target per CT sharing one NodeRef."""
    if not _ADDRESS.fullmatch(host):
        raise ConfigError(f"--host {host!r}: expected a host name or IP address")
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: expected a TCP port, 1..65535")
    if not _NAME.fullmatch(user):
        raise ConfigError(f"--user {user!r}: expected a user name")
    if not connect_timeout > 0:
        raise ConfigError(f"connect timeout {connect_timeout}: expected a positive number of seconds")
    seen: set[int] = set()
    for ctid in ctids:
        if not CTID_MIN <= ctid <= CTID_MAX:
            raise ConfigError(f"--ct {ctid}: expected a Proxmox CT id, {CTID_MIN}..{CTID_MAX}")
        if ctid in seen:
            raise ConfigError(f"--ct {ctid} is given twice")
        seen.add(ctid)
    cwd = Path.cwd()
    settings = SSHSettings(
        address=host, port=port, user=user,
        identity_file=_file(identity_file, cwd), known_hosts=_file(known_hosts, cwd),
        accept_new=accept_new, connect_timeout=float(connect_timeout),
    )
    ref = NodeRef(name=host, ssh=settings)
    if not ctids:
        return [Target(host, ref, None, source="cli")]
    return [Target(f"{host}/{ctid}", ref, ctid, source="cli") for ctid in ctids]


def local_target() -> Target:
    """This machine, with no SSH at all (`--local`)."""
    return Target("local", NodeRef(name="local", ssh=None), None, source="local")


__all__ = [
    "DEFAULT_PATH", "ENV_VAR", "Inventory", "adhoc_targets", "load_inventory", "local_target",
    "parse_inventory", "resolve_inventory_path",
]
