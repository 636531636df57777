"""CUDA toolkit rules: is there an nvcc a build can use, and is it torch's (DOMAIN.md 2.4, 4.1)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.rules.arch import build_nvcc
from fleetfix.probe.rules.base import (
    BUILD_EXTENSIONS_PLAYBOOK,
    Context,
    Finding,
    Severity,
    dash,
    dotted,
    finding,
    major_minor,
)
from fleetfix.probe.rules.route import glibc_blocks, target_glibc, toolkit_fix, toolkit_hint, way_forward


def runtime_without_toolkit(ctx: Context) -> Iterator[Finding]:
    if ctx.nvccs():
        return
    for cuda in ctx.torch_cudas:
        torch = next(e.torch for e in ctx.facts.torch_envs if e.torch and e.torch.cuda == cuda)
        yield finding(
            "CUDA_RUNTIME_WITHOUT_TOOLKIT", Severity.ERROR,
            f"torch {torch.version} ships the CUDA {cuda} runtime but there is no nvcc: CUDA extensions "
            f"cannot be built (causal-conv1d's setup.py dies with NameError: name 'bare_metal_version' "
            "is not defined)",
            {"torch_version": torch.version, "torch_cuda": cuda, "toolkits": [],
             "nvcc_on_path": None, "distro_nvcc": None, "pip_nvcc": []},
            **toolkit_fix(ctx, cuda), hint=toolkit_hint(ctx, cuda),
        )


def toolkit_mismatch(ctx: Context) -> Iterator[Finding]:
    nvccs = ctx.nvccs()
    if not nvccs:
        return
    found = sorted({n.version for n in nvccs if n.version})
    for cuda in ctx.toolkit_needed():
        want = major_minor(cuda)
        if want is None:
            continue
        same_major = [v for v in found if (major_minor(v) or (0, 0))[0] == want[0]]
        evidence = {"torch_cuda": cuda, "nvcc_versions": found,
                    "nvccs": [n.model_dump() for n in nvccs]}
        if not same_major:
            yield finding(
                "CUDA_TOOLKIT_MAJOR_MISMATCH", Severity.ERROR,
                f"nvcc {', '.join(found) or '(unknown version)'} but torch was built with CUDA {cuda}: "
                "torch's cpp_extension refuses to build ('The detected CUDA version ... mismatches')",
                evidence, **toolkit_fix(ctx, cuda),
                hint=f"install CUDA {cuda} beside it (cuda-nvcc-{dash(cuda)}) and build with "
                     f"CUDA_HOME=/usr/local/cuda-{cuda}",
            )
        else:
            yield finding(
                "CUDA_TOOLKIT_MINOR_MISMATCH", Severity.WARNING,
                f"nvcc {', '.join(same_major)} but torch was built with CUDA {cuda}: builds only warn "
                "('minor version mismatch'); code from a newer nvcc may need a newer driver",
                evidence, **toolkit_fix(ctx, cuda),
                hint=f"install the exact toolkit (cuda-nvcc-{dash(cuda)}) and build with "
                     f"CUDA_HOME=/usr/local/cuda-{cuda}",
            )


def _glibc_symbol(nvcc: tuple[int, int]) -> str:
    """The first declaration that clashes: glibc 2.41's cospi for nvcc <= 12.9, glibc 2.42's rsqrt after."""
    return "cospi" if nvcc < (13, 0) else "rsqrt"


def nvcc_glibc_incompatible(ctx: Context) -> Iterator[Finding]:
    """An nvcc whose crt/math_functions.h does not compile against the target's glibc (tables.
    MIN_NVCC_FOR_GLIBC): every .cu build fails, whatever the host compiler. Judged for every nvcc
    installed (a broken toolkit, build planned or not) and for torch's CUDA where none is installed
    (the toolkit a fix would install could not build either)."""
    glibc = target_glibc(ctx)
    if glibc is None:
        return
    installed: dict[str, list[str]] = {}
    for nvcc in ctx.nvccs():
        if nvcc.version and glibc_blocks(ctx, nvcc.version):
            installed.setdefault(nvcc.version, []).append(nvcc.path)
    planned = [cuda for cuda in ctx.toolkit_needed() if glibc_blocks(ctx, cuda) and cuda not in installed]
    for version in [*installed, *planned]:
        need = glibc_blocks(ctx, version) or (0, 0)
        mm = major_minor(version) or (0, 0)
        torch_wants = version in ctx.torch_cudas
        where = (f"nvcc {version} ({', '.join(installed[version])})" if version in installed
                 else f"torch's CUDA {version} (no nvcc for it yet)")
        summary = (f"{where} cannot compile CUDA code against this target's glibc {dotted(glibc)}: every "
                   f".cu build stops in crt/math_functions.h ('exception specification is incompatible "
                   f"with that of previous function \"{_glibc_symbol(mm)}\"'); nvcc >= {dotted(need)} "
                   "guards it")
        if torch_wants and mm < (13, 0):
            summary += ("; no CUDA 12.x toolkit builds extensions here: the route is a torch built for "
                        f"CUDA >= {dotted(max(need, (13, 0)))}")
        hint = (way_forward(ctx, version) if torch_wants else
                f"build with an nvcc >= {dotted(need)} (CUDA_HOME pointing at it), or remove nvcc {version}")
        yield finding(
            "NVCC_GLIBC_INCOMPATIBLE", Severity.ERROR, summary,
            {"glibc": dotted(glibc), "nvcc_version": version, "nvcc_paths": installed.get(version, []),
             "minimum_nvcc": dotted(need), "torch_cuda": list(ctx.torch_cudas)},
            hint=hint,
        )


def default_link_mismatch(ctx: Context) -> Iterator[Finding]:
    cuda = ctx.facts.cuda
    if cuda.default_link is None or not ctx.torch_cudas:
        return
    linked = cuda.toolkit_at(cuda.default_link)
    linked_version = linked.version if linked else None
    if linked_version is None and "/cuda-" in cuda.default_link:
        linked_version = cuda.default_link.rsplit("/cuda-", 1)[1]
    have = {t.version for t in cuda.toolkits if t.nvcc}
    for want in ctx.torch_cudas:
        if linked_version == want or want not in have:
            continue   # fine, or the missing toolkit is the finding that matters
        yield finding(
            "CUDA_DEFAULT_LINK_MISMATCH", Severity.WARNING,
            f"/usr/local/cuda points at {cuda.default_link} (CUDA {linked_version or '?'}), not at torch's "
            f"CUDA {want}: a build without CUDA_HOME picks the wrong nvcc",
            {"default_link": cuda.default_link, "linked_version": linked_version, "torch_cuda": want},
            playbook=BUILD_EXTENSIONS_PLAYBOOK, vars={"cuda_version": want},
            hint=f"always build with CUDA_HOME=/usr/local/cuda-{want} (the build-extensions playbook does); "
                 f"or `update-alternatives --set cuda /usr/local/cuda-{want}`",
        )


def distro_nvcc(ctx: Context) -> Iterator[Finding]:
    nvcc = ctx.facts.cuda.distro_nvcc
    if nvcc is None:
        return
    wants = ", ".join(ctx.torch_cudas) or "(no torch)"
    yield finding(
        "DISTRO_NVCC_ON_PATH", Severity.WARNING,
        f"the distro's nvcc {nvcc.version or '?'} is at /usr/bin/nvcc: a build without CUDA_HOME uses "
        f"CUDA_HOME=/usr, not NVIDIA's toolkit (torch wants CUDA {wants})",
        {"distro_nvcc": nvcc.model_dump(), "torch_cuda": list(ctx.torch_cudas),
         "packages": [p.name for p in ctx.facts.cuda.packages if p.name.startswith("nvidia-cuda")]},
        hint="prefer NVIDIA's versioned toolkit and set CUDA_HOME explicitly; consider "
             "`apt-get remove nvidia-cuda-toolkit`",
    )


def build_picks_other_nvcc(ctx: Context) -> Iterator[Finding]:
    """CUDA_HOME set for logins (/etc/environment, profile files) or an nvcc first on PATH that is not
    torch's, while torch's toolkit is installed: a plain `pip install` builds with the wrong one.
    (/usr/local/cuda alone is CUDA_DEFAULT_LINK_MISMATCH.)"""
    used, source = build_nvcc(ctx)
    if used is None or source == "/usr/local/cuda":
        return
    installed = {t.version for t in ctx.facts.cuda.toolkits if t.nvcc}
    for cuda in ctx.torch_cudas:
        if used.version == cuda or cuda not in installed:
            continue
        same_major = (major_minor(used.version) or (0, 0))[0] == (major_minor(cuda) or (0, 0))[0]
        where = ctx.facts.cuda.env_cuda_home_file if source == "CUDA_HOME" else "PATH"
        yield finding(
            "BUILD_PICKS_OTHER_NVCC", Severity.WARNING if same_major else Severity.ERROR,
            f"a build here uses nvcc {used.version} ({source}, from {where}) although torch's CUDA {cuda} "
            "is installed: " + ("builds only warn ('minor version mismatch')" if same_major else
                                "torch's cpp_extension refuses ('The detected CUDA version ... mismatches')"),
            {"nvcc_path": used.path, "nvcc_version": used.version, "nvcc_source": source,
             "set_in": where, "torch_cuda": cuda},
            playbook=BUILD_EXTENSIONS_PLAYBOOK, vars={"cuda_version": cuda},
            hint=f"build with CUDA_HOME=/usr/local/cuda-{cuda} (build-extensions.yaml does), or change "
                 f"{where} to point at it",
        )
