"""GPU architecture rules: can the nvcc a build would really use compile code that runs on this GPU
(DOMAIN.md 4.3, 8)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.facts import Nvcc
from fleetfix.probe.rules.base import Context, Finding, Severity, dotted, finding, major_minor
from fleetfix.probe.rules.route import toolkit_fix
from fleetfix.probe.rules.tables import CUDA13_DROPPED_BELOW, oldest_nvcc_for


def build_nvcc(ctx: Context) -> tuple[Nvcc | None, str]:
    """The nvcc a build without an explicit CUDA_HOME picks, in torch's own order (_find_cuda_home:
    CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda), and where it came from."""
    cuda = ctx.facts.cuda
    env_home = ctx.facts.cuda.env_cuda_home
    if env_home:
        toolkit = cuda.toolkit_at(env_home.rstrip("/"))
        if toolkit and toolkit.nvcc and toolkit.version:
            return Nvcc(path=toolkit.nvcc, version=toolkit.version, release=toolkit.release), "CUDA_HOME"
    if cuda.nvcc_on_path and cuda.nvcc_on_path.version:
        return cuda.nvcc_on_path, "nvcc on PATH"
    linked = cuda.toolkit_at(cuda.default_link)
    if linked and linked.nvcc and linked.version:
        return Nvcc(path=linked.nvcc, version=linked.version, release=linked.release), "/usr/local/cuda"
    return None, "torch's CUDA (no nvcc yet: what the toolkit fix installs)"


def gpu_arch_unsupported(ctx: Context) -> Iterator[Finding]:
    caps = list(ctx.facts.gpu.compute_caps)
    for env in ctx.facts.pythons:
        if env.deep:
            caps += env.deep.capabilities
    used, source = build_nvcc(ctx)
    for cap in sorted(set(caps)):
        arch = major_minor(cap)
        if arch is None:
            continue
        for cuda in ctx.torch_cudas:
            version = used.version if used else cuda
            toolkit = major_minor(version)
            if toolkit is None:
                continue
            need = oldest_nvcc_for(arch)
            evidence = {"compute_cap": cap, "gpu_names": ctx.facts.gpu.names, "torch_cuda": cuda,
                        "nvcc_version": version, "nvcc_source": source,
                        "nvcc_path": used.path if used else None}
            fix = toolkit_fix(ctx, cuda) if need and (major_minor(cuda) or (0, 0)) >= need else {}
            if need and toolkit < need:
                yield finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} needs nvcc >= {dotted(need)}, but a build here uses nvcc "
                    f"{version} ({source}): extensions built for it fail with 'no kernel image is "
                    "available for execution'",
                    {**evidence, "minimum_nvcc": dotted(need)}, **fix,
                    hint=(f"build with CUDA_HOME=/usr/local/cuda-{cuda} (torch's CUDA {cuda} supports it)"
                          if fix else
                          f"use a torch build for CUDA >= {dotted(need)} and the matching toolkit"),
                )
            elif toolkit[0] >= 13 and arch < CUDA13_DROPPED_BELOW:
                yield finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} is Maxwell/Pascal/Volta, which nvcc {version} ({source}) "
                    "can no longer compile for (removed in 13.0)",
                    evidence, hint="use a torch build for CUDA 12.x and the matching 12.x toolkit",
                )
