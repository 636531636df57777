"""Build-host rules: what an extension build needs besides nvcc (a host compiler nvcc accepts, Python.h,
g++ and ninja, memory per compile job, a /tmp that can hold the build tree). They judge only targets
where a fix builds or installs something, so a healthy inference container is not nagged - except an
installed nvcc that refuses the default compiler, which is a broken toolkit either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fleetfix.probe.facts import version_tuple
from fleetfix.probe.rules import guestkind
from fleetfix.probe.rules.arch import build_nvcc
from fleetfix.probe.rules.base import Context, Finding, Severity, finding, major_minor
from fleetfix.probe.rules.route import toolkit_route
from fleetfix.probe.rules.tables import (
    DISTRO_GXX_MAJORS,
    GCC_CXX20_FROM,
    MAX_GCC_FOR_NVCC,
    TORCH_CXX20_FROM,
)

# Memory one compile job needs: the full causal-conv1d build peaked at 10.1 GB with MAX_JOBS=2
# (docs/extensions.md, measured on the test bed); mamba-ssm's setup.py compiles the same way.
MEM_PER_JOB_MB = 5120
# An extension's build tree is ~1 GB (causal-conv1d's .so alone is 263 MB, docs/extensions.md).
TMP_BUILD_MB = 2048


def _judged_nvcc(ctx: Context) -> tuple[str | None, str]:
    """The nvcc whose host-compiler limit matters: what the toolkit fix installs (torch's X.Y) when one
    is planned, else torch's own toolkit when installed (build-extensions.yaml builds with it), else the
    nvcc a plain build picks. An installed nvcc is judged whether or not a build is planned: one that
    refuses the default compiler is a broken toolkit."""
    installed = {n.version for n in ctx.nvccs() if n.version}
    for cuda in ctx.torch_cudas:
        if cuda not in installed and ctx.installs_planned and toolkit_route(ctx, cuda).way != "none":
            return cuda, "torch's CUDA (what the toolkit fix installs)"
        if cuda in installed:
            return cuda, "torch's CUDA (installed)"
    used, source = build_nvcc(ctx)
    return (used.version, source) if used else (None, "")


def _compiler_fix(ctx: Context, fits: Callable[[int], bool], want: str) -> str:
    """How to get a g++ that `fits`: one installed beside the default (Debian's g++-N), else one the
    distribution's archive has; CC/CXX are what torch's cpp_extension and nvcc both obey (torch 2.14.1
    cpp_extension.py: BuildExtension._check_abi reads the compiler distutils takes from CXX, and
    unix_cuda_flags passes `-ccbin $CC` to nvcc). NVCC_PREPEND_FLAGS alone comes too late: torch's
    _check_cuda_version refuses the default g++ before nvcc runs."""
    build, os = ctx.facts.build, ctx.facts.os
    installed = sorted((n for n in build.gxx_majors if fits(n)), reverse=True)
    if installed:
        n = installed[0]
        return (f"g++-{n} is installed: build with CC=/usr/bin/gcc-{n} CXX=/usr/bin/g++-{n} "
                "(build-extensions.yaml picks it itself)")
    known = DISTRO_GXX_MAJORS.get((os.id or "", os.version_id or ""))
    name = os.pretty_name or f"{os.id} {os.version_id}"
    if known is None:
        return (f"install a {want} from the distribution and build with CC=/usr/bin/gcc-N "
                "CXX=/usr/bin/g++-N")
    offered = sorted((n for n in known if fits(n)), reverse=True)
    if not offered:
        return f"{name}'s archive has no {want} (it has g++-{', g++-'.join(map(str, known))})"
    n = offered[0]
    return (f"install g++-{n} (in {name}'s archive) and build with CC=/usr/bin/gcc-{n} "
            f"CXX=/usr/bin/g++-{n}")


def host_compiler_too_new(ctx: Context) -> Iterator[Finding]:
    build = ctx.facts.build
    gcc = version_tuple(build.gxx_version or build.gcc_version)
    if gcc is None:
        return
    version, source = _judged_nvcc(ctx)
    mm = major_minor(version)
    newest = MAX_GCC_FOR_NVCC.get(mm) if mm else None
    if newest is None or gcc[0] <= newest:
        return
    compiler = f"g++ {build.gxx_version}" if build.gxx_version else f"gcc {build.gcc_version}"
    fix = _compiler_fix(ctx, lambda n: GCC_CXX20_FROM <= n <= newest, f"g++ <= {newest}")
    yield finding(
        "HOST_COMPILER_TOO_NEW", Severity.ERROR,
        f"{compiler} is newer than nvcc {version} accepts (gcc <= {newest}): torch's cpp_extension refuses "
        f"it before compiling ('greater than the maximum required version by CUDA {version}'), and nvcc "
        f"stops at crt/host_config.h ('gcc versions later than {newest} are not supported!')",
        {"gcc_version": build.gcc_version, "gxx_version": build.gxx_version, "nvcc_version": version,
         "newest_gcc": newest, "nvcc_source": source, "gxx_majors": list(build.gxx_majors)},
        hint=f"{fix}; or use a newer CUDA whose nvcc accepts gcc {gcc[0]}; never -allow-unsupported-compiler",
    )


def _release(torch_version: str | None) -> tuple[int, int]:
    """'2.14.1+cu130' -> (2, 14): torch's version without its local label."""
    return major_minor((torch_version or "").split("+", 1)[0]) or (0, 0)


def host_compiler_too_old(ctx: Context) -> Iterator[Finding]:
    """torch >= 2.13's headers need C++20 (tables.TORCH_CXX20_FROM), which gcc < 10 cannot compile."""
    build = ctx.facts.build
    gcc = version_tuple(build.gxx_version or build.gcc_version)
    if not (ctx.installs_planned or ctx.builds_planned) or gcc is None or gcc[0] >= GCC_CXX20_FROM:
        return
    torches = [e.torch for e in ctx.facts.torch_envs if e.torch]
    needing = [t for t in torches if _release(t.version) >= TORCH_CXX20_FROM]
    if not needing:
        return
    compiler = f"g++ {build.gxx_version}" if build.gxx_version else f"gcc {build.gcc_version}"
    yield finding(
        "HOST_COMPILER_TOO_OLD", Severity.ERROR,
        f"{compiler} cannot compile C++20, which torch {needing[0].version}'s headers require ('#error "
        "C++20 or later compatible compiler is required to use ATen'): every extension build fails",
        {"gcc_version": build.gcc_version, "gxx_version": build.gxx_version,
         "torch_version": needing[0].version, "minimum_gcc": GCC_CXX20_FROM},
        hint=_compiler_fix(ctx, lambda n: n >= GCC_CXX20_FROM, f"g++ >= {GCC_CXX20_FROM}"),
    )


def python_headers_missing(ctx: Context) -> Iterator[Finding]:
    if not ctx.builds_planned:
        return
    for env in ctx.facts.torch_envs:
        if env.python_h is False:
            yield finding(
                "PYTHON_HEADERS_MISSING", Severity.ERROR,
                f"{env.interpreter} ({env.version}) has no Python.h: an extension build dies with "
                "'fatal error: Python.h: No such file or directory'",
                {"interpreter": env.interpreter, "python_version": env.version, "prefix": env.prefix},
                hint="install the interpreter's headers (Debian/Ubuntu: python3-dev, i.e. python3.X-dev; "
                     "RHEL-family: python3-devel) before building",
            )


def build_tools_missing(ctx: Context) -> Iterator[Finding]:
    if not ctx.builds_planned:
        return
    build = ctx.facts.build
    if not build.gxx:
        yield finding(
            "BUILD_TOOLS_MISSING", Severity.ERROR,
            "no g++: torch's cpp_extension cannot compile the C++ half of any extension",
            {"gcc": build.gcc, "gxx": build.gxx, "ninja": build.ninja, "make": build.make},
            hint="install a compiler (Debian/Ubuntu: build-essential; RHEL-family: gcc-c++ make)",
        )
    elif not build.ninja:
        yield finding(
            "BUILD_TOOLS_MISSING", Severity.WARNING,
            "no ninja: torch's cpp_extension falls back to a serial setuptools build (flash-attn's README: "
            "'Without ninja, compiling can take a very long time (2h)')",
            {"gcc": build.gcc, "gxx": build.gxx, "ninja": build.ninja, "make": build.make},
            hint="pip install ninja into torch's env (build-extensions.yaml does)",
        )


def build_memory_low(ctx: Context) -> Iterator[Finding]:
    available = ctx.facts.build.mem_available_mb
    if not ctx.builds_planned or available is None or available >= MEM_PER_JOB_MB:
        return
    yield finding(
        "BUILD_MEMORY_LOW", Severity.WARNING,
        f"only {available} MiB of memory available: one nvcc compile job needs ~{MEM_PER_JOB_MB} MiB, so "
        "even MAX_JOBS=1 may be killed by the OOM killer",
        {"mem_available_mb": available, "mem_total_mb": ctx.facts.build.mem_total_mb,
         "mem_per_job_mb": MEM_PER_JOB_MB},
        hint=guestkind.memory_hint(ctx.guest),
    )


def tmp_on_tmpfs(ctx: Context) -> Iterator[Finding]:
    build = ctx.facts.build
    if not ctx.builds_planned or build.tmp_fstype != "tmpfs":
        return
    free = (build.tmp_free_mb or {}).get("/tmp")
    if free is not None and free >= TMP_BUILD_MB:
        return
    yield finding(
        "TMP_ON_TMPFS", Severity.WARNING,
        f"/tmp is a tmpfs with {free if free is not None else '?'} MiB free: pip builds the extension "
        f"there (in RAM, competing with the compile jobs), and a build tree needs ~{TMP_BUILD_MB} MiB",
        {"tmp_fstype": build.tmp_fstype, "tmp_free_mb": free, "needed_mb": TMP_BUILD_MB},
        hint="build with TMPDIR on disk (e.g. TMPDIR=/var/tmp) or grow the tmpfs",
    )
