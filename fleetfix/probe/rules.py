"""Rules: pure functions from Facts (+ NodeFacts) to Findings. No I/O.

Each rule looks at a few facts and returns zero or more findings with a stable code. `diagnose` runs
them in causal-chain order, so the first finding is the root cause and later ones are what it blocks
or causes: host driver → CUDA toolkit → apt (what an install needs) → extensions (what a build needs)
→ notes. Every code is documented in docs/findings.md (a test enforces it). The thresholds and
version tables come from ../shared/docs/DOMAIN.md; the section is named next to each.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleetfix.probe.facts import AptSource, Facts, NodeFacts, Nvcc, PythonEnv, version_tuple

CUDA_TOOLKIT_PLAYBOOK = "playbooks/cuda-toolkit.yaml"
BUILD_EXTENSIONS_PLAYBOOK = "playbooks/build-extensions.yaml"


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Fix(BaseModel):
    model_config = ConfigDict(frozen=True)

    playbook: str | None = None
    vars: dict[str, Any] = Field(default_factory=dict)
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
    evidence: dict[str, Any] = Field(default_factory=dict)
    fix: Fix


# Every code a rule can emit, in chain order. docs/findings.md has one section per code.
CODES: tuple[str, ...] = (
    "DRIVER_LIBS_MISMATCH",
    "DRIVER_TOO_OLD",
    "DRIVER_BELOW_FULL_FEATURE",
    "GPU_NOT_VISIBLE",
    "CUDA_RUNTIME_WITHOUT_TOOLKIT",
    "CUDA_TOOLKIT_MAJOR_MISMATCH",
    "CUDA_TOOLKIT_MINOR_MISMATCH",
    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT",
    "CUDA_DEFAULT_LINK_MISMATCH",
    "DISTRO_NVCC_ON_PATH",
    "DPKG_INTERRUPTED",
    "DPKG_LOCK_HELD",
    "DISK_LOW",
    "UNSUPPORTED_DISTRO",
    "NVIDIA_REPO_NOT_CONFIGURED",
    "APT_SIGNED_BY_CONFLICT",
    "APT_DUPLICATE_SOURCE",
    "APT_NVIDIA_KEY_MISSING",
    "APT_NVIDIA_ML_REPO",
    "APT_OLD_NVIDIA_KEY",
    "APT_SHA1_KEY_REJECTED",
    "EXTENSION_NOT_BUILT",
    "EXTENSION_IMPORT_FAILED",
    "EXTENSION_MISSING",
    "PYTHON_NOT_FOUND",
    "PYTHON_PROBE_FAILED",
    "TORCH_NOT_FOUND",
    "TORCH_CPU_ONLY",
)

# DOMAIN.md 4.2 table 2: minimum driver per CUDA major (minor-version compatibility).
MIN_DRIVER_BY_MAJOR: dict[int, tuple[int, ...]] = {11: (450,), 12: (525,), 13: (580,)}
# DOMAIN.md 4.2 table 3: the toolkit's own (full-feature) driver, per major.minor, GA release, x86_64.
FULL_FEATURE_DRIVER: dict[tuple[int, int], tuple[int, ...]] = {
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13), (12, 1): (530, 30, 2), (12, 2): (535, 54, 3), (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14), (12, 5): (555, 42, 2), (12, 6): (560, 28, 3), (12, 8): (570, 26),
    (12, 9): (575, 51, 3), (13, 0): (580, 65, 6), (13, 1): (590, 44, 1), (13, 2): (595, 45, 4),
}
# DOMAIN.md 4.3: the oldest nvcc that can compile for a compute capability.
MIN_NVCC_FOR_ARCH: dict[tuple[int, int], tuple[int, int]] = {
    (9, 0): (11, 8), (10, 0): (12, 8), (12, 0): (12, 8),
    (10, 3): (13, 0), (11, 0): (13, 0), (12, 1): (13, 0), (10, 1): (13, 0),
}
# CUDA 13.0 removed offline compilation for Maxwell, Pascal and Volta (sm_50 to sm_72).
CUDA13_DROPPED_BELOW = (7, 5)

# Free space below which installing the toolkit (and building an extension) is refused or risky.
# The minimal set (nvcc, cudart-dev, cccl) is a few hundred MB, but apt keeps the downloaded .debs in
# /var/cache/apt/archives while unpacking to /usr/local (usually one filesystem, so it counts twice),
# the optional libcu*-dev set for CUDAContext.h users is several GB, and an extension build tree is
# ~1 GB (causal-conv1d's .so alone is 263 MB). Under 2 GiB even the minimal set can fail mid-unpack
# ("No space left on device", DOMAIN.md 6, leaving dpkg interrupted); under 8 GiB the full set or a
# flash-attn build may not fit.
DISK_ERROR_MB = 2048
DISK_WARNING_MB = 8192

# Extension -> the slow path a model takes without it (DOMAIN.md 3.4, 3.5).
QWEN_FAST_PATH_WARNING = (
    "The fast path is not available because one of the required library is not installed. Falling back "
    "to torch implementation. To install follow https://github.com/fla-org/flash-linear-attention"
    "#installation and https://github.com/Dao-AILab/causal-conv1d"
)
FALLBACKS: dict[str, str] = {
    "causal_conv1d": (
        "Qwen3-Next / Qwen3.5 GatedDeltaNet layers fall back to the torch implementation "
        "(torch_causal_conv1d_update, F.silu(conv1d)); fla's ShortConvolution and Mamba2 use Triton's conv1d"
    ),
    "fla": (
        "Qwen3-Next / Qwen3.5 GatedDeltaNet layers fall back to torch_chunk_gated_delta_rule / "
        "torch_recurrent_gated_delta_rule"
    ),
    "flash_attn": "attention falls back to the sdpa/eager implementation",
    "mamba_ssm": "Mamba layers fall back to the slow reference scan",
}
# Which missing extension is implied by which present one. Only one way round: fla's GatedDeltaNet and
# mamba_ssm run their fast path through causal_conv1d, but causal_conv1d on its own is a complete install
# (transformers' Mamba-family models call it without fla), so it implies nothing. A team that wants fla
# everywhere lists it in the inventory's required_extensions.
PARTNERS: dict[str, tuple[str, ...]] = {
    "causal_conv1d": ("fla", "mamba_ssm"),
}


def diagnose(
    facts: Facts, node: NodeFacts | None = None, *, required_extensions: Collection[str] = ()
) -> list[Finding]:
    """All findings for one target, root cause first. `required_extensions` (inventory) are expected."""
    ctx = _Context.build(facts, node, frozenset(required_extensions))
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(ctx))
    ctx_with_installs = ctx.with_planned_fixes(findings)
    for rule in RULES_AFTER_FIXES:
        findings.extend(rule(ctx_with_installs))
    return sorted(findings, key=lambda f: CODES.index(f.code))


# ---------------------------------------------------------------- context


@dataclass(frozen=True)
class _Context:
    facts: Facts
    node: NodeFacts | None
    required: frozenset[str]
    torch_cudas: tuple[str, ...]          # distinct torch CUDA versions among the python envs
    installs_planned: bool = False        # some finding's fix installs packages or builds

    @classmethod
    def build(cls, facts: Facts, node: NodeFacts | None, required: frozenset[str]) -> _Context:
        cudas = tuple(dict.fromkeys(
            env.torch.cuda for env in facts.torch_envs if env.torch is not None and env.torch.cuda
        ))
        return cls(facts, node, required, cudas)

    def with_planned_fixes(self, findings: list[Finding]) -> _Context:
        planned = any(f.fix.playbook for f in findings if f.severity != Severity.INFO)
        return _Context(self.facts, self.node, self.required, self.torch_cudas, planned)

    def nvccs(self, env: PythonEnv | None = None) -> list[Nvcc]:
        """Every working nvcc the target has: versioned toolkits, PATH, /usr/bin, pip wheels. An nvcc
        that prints no version (a dangling wrapper, a broken install) builds nothing: not a toolkit."""
        cuda = self.facts.cuda
        found = [Nvcc(path=t.nvcc, version=t.version, release=t.release) for t in cuda.toolkits if t.nvcc]
        found += [n for n in (cuda.nvcc_on_path, cuda.distro_nvcc) if n is not None]
        envs = [env] if env else self.facts.pythons
        found += [n for e in envs for n in e.pip_nvcc]
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


def _finding(code: str, severity: Severity, summary: str, evidence: dict[str, Any], *,
             playbook: str | None = None, vars: dict[str, Any] | None = None, hint: str) -> Finding:
    assert code in CODES, code
    return Finding(code=code, severity=severity, summary=summary, evidence=evidence,
                   fix=Fix(playbook=playbook, vars=vars or {}, hint=hint))


def _mm(version: str | None) -> tuple[int, int] | None:
    parsed = version_tuple(version)
    return (parsed[0], parsed[1]) if parsed and len(parsed) >= 2 else None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def _toolkit_fix(cuda: str) -> dict[str, Any]:
    return {"playbook": CUDA_TOOLKIT_PLAYBOOK, "vars": {"cuda_version": cuda}}


def _apt_cleanup_fix(ctx: _Context) -> dict[str, Any]:
    """The cuda-toolkit playbook also removes what breaks apt (duplicates, old apt-key entries)."""
    variables = {"cuda_version": ctx.torch_cudas[0]} if ctx.torch_cudas else {}
    return {"playbook": CUDA_TOOLKIT_PLAYBOOK, "vars": variables}


def _dash(cuda: str) -> str:
    return cuda.replace(".", "-")


Rule = Callable[[_Context], Iterator[Finding]]

# ---------------------------------------------------------------- host driver


def driver_libs_mismatch(ctx: _Context) -> Iterator[Finding]:
    gpu = ctx.facts.gpu
    libs = gpu.userspace_driver_versions
    module = ctx.node.kernel_module_version if ctx.node else None
    nvml_says = gpu.smi_error is not None and "version mismatch" in gpu.smi_error.lower()
    differing = [v for v in libs if module and v != module]
    if not (differing or nvml_says or len(libs) > 1):
        return
    evidence = {"container_driver_libs": [lib.model_dump() for lib in gpu.driver_libs],
                "host_kernel_module": module, "nvidia_smi_error": gpu.smi_error}
    want = module or "the host's kernel module version"
    yield _finding(
        "DRIVER_LIBS_MISMATCH", Severity.ERROR,
        f"container NVIDIA driver libraries {', '.join(libs) or '(unknown)'} do not match the host kernel "
        f"module {module or '(see nvidia-smi)'}: CUDA fails with 'Driver/library version mismatch'",
        evidence,
        hint=f"install exactly {want} userspace libraries in the container "
             f"(NVIDIA-Linux-<arch>-{want}.run --no-kernel-module) or bind-mount the host's; never install "
             "a driver package from the CUDA repo inside a container",
    )


def driver_too_old(ctx: _Context) -> Iterator[Finding]:
    driver, source = ctx.driver_version()
    have = version_tuple(driver)
    if have is None:
        return
    for cuda in ctx.torch_cudas:
        mm = _mm(cuda)
        if mm is None:
            continue
        evidence = {"driver_version": driver, "driver_source": source, "torch_cuda": cuda}
        minimum = MIN_DRIVER_BY_MAJOR.get(mm[0])
        full = FULL_FEATURE_DRIVER.get(mm)
        if minimum and have < minimum:
            yield _finding(
                "DRIVER_TOO_OLD", Severity.ERROR,
                f"host driver {driver} is older than {_dotted(minimum)}, the minimum for any CUDA {mm[0]}.x "
                f"runtime: torch (CUDA {cuda}) fails with 'CUDA driver version is insufficient'",
                {**evidence, "minimum_driver": _dotted(minimum)},
                hint=f"upgrade the host (node) driver to >= {_dotted(full or minimum)}, or use a torch build "
                     "for an older CUDA; the container cannot fix this",
            )
        elif full and have < full:
            yield _finding(
                "DRIVER_BELOW_FULL_FEATURE", Severity.WARNING,
                f"host driver {driver} runs CUDA {cuda} only through minor-version compatibility (its own "
                f"driver is {_dotted(full)}): PTX JIT of newer code fails with 'the provided PTX was "
                "compiled with an unsupported toolchain'",
                {**evidence, "full_feature_driver": _dotted(full)},
                hint="build extensions with SASS for the GPU's exact arch (no PTX JIT), or upgrade the host "
                     f"driver to >= {_dotted(full)}",
            )


def gpu_not_visible(ctx: _Context) -> Iterator[Finding]:
    if ctx.torch_cudas and not ctx.facts.gpu.devices:
        yield _finding(
            "GPU_NOT_VISIBLE", Severity.INFO,
            "torch is a CUDA build but no /dev/nvidia* device is visible in this target",
            {"torch_cuda": list(ctx.torch_cudas), "devices": []},
            hint="if this target should use a GPU, pass /dev/nvidia* through in the container config "
                 "(lxc.mount.entry / devN); building extensions does not need a GPU",
        )


# ---------------------------------------------------------------- CUDA toolkit


def runtime_without_toolkit(ctx: _Context) -> Iterator[Finding]:
    if ctx.nvccs():
        return
    for cuda in ctx.torch_cudas:
        torch = next(e.torch for e in ctx.facts.torch_envs if e.torch and e.torch.cuda == cuda)
        yield _finding(
            "CUDA_RUNTIME_WITHOUT_TOOLKIT", Severity.ERROR,
            f"torch {torch.version} ships the CUDA {cuda} runtime but there is no nvcc: CUDA extensions "
            f"cannot be built (causal-conv1d's setup.py dies with NameError: name 'bare_metal_version' "
            "is not defined)",
            {"torch_version": torch.version, "torch_cuda": cuda, "toolkits": [],
             "nvcc_on_path": None, "distro_nvcc": None, "pip_nvcc": []},
            **_toolkit_fix(cuda),
            hint=f"install cuda-nvcc-{_dash(cuda)} cuda-cudart-dev-{_dash(cuda)} (no driver packages) and "
                 f"build with CUDA_HOME=/usr/local/cuda-{cuda}",
        )


def toolkit_mismatch(ctx: _Context) -> Iterator[Finding]:
    nvccs = ctx.nvccs()
    if not nvccs:
        return
    found = sorted({n.version for n in nvccs if n.version})
    for cuda in ctx.toolkit_needed():
        want = _mm(cuda)
        if want is None:
            continue
        same_major = [v for v in found if (_mm(v) or (0, 0))[0] == want[0]]
        evidence = {"torch_cuda": cuda, "nvcc_versions": found,
                    "nvccs": [n.model_dump() for n in nvccs]}
        if not same_major:
            yield _finding(
                "CUDA_TOOLKIT_MAJOR_MISMATCH", Severity.ERROR,
                f"nvcc {', '.join(found) or '(unknown version)'} but torch was built with CUDA {cuda}: "
                "torch's cpp_extension refuses to build ('The detected CUDA version ... mismatches')",
                evidence, **_toolkit_fix(cuda),
                hint=f"install CUDA {cuda} beside it (cuda-nvcc-{_dash(cuda)}) and build with "
                     f"CUDA_HOME=/usr/local/cuda-{cuda}",
            )
        else:
            yield _finding(
                "CUDA_TOOLKIT_MINOR_MISMATCH", Severity.WARNING,
                f"nvcc {', '.join(same_major)} but torch was built with CUDA {cuda}: builds only warn "
                "('minor version mismatch'); code from a newer nvcc may need a newer driver",
                evidence, **_toolkit_fix(cuda),
                hint=f"install the exact toolkit (cuda-nvcc-{_dash(cuda)}) and build with "
                     f"CUDA_HOME=/usr/local/cuda-{cuda}",
            )


def gpu_arch_unsupported(ctx: _Context) -> Iterator[Finding]:
    caps = list(ctx.facts.gpu.compute_caps)
    for env in ctx.facts.pythons:
        if env.deep:
            caps += env.deep.capabilities
    for cap in sorted(set(caps)):
        arch = _mm(cap)
        if arch is None:
            continue
        for cuda in ctx.torch_cudas:
            toolkit = _mm(cuda)
            if toolkit is None:
                continue
            need = MIN_NVCC_FOR_ARCH.get(arch)
            evidence = {"compute_cap": cap, "gpu_names": ctx.facts.gpu.names, "torch_cuda": cuda}
            if need and toolkit < need:
                yield _finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} needs nvcc >= {_dotted(need)}, but torch's CUDA is {cuda}: "
                    "extensions built for it fail with 'no kernel image is available for execution'",
                    {**evidence, "minimum_nvcc": _dotted(need)},
                    hint=f"use a torch build for CUDA >= {_dotted(need)} and the matching toolkit",
                )
            elif toolkit[0] >= 13 and arch < CUDA13_DROPPED_BELOW:
                yield _finding(
                    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT", Severity.ERROR,
                    f"GPU sm_{arch[0]}{arch[1]} is Maxwell/Pascal/Volta, which CUDA {cuda} can no longer "
                    "compile for (removed in 13.0)",
                    evidence, hint="use a torch build for CUDA 12.x and the matching 12.x toolkit",
                )


def default_link_mismatch(ctx: _Context) -> Iterator[Finding]:
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
        yield _finding(
            "CUDA_DEFAULT_LINK_MISMATCH", Severity.WARNING,
            f"/usr/local/cuda points at {cuda.default_link} (CUDA {linked_version or '?'}), not at torch's "
            f"CUDA {want}: a build without CUDA_HOME picks the wrong nvcc",
            {"default_link": cuda.default_link, "linked_version": linked_version, "torch_cuda": want},
            playbook=BUILD_EXTENSIONS_PLAYBOOK, vars={"cuda_version": want},
            hint=f"always build with CUDA_HOME=/usr/local/cuda-{want} (the build-extensions playbook does); "
                 f"or `update-alternatives --set cuda /usr/local/cuda-{want}`",
        )


def distro_nvcc(ctx: _Context) -> Iterator[Finding]:
    nvcc = ctx.facts.cuda.distro_nvcc
    if nvcc is None:
        return
    wants = ", ".join(ctx.torch_cudas) or "(no torch)"
    yield _finding(
        "DISTRO_NVCC_ON_PATH", Severity.WARNING,
        f"the distro's nvcc {nvcc.version or '?'} is at /usr/bin/nvcc: a build without CUDA_HOME uses "
        f"CUDA_HOME=/usr, not NVIDIA's toolkit (torch wants CUDA {wants})",
        {"distro_nvcc": nvcc.model_dump(), "torch_cuda": list(ctx.torch_cudas),
         "packages": [p.name for p in ctx.facts.cuda.packages if p.name.startswith("nvidia-cuda")]},
        hint="prefer NVIDIA's versioned toolkit and set CUDA_HOME explicitly; consider "
             "`apt-get remove nvidia-cuda-toolkit`",
    )


# ---------------------------------------------------------------- apt and dpkg


def dpkg_interrupted(ctx: _Context) -> Iterator[Finding]:
    dpkg = ctx.facts.dpkg
    if dpkg.interrupted:
        yield _finding(
            "DPKG_INTERRUPTED", Severity.ERROR,
            f"a dpkg run was interrupted ({dpkg.pending_updates} pending in /var/lib/dpkg/updates): every "
            "apt-get install fails with 'dpkg was interrupted, you must manually run dpkg --configure -a'",
            {"pending_updates": dpkg.pending_updates},
            hint="run `dpkg --configure -a` (then `apt-get -f install` if dependencies are unmet)",
        )


def dpkg_lock_held(ctx: _Context) -> Iterator[Finding]:
    holders = ctx.facts.dpkg.lock_holders
    if not holders:
        return
    who = ", ".join(f"{h.command or '?'} (pid {h.pid})" for h in holders)
    yield _finding(
        "DPKG_LOCK_HELD", Severity.WARNING,
        f"the dpkg/apt lock is held by {who}: an install now fails with 'Could not get lock' unless it waits",
        {"lock_holders": [h.model_dump() for h in holders]},
        hint="wait for it (the playbooks use -o DPkg::Lock::Timeout=600); never delete lock files",
    )


def disk_low(ctx: _Context) -> Iterator[Finding]:
    if not ctx.installs_planned:
        return
    free = {path: mb for path, mb in ctx.facts.build.disk_free_mb.items() if mb is not None}
    if not free:
        return
    path, least = min(free.items(), key=lambda item: item[1])
    if least >= DISK_WARNING_MB:
        return
    severity = Severity.ERROR if least < DISK_ERROR_MB else Severity.WARNING
    need = f"at least {DISK_ERROR_MB}" if severity is Severity.ERROR else f"up to {DISK_WARNING_MB}"
    yield _finding(
        "DISK_LOW", severity,
        f"only {least} MiB free on {path}: the toolkit install and extension build need {need} MiB",
        {"disk_free_mb": free, "error_below_mb": DISK_ERROR_MB, "warning_below_mb": DISK_WARNING_MB},
        hint="free space first (`apt-get clean`, old kernels, pip caches) or grow the container's rootfs "
             "(pct resize CTID rootfs +10G)",
    )


def unsupported_distro(ctx: _Context) -> Iterator[Finding]:
    os = ctx.facts.os
    if not ctx.toolkit_needed() or (os.nvidia_distro and os.nvidia_arch):
        return
    yield _finding(
        "UNSUPPORTED_DISTRO", Severity.ERROR,
        f"{os.pretty_name or os.id or 'this OS'} on {os.machine or '?'} has no NVIDIA CUDA apt repository "
        "to install the toolkit from",
        {"os_id": os.id, "version_id": os.version_id, "machine": os.machine,
         "nvidia_distro": os.nvidia_distro, "nvidia_arch": os.nvidia_arch},
        hint="use a supported base (Debian 11-13, Ubuntu 18.04-24.04; x86_64 or aarch64/sbsa), or the pip "
             "toolkit wheels (nvidia-cuda-nvcc-cu12) with a merged CUDA_HOME",
    )


def repo_not_configured(ctx: _Context) -> Iterator[Finding]:
    apt, os = ctx.facts.apt, ctx.facts.os
    needed = ctx.toolkit_needed()
    if not needed or apt.nvidia_repo_configured or not apt.present:
        return
    if not (os.nvidia_distro and os.nvidia_arch):
        return   # UNSUPPORTED_DISTRO says it: there is no repo to configure
    cuda = needed[0]
    yield _finding(
        "NVIDIA_REPO_NOT_CONFIGURED", Severity.ERROR,
        f"no apt source points at NVIDIA's CUDA repo: `apt-get install cuda-nvcc-{_dash(cuda)}` fails with "
        f"'E: Unable to locate package cuda-nvcc-{_dash(cuda)}'",
        {"nvidia_sources": [s.model_dump() for s in apt.nvidia_sources],
         "keyring_installed": apt.keyring_installed, "keyring_file": apt.keyring_file,
         "nvidia_distro": os.nvidia_distro, "nvidia_arch": os.nvidia_arch},
        **_toolkit_fix(cuda),
        hint=f"install cuda-keyring_1.1-1 from .../compute/cuda/repos/{os.nvidia_distro}/{os.nvidia_arch}/, "
             "then apt-get update",
    )


def _duplicates(sources: list[AptSource]) -> dict[tuple[str, str], list[AptSource]]:
    groups: dict[tuple[str, str], list[AptSource]] = defaultdict(list)
    for source in sources:
        if "deb" in source.types.split():
            for suite in source.suite.split() or [""]:
                groups[(source.uri.rstrip("/"), suite)].append(source)
    return {key: group for key, group in groups.items() if len(group) > 1}


def _where(sources: list[AptSource]) -> list[str]:
    return [f"{s.file}:{s.line}" for s in sources]


def signed_by_conflicts(ctx: _Context) -> Iterator[Finding]:
    for (uri, suite), group in _duplicates(ctx.facts.apt.enabled_sources).items():
        keys = {s.signed_by for s in group}
        evidence = {"uri": uri, "suite": suite, "entries": [s.model_dump() for s in group]}
        hint = ("keep the cuda-keyring entry (/etc/apt/sources.list.d/cuda-<distro>-<arch>.list) and delete "
                f"the others: {', '.join(_where(group))}")
        if len(keys) > 1:
            yield _finding(
                "APT_SIGNED_BY_CONFLICT", Severity.ERROR,
                f"{len(group)} entries for {uri} with different Signed-By: apt fails with 'Conflicting "
                "values set for option Signed-By' and 'The list of sources could not be read'",
                evidence, **_apt_cleanup_fix(ctx), hint=hint,
            )
        else:
            yield _finding(
                "APT_DUPLICATE_SOURCE", Severity.WARNING,
                f"{len(group)} identical entries for {uri}: apt warns that the target is configured "
                "multiple times",
                evidence, **_apt_cleanup_fix(ctx), hint=hint,
            )


def nvidia_key_missing(ctx: _Context) -> Iterator[Finding]:
    apt = ctx.facts.apt
    trusted = {hit.key for hit in apt.nvidia_keys if hit.file.startswith("/etc/apt/trusted.gpg")}
    # Entries without signed-by are checked against apt's global keyrings; the 2022 key must be there.
    unsigned = [s for s in apt.enabled_sources
                if s.is_cuda_repo and s.signed_by is None and s.repo_distro != "debian13"]
    if unsigned and "3bf863cc" not in trusted:
        yield _finding(
            "APT_NVIDIA_KEY_MISSING", Severity.ERROR,
            "NVIDIA source entries without signed-by and no current NVIDIA key in apt's keyrings: apt-get "
            "update fails with 'NO_PUBKEY A4B469963BF863CC' and 'The repository ... is not signed'",
            {"entries": [s.model_dump() for s in unsigned], "trusted_nvidia_keys": sorted(trusted)},
            **_apt_cleanup_fix(ctx),
            hint=f"remove {', '.join(_where(unsigned))}, `apt-key del 7fa2af80`, then install cuda-keyring",
        )


def nvidia_ml_repo(ctx: _Context) -> Iterator[Finding]:
    ml = [s for s in ctx.facts.apt.enabled_sources if s.is_machine_learning_repo]
    if ml:
        yield _finding(
            "APT_NVIDIA_ML_REPO", Severity.ERROR,
            "an entry points at NVIDIA's retired machine-learning repo: apt-get update fails with "
            "'NO_PUBKEY F60F4B3D7FA2AF80'",
            {"entries": [s.model_dump() for s in ml]}, **_apt_cleanup_fix(ctx),
            hint=f"delete {', '.join(_where(ml))}: cuDNN, NCCL and TensorRT now live in the CUDA repo",
        )


def old_nvidia_key(ctx: _Context) -> Iterator[Finding]:
    old = [hit for hit in ctx.facts.apt.nvidia_keys if hit.key == "7fa2af80"]
    if old:
        yield _finding(
            "APT_OLD_NVIDIA_KEY", Severity.WARNING,
            "NVIDIA's pre-2022 signing key 7fa2af80 (apt-key era) is still trusted; it signs nothing now",
            {"keys": [hit.model_dump() for hit in old]}, **_apt_cleanup_fix(ctx),
            hint="`apt-key del 7fa2af80` (or delete the keyring file) and rely on cuda-keyring",
        )


def sha1_key_rejected(ctx: _Context) -> Iterator[Finding]:
    apt, os = ctx.facts.apt, ctx.facts.os
    if not apt.uses_sqv:
        return
    # Every NVIDIA Debian-family repo except debian13 is signed by 3bf863cc, bound with SHA-1,
    # which sqv rejects since 2026-02-01 (DOMAIN.md 1.5).
    affected = sorted({s.repo_distro or "?" for s in apt.enabled_sources
                       if s.is_cuda_repo and s.repo_distro != "debian13"})
    would_configure = (not apt.nvidia_repo_configured and bool(ctx.toolkit_needed())
                       and os.nvidia_distro not in (None, "debian13"))
    if not affected and not would_configure:
        return
    repos = affected or [os.nvidia_distro or "?"]
    yield _finding(
        "APT_SHA1_KEY_REJECTED", Severity.ERROR,
        f"apt {apt.version or '3.x'} verifies with sqv, which rejects the SHA-1-bound NVIDIA key of the "
        f"{', '.join(repos)} repo: apt-get update fails with 'SHA1 is not considered secure'",
        {"apt_version": apt.version, "sqv": apt.sqv, "repos": repos, "os_id": os.id,
         "version_id": os.version_id},
        hint="escalate: do not weaken apt (no AllowInsecureRepositories, no moved sqv SHA-1 cutoff). Use "
             "the debian13 repo if it carries the needed toolkit, or the pip nvcc wheels",
    )


# ---------------------------------------------------------------- extensions


def _cuda_of(env: PythonEnv) -> str | None:
    return env.torch.cuda if env.torch else None


def _build_fix(env: PythonEnv, names: list[str]) -> dict[str, Any]:
    cuda = _cuda_of(env)
    variables: dict[str, Any] = {"extensions": names, "python": env.interpreter}
    if cuda:
        variables["cuda_version"] = cuda
    return {"playbook": BUILD_EXTENSIONS_PLAYBOOK, "vars": variables}


def extension_broken(ctx: _Context) -> Iterator[Finding]:
    for env in ctx.facts.torch_envs:
        for name, ext in env.extensions.items():
            evidence = {"interpreter": env.interpreter, "extension": name, **ext.model_dump()}
            cuda_dir = f"/usr/local/cuda-{_cuda_of(env)}" if _cuda_of(env) else "$CUDA_HOME"
            if ext.present and ext.compiled_present is False:
                yield _finding(
                    "EXTENSION_NOT_BUILT", Severity.ERROR,
                    f"{name} is installed in {env.interpreter} without its compiled module "
                    f"{ext.compiled_module}: importing it fails at model load instead of falling back",
                    evidence, **_build_fix(env, [name]),
                    hint=f"rebuild from source: CUDA_HOME={cuda_dir} pip install --no-build-isolation "
                         f"--force-reinstall --no-cache-dir {name.replace('_', '-')}",
                )
            elif ext.present and ext.importable is False:
                yield _finding(
                    "EXTENSION_IMPORT_FAILED", Severity.ERROR,
                    f"{name} in {env.interpreter} does not import: {ext.error or 'unknown error'}",
                    evidence, **_build_fix(env, [name]),
                    hint="rebuild it against the installed torch (an 'undefined symbol' means it was built "
                         "for another torch/ABI)",
                )


def extension_missing(ctx: _Context) -> Iterator[Finding]:
    for env in ctx.facts.torch_envs:
        if not _cuda_of(env):
            continue
        present = {name for name, ext in env.extensions.items() if ext.present}
        for name in env.extensions:
            if name in present:
                continue
            partners = sorted(set(PARTNERS.get(name, ())) & present)
            if not partners and name not in ctx.required:
                continue
            why = f"{', '.join(partners)} is installed and needs it" if partners else "required by inventory"
            fallback = FALLBACKS.get(name, "slow path")
            if name in ("causal_conv1d", "fla"):
                fallback += f"; transformers logs: '{QWEN_FAST_PATH_WARNING}'"
            compiled = env.extensions[name].compiled_module
            check = f"import {name}" + (f" and {compiled}" if compiled else "")
            yield _finding(
                "EXTENSION_MISSING", Severity.WARNING,
                f"{name} is not installed in {env.interpreter} ({why}): {FALLBACKS.get(name, 'slow path')}",
                {"interpreter": env.interpreter, "extension": name, "present": sorted(present),
                 "fallback": fallback},
                **_build_fix(env, [name]),
                hint=f"build it: CUDA_HOME=/usr/local/cuda-{_cuda_of(env)} MAX_JOBS=4 pip install "
                     f"--no-build-isolation {name.replace('_', '-')}, then {check}",
            )


# ---------------------------------------------------------------- python and torch notes


def python_problems(ctx: _Context) -> Iterator[Finding]:
    for env in ctx.facts.pythons:
        if not env.found:
            yield _finding(
                "PYTHON_NOT_FOUND", Severity.INFO,
                f"python interpreter {env.interpreter!r} not found on this target",
                {"interpreter": env.interpreter},
                hint="set the container's `python` var in the inventory to the interpreter or venv in use",
            )
        elif env.error:
            yield _finding(
                "PYTHON_PROBE_FAILED", Severity.WARNING,
                f"could not inspect {env.interpreter}: {env.error}",
                {"interpreter": env.interpreter, "executable": env.executable, "error": env.error},
                hint="check that it is a working Python 3 interpreter",
            )


def torch_notes(ctx: _Context) -> Iterator[Finding]:
    working = [e for e in ctx.facts.pythons if e.found and not e.error]
    if working and not ctx.facts.torch_envs:
        yield _finding(
            "TORCH_NOT_FOUND", Severity.INFO,
            "no inspected python environment has torch: nothing CUDA-related to check",
            {"interpreters": [e.interpreter for e in working]},
            hint="name the venv's interpreter in the inventory if torch lives elsewhere",
        )
    for env in ctx.facts.torch_envs:
        if env.torch and not env.torch.cuda:
            yield _finding(
                "TORCH_CPU_ONLY", Severity.INFO,
                f"torch {env.torch.version} in {env.interpreter} is a CPU-only build: no toolkit needed",
                {"interpreter": env.interpreter, "torch_version": env.torch.version},
                hint="install a CUDA build of torch if this target should use its GPU",
            )


RULES: tuple[Rule, ...] = (
    driver_libs_mismatch, driver_too_old, gpu_not_visible,
    runtime_without_toolkit, toolkit_mismatch, gpu_arch_unsupported, default_link_mismatch, distro_nvcc,
    dpkg_interrupted, dpkg_lock_held, unsupported_distro, repo_not_configured,
    signed_by_conflicts, nvidia_key_missing, nvidia_ml_repo, old_nvidia_key, sha1_key_rejected,
    extension_broken, extension_missing, python_problems, torch_notes,
)
# Rules that depend on what the others propose (disk only matters when something will be installed).
RULES_AFTER_FIXES: tuple[Rule, ...] = (disk_low,)
