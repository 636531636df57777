"""The dedicated wheel builder: a throw-away clone of the CT template the operator trusts builds a key.

For a key a target needs and the cache lacks (playbook/wheels.py asks, holding nothing of this module), with
`wheels: builder:` in the inventory (fleetfix.target.WheelBuilder):

    under the cache's lock of (key, "<builder id> clone"): the builder's entry for the key, if it is there
    (a clone made for another target meanwhile built it), else:
    pct clone TEMPLATE NEWID --hostname fleetfix-build-NEWID [--full 1 --storage S]
                                first free id of first_id .. first_id + ids - 1: "CT N already exists"
                                (or a VM's) → the next one, so ids the controller does not know about stay
    pct start NEWID
    the same playbook on a Target for the clone (run_in, from the runner): probed like any target, its
    earlier steps (the toolkit) run, then its wheels step builds and stores what it builds as the builder
    `clone:<node>/<template>` (WheelOptions.builder), never as a target's
    pct stop NEWID; pct destroy NEWID --force 1     always, also when anything above failed; a clone that
                                                    could not be destroyed is reported with its id

The key of what the clone built is the clone's own (its probe, its toolkit): the caller installs the entry
only where its own full key equals it, and otherwise builds for itself, with the reason
(`difference`). Why the template's clone may build for every target that names it: the operator named the
template, it is a CT only root on the node can change (a template cannot even be started, pve-container's
vm_start), and each clone lives only for one build, so no tenant's container ever builds for another.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetfix.errors import FleetfixError
from fleetfix.target import GuestRef, Target, WheelBuilder
from fleetfix.transport.base import CommandResult, Transport
from fleetfix.wheels.cache import WheelCache, key_digest

# pve-cluster's PVE::Cluster::check_vmid_unused, which `pct clone` dies with when NEWID is taken:
# "CT 9900 already exists on node 'pve1'" (or "VM ..." for a VM's id).
_ID_TAKEN = re.compile(r"^(?:CT|VM) \d+ already exists on node ")
_PCT_TIMEOUT = 600.0  # a full clone copies the template's disk


@dataclass(frozen=True)
class CloneRun:
    """What running the playbook in a clone came to: its status, why it stopped, and the key of every
    wheel its wheels steps built, installed or found (from their `wheel` events)."""

    status: str
    reason: str
    keys: list[dict[str, str]] = field(default_factory=list)


# run_in(clone target, builder id, event tap): plan and run the playbook on the clone, its wheels kept as the
# builder's, each `wheel` event's fields to the tap too. The runner gives it (it has the playbook, the vars,
# the facts and the guest drivers).
RunIn = Callable[[Target, str, Callable[[Mapping[str, Any]], None]], CloneRun]


@dataclass(frozen=True)
class CloneOutcome:
    """why: None when the builder's entry for the key should now be in the cache, else why not; left: the
    clone that could not be destroyed (its id, where, why), or ""."""

    why: str | None
    left: str = ""


class _CloneFailed(Exception):
    pass


def clone_name(newid: int) -> str:
    """The clone's hostname and target name: says what it is in `pct list` should it ever be left over."""
    return f"fleetfix-build-{newid}"


def difference(wanted: Mapping[str, str], built: list[dict[str, str]]) -> str:
    """Why the clone built nothing for wanted: the fields in which the closest key of the same distribution
    differs, or that it built none of it."""
    same_item = [key for key in built if key.get("name") == wanted.get("name")]
    if not same_item:
        return f"the clone built no {wanted.get('name')} wheel"
    best = min(same_item, key=lambda key: sum(key.get(n) != v for n, v in wanted.items()))
    fields = sorted(name for name in set(wanted) | set(best) if wanted.get(name) != best.get(name))
    shown = ", ".join(f"{name} {best.get(name, '')!r} in the clone, {wanted.get(name, '')!r} here"
                      for name in fields[:4])
    return f"the clone's key differs: {shown}" if fields else "the clone's wheel was not cached"


