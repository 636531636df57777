"""Helpers for the audit tests: a fake fleet whose containers answer the probe from recorded fixtures.

(A uniquely named module, not conftest.py, so `from audit_testkit import ...` cannot pick up another
directory's helpers.)

    world = FakeWorld({200: "healthy", 201: "problem_case"})
    world.cts[201] = "stopped"                 # pct refuses: the target is unreachable
    world.down.add("pve2")                     # the node's connection fails
    with world.fleet() as fleet: ...
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetfix.audit.dashboard import STACK_CODES, TOOLKIT_CODES, Dashboard, ProblemGroup, StackRow
from fleetfix.errors import ConnectError
from fleetfix.fleet import Fleet
from fleetfix.probe import Finding, Fix, Severity
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult
from fleetfix.transport.fake import ANY, FakeCall, FakeTransport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def edited(name: str, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(load_fixture(name))
    edit(data)
    return data


def interrupt_dpkg(data: dict[str, Any]) -> None:
    """The edit that breaks a healthy container: an interrupted dpkg run (DPKG_INTERRUPTED, error)."""
    data["dpkg"]["interrupted"] = True
    data["dpkg"]["pending_updates"] = 3


def make_target(node: str, ctid: int, *, name: str | None = None, groups: Iterable[str] = (),
                tags: Iterable[str] = (), vars: dict[str, Any] | None = None) -> Target:
    # Loopback only, never connected to: the FakeWorld connector answers instead.
    ssh = SSHSettings(address="127.0.0.1", port=2200 + sum(map(ord, node)) % 100, user=node)
    return Target(name=name or f"{node}/{ctid}", node=NodeRef(node, ssh), guest=GuestRef.lxc(ctid),
                  vars=vars or {}, groups=frozenset(groups), tags=frozenset(tags))


@dataclass
class FakeWorld:
    """What each container's probe prints: a fixture name, an edited fixture dict, or "stopped"."""

    cts: dict[int, str | dict[str, Any]]
    down: set[str] = field(default_factory=set)  # node names whose connection fails

    def connect(self, settings: SSHSettings) -> FakeTransport:
        if settings.user in self.down:
            raise ConnectError(f"{settings.address}:{settings.port}: connection refused")
        node = FakeTransport(settings.user)
        node.on(re.compile(r"^pct exec "), self.probe)
        return node.on(ANY, rc=1, stderr="no node facts in this fake\n")  # node facts: unknown

    def probe(self, call: FakeCall) -> CommandResult:
        """What `pct exec CTID ...` prints for the container's state."""
        ctid = int(call.argv[2])
        state = self.cts.get(ctid, "missing")
        if state == "stopped":
            return CommandResult(255, "", f"container '{ctid}' not running!\n", 0.0)
        if state == "missing":
            missing = f"Configuration file 'nodes/x/lxc/{ctid}.conf' does not exist\n"
            return CommandResult(255, "", missing, 0.0)
        data = load_fixture(state) if isinstance(state, str) else state
        return CommandResult(0, json.dumps(data), "", 0.01)

    def fleet(self) -> Fleet:
        return Fleet(connect=self.connect)


def finding(code: str, severity: str = "error", **evidence: Any) -> Finding:
    return Finding(code=code, severity=Severity(severity), summary=f"{code} summary", evidence=evidence,
                   fix=Fix(hint="do the thing"))


def assert_versions_agree_with_problems(dash: Dashboard) -> None:
    """Every target's Versions row says what its Problems group says of its version stack: the same worst
    severity, and no "toolkit matches" for a CUDA a toolkit finding is about. A page of several sites:
    each site's Versions against its own groups (a target name may be at two sites), and the page's
    Versions is all sites' rows together."""
    if dash.sites:
        assert sum(len(r.targets) for r in dash.versions.rows) == sum(
            len(r.targets) for s in dash.sites for r in s.versions.rows)
        for site in dash.sites:
            _versions_agree([g for g in dash.groups if g.site == site.site], site.versions.rows)
        return
    _versions_agree(dash.groups, dash.versions.rows)


def _versions_agree(groups: Sequence[ProblemGroup], versions: Sequence[StackRow]) -> None:
    group_of = {t.name: g for g in groups for t in g.targets}
    rows = [(name, row) for row in versions for name in row.targets]
    probed = [t.name for g in groups if g.health not in ("unreachable", "failed") for t in g.targets]
    assert sorted(name for name, _ in rows) == sorted(probed)  # every probed target has its row
    for name, row in rows:
        stack = [f for f in group_of[name].findings if f.code in STACK_CODES]
        severities = {f.severity for f in stack}
        expected = "error" if "error" in severities else "warning" if "warning" in severities else None
        assert row.verdict == expected if expected else row.verdict in ("ok", "unknown"), (name, row)
        for finding in stack:
            if finding.code in TOOLKIT_CODES and finding.evidence.get("torch_cuda"):
                assert f"toolkit matches CUDA {finding.evidence['torch_cuda']}" not in row.note, (name, row)
