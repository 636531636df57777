"""The inventory file's schema: pydantic models with the checks that make every bad value a one-line error
naming its field. docs/inventory.md is the user's reference for the format; keep the two in step."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from fleetfix.inventory.adhoc import ADDRESS_PATTERN, CTID_MAX, CTID_MIN, NAME_PATTERN

ENV_VAR = "FLEETFIX_INVENTORY"
DEFAULT_PATH = "inventory.yaml"
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # usable as a jinja2 identifier
_JUMP_HOST = re.compile(  # [user@]host[:port], host possibly a bracketed IPv6; never starts with '-'
    r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.%]+\])(?::(\d{1,5}))?")
RESERVED_NAMES = frozenset({"all"})  # `all` selects every target
PVE_API_PORT = 8006
# A PVE API token id: user@realm!tokenname (PVE: userid `[^\s:/]+@realm`, token name `[A-Za-z][\w.-]*`).
_TOKEN_ID = re.compile(r"[^\s:/@!=]+@[A-Za-z][A-Za-z0-9._-]*![A-Za-z][A-Za-z0-9._-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
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


def _check_vmid(value: int) -> int:
    if not CTID_MIN <= value <= CTID_MAX:
        raise PydanticCustomError("vmid", f"expected a Proxmox VM id, {CTID_MIN}..{CTID_MAX}")
    return value


def _check_address(value: str) -> str:
    if not ADDRESS_PATTERN.fullmatch(value):
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


def _check_api_url(value: str) -> str:
    """`https://host[:port]` and nothing else: no credentials, path or query to leak or misread."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (parts is None or parts.scheme != "https" or not parts.hostname or parts.username is not None
            or parts.password is not None or parts.path not in ("", "/", "/api2/json", "/api2/json/")
            or parts.query or parts.fragment or not ADDRESS_PATTERN.fullmatch(parts.hostname)
            or (port is not None and not 1 <= port <= 65535)):
        raise PydanticCustomError("api_url", "expected https://host[:port] (port 8006 if omitted)")
    return value


def _check_token_id(value: str) -> str:
    if not _TOKEN_ID.fullmatch(value):
        raise PydanticCustomError("token_id", "expected an API token id: user@realm!tokenname")
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise PydanticCustomError("env_name", "expected an environment variable name")
    return value


def _check_secret_ref(value: str) -> str:
    if not value.startswith(("@env:", "@file:")) or len(value.split(":", 1)[1]) == 0:
        raise PydanticCustomError(
            "secret_ref",
            "expected a reference, @env:NAME or @file:PATH (the inventory never holds a secret)")
    return value