class CloneBuilds:
    """Clones of dedicated builders, one per key at a time; shared by every target of a run."""

    def __init__(self, *, node_transport: Callable[[WheelBuilder], Transport], run_in: RunIn,
                 event: Callable[..., None]) -> None:
        self.node_transport, self.run_in, self.event = node_transport, run_in, event
        self._rebuilt: set[tuple[str, str]] = set()  # (builder, key digest) rebuilt in this run

    def build(self, spec: WheelBuilder, key: Mapping[str, str], cache: WheelCache, *,
              variables: Mapping[str, Any], rebuild: bool = False) -> CloneOutcome:
        """Have a clone of spec build key unless its entry is there (for the caller's recap: whether the
        entry should now be there, else why not). The clone runs the playbook with variables, the inventory
        vars of the target that asked (the operator's, like the template)."""
        done = (spec.builder_id, key_digest(key))
        with cache.lock(key, spec.builder_id + "\nclone"):
            there = cache.lookup(key, spec.builder_id).entry is not None
            if there and (not rebuild or done in self._rebuilt):
                return CloneOutcome(None)
            self._rebuilt.add(done)
            return self._clone_and_run(spec, key, variables)

    def _clone_and_run(self, spec: WheelBuilder, key: Mapping[str, str], variables: Mapping[str, Any]
                       ) -> CloneOutcome:
        where = f"template {spec.template} on {spec.node.name}"
        try:
            node = self.node_transport(spec)
            newid = self._clone(node, spec)
        except (_CloneFailed, FleetfixError) as failure:
            self.event("wheel-clone", builder=spec.builder_id, action="clone-failed", reason=str(failure))
            return CloneOutcome(f"cloning {where} failed: {failure}")
        self.event("wheel-clone", builder=spec.builder_id, action="cloned", ctid=newid, key=dict(key))
        built: list[dict[str, str]] = []
        why: str | None = None
        try:
            started = _pct(node, "start", str(newid))
            if not started.ok:
                raise _CloneFailed(f"pct start {newid}: {_last_line(started)}")
            target = Target(name=clone_name(newid), node=spec.node, guest=GuestRef.lxc(newid),
                            vars=dict(variables), source=spec.builder_id)
            run = self.run_in(target, spec.builder_id,
                              lambda fields: built.append(dict(fields.get("key") or {})))
            if run.status == "failed" or run.status == "unreachable":
                why = f"the playbook failed in clone CT {newid}: {run.reason}"
            elif dict(key) not in built:
                why = difference(key, built)
        except (_CloneFailed, FleetfixError) as failure:
            why = f"clone CT {newid}: {failure}"
        finally:
            left = self._destroy(node, newid)
        if left is not None:
            # The wheel it built is still good (the cache checked it); the clone is the operator's to remove.
            self.event("wheel-clone", builder=spec.builder_id, action="left-behind", ctid=newid, reason=left)
            return CloneOutcome(why, f"clone CT {newid} left on {spec.node.name}: {left}")
        self.event("wheel-clone", builder=spec.builder_id, action="destroyed", ctid=newid, reason=why)
        return CloneOutcome(why)

    def _clone(self, node: Transport, spec: WheelBuilder) -> int:
        """pct clone into the first free id of the spec's range; its new id."""
        for newid in range(spec.first_id, spec.first_id + spec.ids):
            argv = ["clone", str(spec.template), str(newid), "--hostname", clone_name(newid)]
            if spec.storage is not None:  # --storage is for full clones only (clone_vm)
                argv += ["--full", "1", "--storage", spec.storage]
            made = _pct(node, *argv)
            if made.ok:
                return newid
            if not _ID_TAKEN.match(_last_line(made)):
                raise _CloneFailed(f"pct clone {spec.template} {newid}: {_last_line(made)}")
        raise _CloneFailed(f"no free id in {spec.first_id}..{spec.first_id + spec.ids - 1}")

    def _destroy(self, node: Transport, newid: int) -> str | None:
        """Stop and destroy the clone; None when it is gone, else why it is not."""
        with contextlib.suppress(FleetfixError):
            _pct(node, "stop", str(newid))  # "CT N not running" when it never started: fine
        try:
            gone = _pct(node, "destroy", str(newid), "--force", "1")
        except FleetfixError as error:
            return str(error)
        return None if gone.ok else _last_line(gone)


def _pct(node: Transport, *args: str) -> CommandResult:
    return node.execute(("pct", *args), timeout=_PCT_TIMEOUT)


def _last_line(result: CommandResult) -> str:
    if result.timed_out:
        return "timed out"
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    return (lines[-1] if lines else f"exit {result.exit_code}")[:300]
