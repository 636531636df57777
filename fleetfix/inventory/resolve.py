"""Which targets a command acts on: `--local`, `--host` (with `--ct`/`--vm`), or the inventory and `--limit`.

The command line hands over one `TargetRequest` (request.py); what comes back is a `Resolution`: the
targets, the discovered guests that were skipped (stopped, templates) and the warnings to show.
Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetfix.errors import ConfigError
from fleetfix.inventory.adhoc import adhoc_targets, local_target
from fleetfix.inventory.request import TargetRequest
from fleetfix.inventory.select import select
from fleetfix.secrets import FILE_PREFIX, mask_vars, resolve_reference
from fleetfix.target import Become, Target


@dataclass
class Resolution:
    """The targets of one command, with what discovery skipped and the warnings to show."""

    report_kind: ClassVar[str] = "targets"
    targets: list[Target]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (target or guest label, reason)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"targets": [target_json(t) for t in self.targets],
                "skipped": [{"target": label, "reason": reason} for label, reason in self.skipped]}


def resolve_targets(request: TargetRequest) -> Resolution:
    request.check()
    if request.local:
        return Resolution(select([local_target()], request.limit))
    if request.host:
        adhoc = select(adhoc_targets(
            request.host, port=request.port, user=request.user, identity_file=request.identity,
            known_hosts=request.known_hosts, accept_new=request.accept_new, ctids=request.ctids,
            vmids=request.vmids, connect_timeout=request.connect_timeout, become=_requested_become(request),
        ), request.limit)
        check_ssh_files(adhoc)
        return Resolution(adhoc)
    # Deferred: YAML and the inventory model are not needed for --host/--local, nor discovery for an
    # inventory without `proxmox:` sources (start-up).
    from fleetfix.inventory.load import load_inventory, resolve_inventory_path

    loaded = load_inventory(resolve_inventory_path(request.inventory), refresh=request.refresh)
    targets: Sequence[Target] = loaded.targets
    if request.accept_new or request.known_hosts or request.become:
        targets = [_override_ssh(t, accept_new=request.accept_new, known_hosts=request.known_hosts,
                                 become=_requested_become(request)) for t in targets]
    chosen = select(targets, request.limit)
    check_ssh_files(chosen)
    return Resolution(chosen, list(loaded.skipped), list(loaded.warnings))


def check_ssh_files(targets: Sequence[Target]) -> None:
    """A known_hosts or identity file that exists but is no regular file (a directory, typically), or a
    become password reference that does not resolve, is a mistake in the command or inventory: said once,
    exit 2, before any node is dialled (each connection would otherwise fail on its own, as if the node
    were unreachable)."""
    seen: set[str] = set()
    for target in targets:
        ssh = target.node.ssh
        if ssh is None:
            continue
        if ssh.become is not None and ssh.become.password is not None and ssh.become.password not in seen:
            seen.add(ssh.become.password)
            resolve_reference(ssh.become.password, "become_password")  # checked, not kept
        for what, value in (("known_hosts", ssh.known_hosts), ("identity file", ssh.identity_file)):
            if value is None or value in seen:
                continue
            seen.add(value)
            path = os.path.expanduser(value)
            if os.path.exists(path) and not os.path.isfile(path):
                raise ConfigError(f"{what} {value} is not a file")


def _requested_become(request: TargetRequest) -> Become | None:
    if not request.become:
        return None
    password = request.become_password
    if password is not None and password.startswith(FILE_PREFIX):  # relative to where the command runs
        password = FILE_PREFIX + os.path.abspath(os.path.expanduser(password[len(FILE_PREFIX):]))
    return Become(user=request.become_user or "root", password=password)


def _override_ssh(target: Target, *, accept_new: bool, known_hosts: str | None,
                  become: Become | None = None) -> Target:
    ssh = target.node.ssh
    if ssh is None:
        return target
    changes: dict[str, Any] = {"accept_new": accept_new or ssh.accept_new}
    if known_hosts:
        changes["known_hosts"] = known_hosts
    if become is not None:
        changes["become"] = become
    node = dataclasses.replace(target.node, ssh=dataclasses.replace(ssh, **changes))
    return dataclasses.replace(target, node=node)


def target_json(target: Target) -> dict[str, Any]:
    ssh = target.node.ssh
    return {
        "name": target.name,
        "node": target.node.name,
        "address": ssh.address if ssh else None,
        "port": ssh.port if ssh else None,
        "user": ssh.user if ssh else None,
        **target.guest.to_json(),
        "tags": sorted(target.tags),
        "groups": sorted(target.groups),
        "vars": mask_vars(target.vars),  # secret-named vars masked, as in every output
        "source": target.source,
    }
