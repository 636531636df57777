"""Which way a missing toolkit can be installed on this target: NVIDIA's apt repository, NVIDIA's pip
wheels (CUDA >= 13.0 only), or neither. Pure; shared by the toolkit and repository rules so that every
finding prescribes the same, working playbook - or none, with the way forward, where no playbook can
work.

Where no route exists ("none"): NVIDIA's cu12 PyPI wheels carry no nvcc (tables.PIP_NVCC_FROM), and on
glibc >= 2.41 no 12.x nvcc compiles anything (tables.MIN_NVCC_FOR_GLIBC). fleetfix then prescribes a torch
built for a CUDA that can be installed here (13.x), not a toolkit that cannot work. NVIDIA's
redistributable archives would be a third way for 12.x on an older glibc: docs/findings.md has the
design, not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetfix.probe.facts import version_tuple
from fleetfix.probe.rules.base import (
    CUDA_TOOLKIT_PIP_PLAYBOOK,
    CUDA_TOOLKIT_PLAYBOOK,
    Context,
    dash,
    dotted,
    major_minor,
)
from fleetfix.probe.rules.tables import (
    PIP_NVCC_FROM,
    REPO_NEWEST_CUDA,
    REPO_OLDEST_CUDA,
    oldest_nvcc_for_glibc,
)

# The torch index that serves CUDA 13.0 builds (pytorch.org's "Get started" command for CUDA 13.0).
TORCH_CU130_INDEX = "https://download.pytorch.org/whl/cu130"


@dataclass(frozen=True)
class Route:
    way: str                  # "apt" | "pip" | "none"
    why: str = ""             # for "pip" / "none": why apt cannot serve this CUDA here
    repo_lacks: bool = False  # the repository exists but does not carry this CUDA (NVIDIA_REPO_LACKS_CUDA)
    glibc_blocks: bool = False  # this CUDA's nvcc cannot compile against the target's glibc at all


def target_glibc(ctx: Context) -> tuple[int, int] | None:
    """The target's glibc (major, minor): the probe's own reading, else a python env's confstr."""
    text = ctx.facts.build.glibc
    if not text:
        libcs = [env.libc for env in ctx.facts.pythons if env.libc and env.libc.startswith("glibc ")]
        text = libcs[0].split(" ", 1)[1] if libcs else None
    parsed = version_tuple(text)
    return (parsed[0], parsed[1]) if parsed and len(parsed) >= 2 else None


def glibc_blocks(ctx: Context, nvcc_version: str | None) -> tuple[int, int] | None:
    """The oldest nvcc that compiles against this target's glibc, when `nvcc_version` is older; else None."""
    glibc, nvcc = target_glibc(ctx), major_minor(nvcc_version)
    need = oldest_nvcc_for_glibc(glibc) if glibc else None
    return need if need and nvcc and nvcc < need else None


def pip_serves(cuda: str) -> bool:
    """NVIDIA's PyPI wheels ship an nvcc for this CUDA (13.x: nvidia/cu13/bin/nvcc; cu12: ptxas only)."""
    wanted = major_minor(cuda)
    return wanted is not None and wanted >= PIP_NVCC_FROM


def _apt_route(ctx: Context, cuda: str) -> Route | None:
    """None when NVIDIA's apt repository serves this CUDA here, else why not (as a pip route)."""
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
        return None
    oldest, wanted = REPO_OLDEST_CUDA.get((distro, arch)), major_minor(cuda)
    if oldest and wanted and wanted < oldest:
        return Route("pip", f"NVIDIA's {distro}/{arch} repository starts at CUDA {dotted(oldest)}",
                     repo_lacks=True)
    newest = REPO_NEWEST_CUDA.get(distro or "")
    if newest and wanted and wanted > newest:
        return Route("pip", f"NVIDIA's {distro} repository ends at CUDA {dotted(newest)}", repo_lacks=True)
    if apt.uses_sqv and distro != "debian13":
        return Route("pip", f"apt's sqv rejects the SHA-1-bound key of NVIDIA's {distro} repository")
    return None


