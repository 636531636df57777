"""GPU architecture rules: can the nvcc a build would really use compile code that runs on this GPU
(DOMAIN.md 4.3, 8)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.facts import Nvcc
from fleetfix.probe.rules.base import Context, Finding, Severity, dotted, finding, major_minor
from fleetfix.probe.rules.route import toolkit_fix
from fleetfix.probe.rules.tables import CUDA13_DROPPED_BELOW, TORCH_CUDA_BUILDS, oldest_nvcc_for


def build_nvcc(ctx: Context) -> tuple[Nvcc | None, str]:
    """The nvcc a build without an explicit CUDA_HOME picks, in torch's own order (_find_cuda_home:
    CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda), and where it came from."""
    cuda = ctx.facts.cuda
    env_home = cuda.env_cuda_home_target or cuda.env_cuda_home   # a symlink names what it points at
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


def _runs_on(arch_list: list[str], cap: tuple[int, int]) -> bool:
    """Whether a wheel built for arch_list has code for a GPU of compute capability cap: SASS for the
    same major with a minor <= its own (binary compatibility; an `a` target only on its exact arch), or
    PTX (compute_XY) of an arch <= it, which the driver JIT-compiles forward."""
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        suffix = number[-1] if number[-1:] in ("a", "f") else ""
        digits = number[: len(number) - len(suffix)]
        if not digits.isdigit() or len(digits) < 2:
            continue
        target = (int(digits[:-1]), int(digits[-1]))
        if kind == "compute" and target <= cap:
            return True
        same_family = kind == "sm" and target[0] == cap[0] and target[1] <= cap[1]
        if same_family and (suffix != "a" or target == cap):
            return True
    return False


def torch_wheel_lacks_arch(ctx: Context) -> Iterator[Finding]:
    """The torch build itself has no kernels for the GPU (recent cu12x/cu13x wheels dropped Maxwell,
    Pascal, Volta): 'no kernel image is available' in torch itself, not in an extension."""
    for env in ctx.facts.torch_envs:
        torch = env.torch
        if torch is None or not torch.cuda:
            continue
        confirmed = bool(env.deep and env.deep.arch_list)
        arch_list = list(env.deep.arch_list) if env.deep and confirmed else torch.arch_list
        if not arch_list:
            continue
        caps = set(ctx.facts.gpu.compute_caps) | set(env.deep.capabilities if env.deep else [])
        for cap in sorted(caps):
            mm = major_minor(cap)
            if mm is None or _runs_on(arch_list, mm):
                continue
            yield finding(
                "TORCH_WHEEL_LACKS_ARCH", Severity.ERROR,
                f"torch {torch.version} in {env.interpreter} was built for {' '.join(arch_list)}, nothing "
                f"that runs on this sm_{mm[0]}{mm[1]} GPU: torch itself fails with 'no kernel image is "
                "available for execution on the device'",
                {"interpreter": env.interpreter, "torch_version": torch.version, "torch_cuda": torch.cuda,
                 "arch_list": arch_list, "compute_cap": cap, "gpu_names": ctx.facts.gpu.names,
                 "confirmed_by_deep": confirmed},
                hint=_build_hint(mm),
            )


def torch_build_for(cap: tuple[int, int]) -> tuple[tuple[int, int], str] | None:
    """The newest torch release (of tables.TORCH_CUDA_BUILDS) and its newest CUDA build whose kernels run
    on a GPU of this compute capability, or None when no build there does."""
    for release in sorted(TORCH_CUDA_BUILDS, reverse=True):
        builds = TORCH_CUDA_BUILDS[release]
        for cuda in sorted(builds, key=lambda v: tuple(int(p) for p in v.split(".")), reverse=True):
            if _runs_on(list(builds[cuda]), cap):
                return release, cuda
    return None


def _build_hint(cap: tuple[int, int]) -> str:
    found = torch_build_for(cap)
    if found is None:
        return "no torch build in fleetfix's table has kernels for this GPU: move the workload to a newer GPU"
    (major, minor), cuda = found
    tag = "cu" + cuda.replace(".", "")
    return (f"install a torch build whose arch list covers sm_{cap[0]}{cap[1]}: torch {major}.{minor} {tag} "
            f"(pip install 'torch=={major}.{minor}.*' --index-url https://download.pytorch.org/whl/{tag}), "
            f"then the CUDA {cuda} toolkit for building extensions")
