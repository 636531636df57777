"""GPU architecture rules: can the toolkit a build uses compile for this GPU (DOMAIN.md 4.3, 8)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.rules.base import Context, Finding, Severity, dotted, finding, major_minor
from fleetfix.probe.rules.tables import CUDA13_DROPPED_BELOW, MIN_NVCC_FOR_ARCH


def gpu_arch_unsupported(ctx: Context) -> Iterator[Finding]:
    caps = list(ctx.facts.gpu.compute_caps)
    for env in ctx.facts.pythons:
        if env.deep:
            caps += env.deep.capabilities
    for cap in sorted(set(caps)):
        arch = major_minor(cap)
        if arch is None:
            continue
        for cuda in ctx.torch_cudas:
            toolkit = major_minor(cuda)
            if toolkit is None:
                continue
            need = MIN_NVCC_FOR_ARCH.get(arch)
            evidence = {"compute_cap": cap, "gpu_names": ctx.facts.gpu.names, "torch_cuda": cuda}
            if need and toolkit < need:
                yield finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} needs nvcc >= {dotted(need)}, but torch's CUDA is {cuda}: "
                    "extensions built for it fail with 'no kernel image is available for execution'",
                    {**evidence, "minimum_nvcc": dotted(need)},
                    hint=f"use a torch build for CUDA >= {dotted(need)} and the matching toolkit",
                )
            elif toolkit[0] >= 13 and arch < CUDA13_DROPPED_BELOW:
                yield finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} is Maxwell/Pascal/Volta, which CUDA {cuda} can no longer "
                    "compile for (removed in 13.0)",
                    evidence, hint="use a torch build for CUDA 12.x and the matching 12.x toolkit",
                )