def toolkit_route(ctx: Context, cuda: str) -> Route:
    not_apt = _apt_route(ctx, cuda)
    repo_lacks = bool(not_apt and not_apt.repo_lacks)
    need = glibc_blocks(ctx, cuda)
    if need:
        glibc = target_glibc(ctx) or (0, 0)
        why = (f"nvcc {cuda}'s headers do not compile against glibc {dotted(glibc)} (nvcc >= "
               f"{dotted(need)} does)")
        return Route("none", f"{not_apt.why}; {why}" if not_apt else why, repo_lacks=repo_lacks,
                     glibc_blocks=True)
    if not_apt is None:
        return Route("apt")
    if pip_serves(cuda):
        return not_apt
    return Route("none", f"{not_apt.why}, and NVIDIA's CUDA {cuda} wheels on PyPI ship no nvcc "
                         "(nvidia-cuda-nvcc-cu12 holds only ptxas)", repo_lacks=repo_lacks)


def interpreter_for(ctx: Context, cuda: str) -> str:
    return next((e.interpreter for e in ctx.facts.torch_envs if e.torch and e.torch.cuda == cuda), "python3")


def toolkit_fix(ctx: Context, cuda: str) -> dict[str, Any]:
    """The playbook (and vars) that installs torch's CUDA here: apt where it can, else the pip wheels;
    no playbook where neither can (the hint says what to do instead)."""
    way = toolkit_route(ctx, cuda).way
    if way == "apt":
        return {"playbook": CUDA_TOOLKIT_PLAYBOOK, "vars": {"cuda_version": cuda}}
    if way == "pip":
        return {"playbook": CUDA_TOOLKIT_PIP_PLAYBOOK,
                "vars": {"cuda_version": cuda, "python": interpreter_for(ctx, cuda)}}
    return {}


def way_forward(ctx: Context, cuda: str) -> str:
    """What to do where no CUDA `cuda` toolkit can be installed: a newer 13.x nvcc beside a 13.x torch
    (torch builds with another minor of its major, warning only), else a torch built for CUDA 13."""
    need = max(PIP_NVCC_FROM, glibc_blocks(ctx, cuda) or PIP_NVCC_FROM)
    wanted = major_minor(cuda) or (0, 0)
    if wanted[0] == need[0]:
        return (f"install CUDA {dotted(need)}'s toolkit ({CUDA_TOOLKIT_PIP_PLAYBOOK} --var "
                f"cuda_version={dotted(need)}) and build with --var cuda_home=<its CUDA_HOME>: torch's "
                "cpp_extension accepts another minor of its CUDA major with a warning")
    python = interpreter_for(ctx, cuda)
    index = f" --index-url {TORCH_CU130_INDEX}" if need == PIP_NVCC_FROM else ""
    return (f"install a torch built for CUDA >= {dotted(need)} into {python}'s env (`{python} -m pip "
            f"install torch{index}`), then run {CUDA_TOOLKIT_PIP_PLAYBOOK} (or {CUDA_TOOLKIT_PLAYBOOK} "
            "where NVIDIA's apt repository carries it)")


def toolkit_hint(ctx: Context, cuda: str) -> str:
    route = toolkit_route(ctx, cuda)
    if route.way == "apt":
        return (f"install cuda-nvcc-{dash(cuda)} cuda-cudart-dev-{dash(cuda)} (no driver packages) and "
                f"build with CUDA_HOME=/usr/local/cuda-{cuda}")
    if route.way == "pip":
        return (f"{route.why}: install NVIDIA's CUDA {cuda} wheels into torch's env and build with the "
                "CUDA_HOME the pip playbook assembles")
    return f"no CUDA {cuda} toolkit can be installed here ({route.why}): {way_forward(ctx, cuda)}"
