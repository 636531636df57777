"""Build-host rules: what an extension build needs besides nvcc (a host compiler nvcc accepts, Python.h,
g++ and ninja, memory per compile job, a /tmp that can hold the build tree). They judge only targets
where a fix builds or installs something, so a healthy inference container is not nagged."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.facts import version_tuple
from fleetfix.probe.rules.arch import build_nvcc
from fleetfix.probe.rules.base import Context, Finding, Severity, finding, major_minor
from fleetfix.probe.rules.tables import MAX_GCC_FOR_NVCC

# Memory one compile job needs: the full causal-conv1d build peaked at 10.1 GB with MAX_JOBS=2
# (docs/extensions.md, measured on the test bed); mamba-ssm's setup.py compiles the same way.
MEM_PER_JOB_MB = 5120
# An extension's build tree is ~1 GB (causal-conv1d's .so alone is 263 MB, docs/extensions.md).
TMP_BUILD_MB = 2048


def host_compiler_too_new(ctx: Context) -> Iterator[Finding]:
    build = ctx.facts.build
    gcc = version_tuple(build.gxx_version or build.gcc_version)
    if not (ctx.installs_planned or ctx.builds_planned) or gcc is None or not ctx.torch_cudas:
        return
    used, source = build_nvcc(ctx)
    # The nvcc a build will use: torch's X.Y once the toolkit fix installed it, else the one there now.
    version = ctx.torch_cudas[0] if ctx.toolkit_needed() or used is None else used.version
    mm = major_minor(version)
    newest = MAX_GCC_FOR_NVCC.get(mm) if mm else None
    if newest is None or gcc[0] <= newest:
        return
    compiler = f"g++ {build.gxx_version}" if build.gxx_version else f"gcc {build.gcc_version}"
    yield finding(
        "HOST_COMPILER_TOO_NEW", Severity.ERROR,
        f"{compiler} is newer than nvcc {version} accepts (gcc <= {newest}): every CUDA build stops at "
        f"crt/host_config.h with 'unsupported GNU version! gcc versions later than {newest} are not "
        "supported!'",
        {"gcc_version": build.gcc_version, "gxx_version": build.gxx_version, "nvcc_version": version,
         "newest_gcc": newest, "nvcc_source": source if not ctx.toolkit_needed() else "torch's CUDA"},
        hint=f"install g++-{newest} beside it and build with "
             f"NVCC_PREPEND_FLAGS='-ccbin /usr/bin/g++-{newest}' (or use a newer CUDA whose nvcc accepts "
             f"gcc {gcc[0]}); never -allow-unsupported-compiler",
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
        hint="give the container more memory for the build (pct set CTID -memory N) or build elsewhere and "
             "install the wheel",
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
