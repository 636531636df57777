"""What every rule module shares: Finding/Fix/Severity, the Context a rule reads, and small helpers.

A rule is a pure function `Context -> Iterator[Finding]`: no I/O, no globals written. It is registered
once, in `rules/__init__.py`, together with the codes it may emit; that registration order is the
root-cause order of the report.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field

from fleetfix.probe.facts import Facts, NodeFacts, Nvcc, PythonEnv, empty, version_tuple
from fleetfix.target import NODE, GuestRef

CUDA_TOOLKIT_PLAYBOOK = "playbooks/cuda-toolkit.yaml"
CUDA_TOOLKIT_PIP_PLAYBOOK = "playbooks/cuda-toolkit-pip.yaml"
BUILD_EXTENSIONS_PLAYBOOK = "playbooks/build-extensions.yaml"


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Fix(BaseModel):
    model_config = ConfigDict(frozen=True)

    playbook: str | None = None
    vars: dict[str, Any] = Field(default_factory=empty(dict))
    hint: str

    def text(self) -> str:
        """One line to show a person: the `fleetfix apply` command to paste (each --var quoted for the
        shell; lists comma-separated, as build-extensions reads them) — then the hint."""
        parts = []
        if self.playbook:
            assignments = (f"{name}={_var_text(value)}" for name, value in self.vars.items())
            options = (f"--var {shlex.quote(assignment)}" for assignment in assignments)
            parts.append(" ".join(["fleetfix apply", self.playbook, *options]))
        if self.hint:
            parts.append(self.hint)
        return " — ".join(parts)


def _var_text(value: Any) -> str:
    return ",".join(str(item) for item in value) if isinstance(value, list | tuple) else str(value)


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str
    severity: Severity
    summary: str
    evidence: dict[str, Any] = Field(default_factory=empty(dict))
    fix: Fix


@dataclass(frozen=True)
class Context:
    """What a rule sees: the target's facts, the node's, the inventory's expectations, derived values, and
    what the target is (its guest kind and id: a fix names `pct` for a container, `qm` for a VM, no Proxmox
    command for a machine of its own; rules/guestkind.py has those texts)."""

    facts: Facts
    node: NodeFacts | None
    required: frozenset[str]
    torch_cudas: tuple[str, ...]          # distinct torch CUDA versions among the python envs
    installs_planned: bool = False        # some finding's fix installs packages or builds
    builds_planned: bool = False          # some finding's fix builds an extension
    guest: GuestRef = NODE                # the target: the node / a plain host, a container, a VM

    @classmethod
    def build(cls, facts: Facts, node: NodeFacts | None, required: Collection[str] = (),
              guest: GuestRef = NODE) -> Context:
        cudas = tuple(dict.fromkeys(
            env.torch.cuda for env in facts.torch_envs if env.torch is not None and env.torch.cuda
        ))
        return cls(facts, node, frozenset(required), cudas, guest=guest)

    def with_planned_fixes(self, findings: list[Finding]) -> Context:
        acting = [f for f in findings if f.severity != Severity.INFO and f.fix.playbook]
        builds = any(f.fix.playbook == BUILD_EXTENSIONS_PLAYBOOK for f in acting)
        return replace(self, installs_planned=bool(acting), builds_planned=builds)

    def nvccs(self, env: PythonEnv | None = None) -> list[Nvcc]:
        """Every nvcc that can build: versioned toolkits, PATH, /usr/bin, a conda env's, and pip wheels
        that come with the runtime headers and CCCL. An nvcc that prints no version (a dangling wrapper, a
        broken install) builds nothing, and neither does a bare nvcc wheel (JAX pulls one in alone)."""
        cuda = self.facts.cuda
        found = [Nvcc(path=t.nvcc, version=t.version, release=t.release) for t in cuda.toolkits if t.nvcc]
        found += [n for n in (cuda.nvcc_on_path, cuda.distro_nvcc) if n is not None]
        envs = [env] if env else self.facts.pythons
        found += [n for e in envs for n in e.pip_nvcc if n.complete is not False]
        found += [e.conda_nvcc for e in envs if e.conda_nvcc is not None]
        return [n for n in found if n.version]

    def toolkit_needed(self) -> list[str]:
        """torch CUDA versions with no exactly matching nvcc (what the cuda-toolkit playbook installs)."""
        have = {n.version for n in self.nvccs() if n.version}
        return [v for v in self.torch_cudas if v not in have]

    def driver_version(self) -> tuple[str | None, str]:
        """The host driver version and where it came from; the kernel module is authoritative."""
        if self.node and self.node.kernel_module_version:
            return self.node.kernel_module_version, "node kernel module (/proc/driver/nvidia/version)"
        if self.facts.gpu.driver_version:
            return self.facts.gpu.driver_version, "nvidia-smi"
        return None, "unknown"


Rule = Callable[[Context], Iterator[Finding]]


class FixPlaybook(TypedDict, total=False):
    """The playbook part of a Fix, as rules pass it on (`**toolkit_fix(...)`): none, or playbook and vars."""

    playbook: str | None
    vars: dict[str, Any] | None


def finding(code: str, severity: Severity, summary: str, evidence: dict[str, Any], *, hint: str,
            **fix: Unpack[FixPlaybook]) -> Finding:
    """A Finding; the registry checks that the rule emitting it registered the code."""
    return Finding(code=code, severity=severity, summary=summary, evidence=evidence,
                   fix=Fix(playbook=fix.get("playbook"), vars=fix.get("vars") or {}, hint=hint))


def major_minor(version: str | None) -> tuple[int, int] | None:
    parsed = version_tuple(version)
    return (parsed[0], parsed[1]) if parsed and len(parsed) >= 2 else None


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def dash(cuda: str) -> str:
    return cuda.replace(".", "-")


def apt_cleanup_fix(ctx: Context) -> dict[str, Any]:
    """The cuda-toolkit playbook also removes what breaks apt (duplicates, old apt-key entries)."""
    variables = {"cuda_version": ctx.torch_cudas[0]} if ctx.torch_cudas else {}
    return {"playbook": CUDA_TOOLKIT_PLAYBOOK, "vars": variables}
