"""Which way a missing toolkit can be installed on this target: NVIDIA's apt repository, or (where
apt cannot serve it) the pip wheels. Pure; shared by the toolkit and repository rules so that every
finding prescribes the same, working playbook."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetfix.probe.rules.base import (
    CUDA_TOOLKIT_PIP_PLAYBOOK,
    CUDA_TOOLKIT_PLAYBOOK,
    Context,
    dash,
    dotted,
    major_minor,
)
from fleetfix.probe.rules.tables import REPO_NEWEST_CUDA, REPO_OLDEST_CUDA


@dataclass(frozen=True)
class Route:
    way: str                  # "apt" | "pip"
    why: str = ""             # for "pip": why apt cannot serve this CUDA here
    repo_lacks: bool = False  # the repository exists but does not carry this CUDA (NVIDIA_REPO_LACKS_CUDA)


def toolkit_route(ctx: Context, cuda: str) -> Route:
    apt, os = ctx.facts.apt, ctx.facts.os
    if not apt.present:
        return Route("pip", "no apt-get on this target")
    distro, arch = os.nvidia_distro, os.nvidia_arch
    if not (distro and arch):
        return Route("pip", "NVIDIA publishes no apt repository for this OS/CPU")
    cuda_repos = {s.repo_distro for s in apt.enabled_sources if s.is_cuda_repo}
    if apt.nvidia_index.files and cuda_repos == {distro}:
        if apt.nvidia_index.carries(cuda) is False:
            return Route("pip", f"apt's index of NVIDIA's {distro}/{arch} repository has no "
                                f"cuda-nvcc-{dash(cuda)}", repo_lacks=True)
        return Route("apt")
    oldest, wanted = REPO_OLDEST_CUDA.get((distro, arch)), major_minor(cuda)
    if oldest and wanted and wanted < oldest:
        return Route("pip", f"NVIDIA's {distro}/{arch} repository starts at CUDA {dotted(oldest)}",
                     repo_lacks=True)
    newest = REPO_NEWEST_CUDA.get(distro or "")
    if newest and wanted and wanted > newest:
        return Route("pip", f"NVIDIA's {distro} repository ends at CUDA {dotted(newest)}", repo_lacks=True)
    if apt.uses_sqv and distro != "debian13":
        return Route("pip", f"apt's sqv rejects the SHA-1-bound key of NVIDIA's {distro} repository")
    return Route("apt")


def interpreter_for(ctx: Context, cuda: str) -> str:
    return next((e.interpreter for e in ctx.facts.torch_envs if e.torch and e.torch.cuda == cuda), "python3")


def toolkit_fix(ctx: Context, cuda: str) -> dict[str, Any]:
    """The playbook (and vars) that installs torch's CUDA here: apt where it can, else the pip wheels."""
    if toolkit_route(ctx, cuda).way == "apt":
        return {"playbook": CUDA_TOOLKIT_PLAYBOOK, "vars": {"cuda_version": cuda}}
    return {"playbook": CUDA_TOOLKIT_PIP_PLAYBOOK,
            "vars": {"cuda_version": cuda, "python": interpreter_for(ctx, cuda)}}


def toolkit_hint(ctx: Context, cuda: str) -> str:
    route = toolkit_route(ctx, cuda)
    if route.way == "apt":
        return (f"install cuda-nvcc-{dash(cuda)} cuda-cudart-dev-{dash(cuda)} (no driver packages) and "
                f"build with CUDA_HOME=/usr/local/cuda-{cuda}")
    return (f"{route.why}: install NVIDIA's CUDA {cuda} wheels into torch's env and build with the "
            "CUDA_HOME the pip playbook assembles")
