"""Fakes for discovery tests: a proxmoxer-like API object, PVE records, and sources to discover.

`FakeProxmox` answers `api(path).get(**params)` like proxmoxer's ProxmoxAPI does (the decoded `data`),
records every call, and raises an answer that is an exception; an unexpected path is a KeyError, so a
test cannot pass by making calls it did not plan.
"""

from __future__ import annotations

import copy
from typing import Any

from fleetfix.inventory.discovery.model import ApiAccess, GuestFilter, ProxmoxSource, TokenSecret
from fleetfix.target import SSHSettings

SECRET = "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
SECRET_ENV = "FLEETFIX_TEST_PVE_SECRET"


class _Resource:
    def __init__(self, api: FakeProxmox, path: str) -> None:
        self.api, self.path = api, path

    def get(self, **params: Any) -> Any:
        self.api.calls.append((self.path, params))
        answer = self.api.answers[self.path]
        if isinstance(answer, BaseException):
            raise answer
        return copy.deepcopy(answer)


class FakeProxmox:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.init_kwargs: dict[str, Any] = {}

    def __call__(self, path: str) -> _Resource:
        return _Resource(self, path)

    def factory(self, **kwargs: Any) -> FakeProxmox:
        self.init_kwargs = kwargs
        return self


def ct(
    vmid: int, name: str, node: str = "pve1", status: str = "running", tags: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A /cluster/resources entry for a container, shaped like PVE's."""
    record: dict[str, Any] = {
        "id": f"lxc/{vmid}",
        "type": "lxc",
        "vmid": vmid,
        "name": name,
        "node": node,
        "status": status,
        "template": 0,
        "maxmem": 536870912,
        "uptime": 0,
    }
    if tags is not None:
        record["tags"] = tags
    record.update(extra)
    return record


CLUSTER_STATUS = [
    {"type": "cluster", "id": "cluster", "name": "lab", "nodes": 2, "quorate": 1},
    {"type": "node", "id": "node/pve1", "name": "pve1", "ip": "127.0.0.11", "online": 1},
    {"type": "node", "id": "node/pve2", "name": "pve2", "ip": "127.0.0.12", "online": 1},
]


def api_source(
    *,
    name: str = "lab",
    flt: GuestFilter | None = None,
    node_addresses: dict[str, str] | None = None,
    verify_tls: bool = True,
    ca_file: str | None = None,
    secret: TokenSecret | None = None,
    cache_ttl: float = 0.0,
) -> ProxmoxSource:
    access = ApiAccess(
        host="127.0.0.1",
        port=8006,
        token_id="fleetfix@pve!audit",
        secret=secret or TokenSecret(env=SECRET_ENV),
        verify_tls=verify_tls,
        ca_file=ca_file,
    )
    return ProxmoxSource(
        name=name,
        api=access,
        filter=flt or GuestFilter(),
        node_ssh=SSHSettings(address="", user="root", port=2222),
        node_addresses=node_addresses or {},
        cache_ttl=cache_ttl,
    )