def _check_glob(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("glob", "expected a name or glob")
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
VMID = Annotated[int, AfterValidator(_check_vmid)]
Address = Annotated[str, AfterValidator(_check_address)]
JumpHost = Annotated[str, AfterValidator(_check_jump_host)]
FilePath = Annotated[str, AfterValidator(_check_path)]
Seconds = Annotated[float, Field(gt=0, le=3600)]
KeepaliveSeconds = Annotated[float, Field(ge=0, le=3600)]  # 0: no keepalives
Vars = dict[VarName, Annotated[Any, AfterValidator(_check_json_value)]]
ApiUrl = Annotated[str, AfterValidator(_check_api_url)]
TokenId = Annotated[str, AfterValidator(_check_token_id)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Glob = Annotated[str, AfterValidator(_check_glob)]
SecretRef = Annotated[str, AfterValidator(_check_secret_ref)]
CtStatus = Literal["running", "stopped"]
GuestKind = Literal["lxc", "vm"]  # fleetfix.guests kinds that Proxmox lists


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
    # A login that is not root: pct/qm/pvesh (and a node's own work) through sudo (docs/security.md).
    become: bool = False
    become_user: Name = "root"
    become_password: SecretRef | None = None  # None: sudo must not ask (NOPASSWD)
    vars: Vars = {}


class DefaultsModel(ConnectionFields):
    pass


class ContainerModel(_Model):
    ctid: CTID
    name: Name | None = None  # None: "<node>/<ctid>"
    tags: list[Name] = []
    vars: Vars = {}


class VmModel(_Model):
    vmid: VMID
    name: Name | None = None  # None: "<node>/<vmid>"
    tags: list[Name] = []
    vars: Vars = {}


class NodeModel(ConnectionFields):
    name: Name
    address: Address
    tags: list[Name] = []
    include_node: bool | None = None  # None: the node is a target only when it lists no guests
    containers: list[ContainerModel] = []
    vms: list[VmModel] = []  # one id space with containers: a node's CT and VM never share an id


class ProxmoxSSHModel(_Model):
    """How to reach the discovered nodes over SSH; unset fields come from `defaults`."""

    user: Name = "root"
    port: Port = 22
    identity_file: FilePath | None = None
    known_hosts: FilePath | None = None
    accept_new: bool = False
    jump_host: JumpHost | None = None
    connect_timeout: Seconds = 10.0
    keepalive: KeepaliveSeconds = 15.0
    become: bool = False
    become_user: Name = "root"
    become_password: SecretRef | None = None


class ProxmoxFilterModel(_Model):
    tags: list[Glob] = []
    status: CtStatus | list[CtStatus] = []
    name: Glob | list[Glob] = []
    nodes: list[Glob] = []
    guests: GuestKind | list[GuestKind] = ["lxc"]  # VMs only when asked for: they need a guest agent


class ProxmoxModel(_Model):
    name: Name
    api: ApiUrl | None = None
    via_ssh: Name | None = None  # a node under `nodes:`; pvesh runs there
    pve_node: Name | None = None  # that node's name in PVE (default: its inventory name)
    token_id: TokenId | None = None
    token_secret_env: EnvName | None = None
    token_secret_file: FilePath | None = None
    token_secret: Any = None  # accepted by the schema only to refuse it with a clear message
    verify_tls: bool = True
    ca_file: FilePath | None = None
    timeout: Seconds = 10.0
    filter: ProxmoxFilterModel = ProxmoxFilterModel()
    ssh: ProxmoxSSHModel = ProxmoxSSHModel()
    node_addresses: dict[Name, Address] = {}
    tags: list[Name] = []
    vars: Vars = {}
    cache_ttl: Annotated[float, Field(ge=0, le=86400)] = 0.0


class GroupModel(_Model):
    targets: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    vars: Vars = {}


class WheelTrustModel(_Model):
    """One rule of `wheels: trust:`: wheels built on the `builders` may be installed on `install_on`. Both
    are lists of patterns as in `--limit` and groups (names, groups, globs, `tag:`, `node:`, ...)."""

    builders: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    install_on: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)


class WheelBuilderModel(_Model):
    """`wheels: builder:`: the CT template the operator trusts to build every key in a throw-away clone."""

    node: Name  # a node under `nodes:`
    template: CTID
    first_id: CTID = 9900  # clones take the first free id of first_id .. first_id + ids - 1
    ids: Annotated[int, Field(ge=1, le=10000)] = 100
    storage: Name | None = None  # full clones onto this storage; None: linked clones of the template
    install_on: list[Annotated[str, Field(min_length=1)]] = Field(default=["*"], min_length=1)


class WheelsModel(_Model):
    """Who may build for whom in the wheel cache (docs/security.md). No rule: a target installs only the
    wheels it built itself (and upstream's release wheels and the operator's --wheelhouse entries)."""

    trust: list[WheelTrustModel] = []
    builder: WheelBuilderModel | None = None
    # never: the CI wheelhouse only. No guest builds a wheel; each key is installed from a --wheelhouse
    # entry or upstream's verified release wheel, or refused on its target before anything is built.
    build: Literal["allowed", "never"] = "allowed"


class InventoryModel(_Model):
    defaults: DefaultsModel = DefaultsModel()
    nodes: list[NodeModel] = []  # at least one node or one proxmox source (checked in _build)
    proxmox: list[ProxmoxModel] = []
    groups: dict[Name, GroupModel] = {}
    wheels: WheelsModel = WheelsModel()
