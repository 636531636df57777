"""Rules: pure functions from Facts (+ NodeFacts) to Findings, one small module per area. No I/O.

    findings = diagnose(facts, node, required_extensions=["fla"])   # root cause first

A new finding is a function `Context -> Iterator[Finding]` in the module of its area (or a new module)
plus one `Registered(...)` line in REGISTRY below, naming the codes it may emit. The REGISTRY's order is
the causal chain and the report's order: host driver → CUDA toolkit → what installing one needs (dpkg,
repositories) → what a build needs → extensions → notes. Every code is documented in docs/findings.md,
in this order (a test enforces both).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from fleetfix.probe.facts import Facts, NodeFacts
from fleetfix.probe.rules import arch, build, dpkg, driver, extensions, pythons, repo, toolkit
from fleetfix.probe.rules.base import (
    BUILD_EXTENSIONS_PLAYBOOK,
    CUDA_TOOLKIT_PIP_PLAYBOOK,
    CUDA_TOOLKIT_PLAYBOOK,
    Context,
    Finding,
    Fix,
    Rule,
    Severity,
)
from fleetfix.probe.rules.dpkg import DISK_ERROR_MB, DISK_WARNING_MB
from fleetfix.probe.rules.extensions import QWEN_FAST_PATH_WARNING
from fleetfix.target import NODE, GuestRef


@dataclass(frozen=True)
class Registered:
    rule: Rule
    codes: tuple[str, ...]        # every code the rule may emit, in report order
    after_fixes: bool = False     # runs once the other rules' fixes are known (it judges what they need)


REGISTRY: tuple[Registered, ...] = (
    # host driver
    Registered(driver.driver_libs_mismatch, ("DRIVER_LIBS_MISMATCH",)),
    Registered(driver.driver_too_old, ("DRIVER_TOO_OLD", "DRIVER_BELOW_FULL_FEATURE")),
    Registered(driver.proprietary_module_on_open_only_gpu, ("DRIVER_PROPRIETARY_MODULE",)),
    Registered(driver.gpu_not_visible, ("GPU_NOT_VISIBLE",)),
    Registered(driver.gpu_passthrough_partial, ("GPU_PASSTHROUGH_PARTIAL",)),
    Registered(driver.cuda_unavailable_with_devices, ("CUDA_UNAVAILABLE_WITH_DEVICES",)),
    # CUDA toolkit
    Registered(toolkit.runtime_without_toolkit, ("CUDA_RUNTIME_WITHOUT_TOOLKIT",)),
    Registered(toolkit.toolkit_mismatch, ("CUDA_TOOLKIT_MAJOR_MISMATCH", "CUDA_TOOLKIT_MINOR_MISMATCH")),
    Registered(toolkit.nvcc_glibc_incompatible, ("NVCC_GLIBC_INCOMPATIBLE",)),
    Registered(arch.torch_wheel_lacks_arch, ("TORCH_WHEEL_LACKS_ARCH",)),
    Registered(arch.gpu_arch_unsupported, ("GPU_ARCH_UNSUPPORTED_BY_TOOLKIT",)),
    Registered(toolkit.default_link_mismatch, ("CUDA_DEFAULT_LINK_MISMATCH",)),
    Registered(toolkit.build_picks_other_nvcc, ("BUILD_PICKS_OTHER_NVCC",)),
    Registered(toolkit.distro_nvcc, ("DISTRO_NVCC_ON_PATH",)),
    # dpkg and disk: what any install needs
    Registered(dpkg.dpkg_interrupted, ("DPKG_INTERRUPTED",)),
    Registered(dpkg.dpkg_lock_held, ("DPKG_LOCK_HELD",)),
    Registered(dpkg.disk_low, ("DISK_LOW",), after_fixes=True),
    # package repositories
    Registered(repo.unsupported_distro, ("UNSUPPORTED_DISTRO",)),
    Registered(repo.repo_not_configured, ("NVIDIA_REPO_NOT_CONFIGURED",)),
    Registered(repo.repo_lacks_cuda, ("NVIDIA_REPO_LACKS_CUDA",)),
    Registered(repo.rpm_distro_toolkit, ("RPM_DISTRO_TOOLKIT",)),
    Registered(repo.signed_by_conflicts, ("APT_SIGNED_BY_CONFLICT", "APT_DUPLICATE_SOURCE")),
    Registered(repo.nvidia_key_missing, ("APT_NVIDIA_KEY_MISSING",)),
    Registered(repo.nvidia_ml_repo, ("APT_NVIDIA_ML_REPO",)),
    Registered(repo.old_nvidia_key, ("APT_OLD_NVIDIA_KEY",)),
    Registered(repo.sha1_key_rejected, ("APT_SHA1_KEY_REJECTED",)),
    # what a build needs besides nvcc (judged once the other fixes are known)
    Registered(build.host_compiler_too_new, ("HOST_COMPILER_TOO_NEW",), after_fixes=True),
    Registered(build.host_compiler_too_old, ("HOST_COMPILER_TOO_OLD",), after_fixes=True),
    Registered(build.python_headers_missing, ("PYTHON_HEADERS_MISSING",), after_fixes=True),
    Registered(build.build_tools_missing, ("BUILD_TOOLS_MISSING",), after_fixes=True),
    Registered(build.build_memory_low, ("BUILD_MEMORY_LOW",), after_fixes=True),
    Registered(build.tmp_on_tmpfs, ("TMP_ON_TMPFS",), after_fixes=True),
    # extensions
    Registered(extensions.extension_broken, ("EXTENSION_NOT_BUILT", "EXTENSION_IMPORT_FAILED")),
    Registered(extensions.extension_missing, ("EXTENSION_MISSING",)),
    Registered(extensions.sm103_miscompiled, ("EXTENSION_WRONG_RESULTS",)),
    Registered(extensions.extension_from_hub, ("EXTENSION_FROM_HUB",)),
    # notes
    Registered(pythons.python_problems, ("PYTHON_NOT_FOUND", "PYTHON_PROBE_FAILED")),
    Registered(pythons.torch_notes, ("TORCH_NOT_FOUND", "TORCH_CPU_ONLY")),
)

# Every code a rule can emit, in chain order. docs/findings.md has one section per code.
CODES: tuple[str, ...] = tuple(code for entry in REGISTRY for code in entry.codes)
_RANK = {code: index for index, code in enumerate(CODES)}
assert len(_RANK) == len(CODES), "a code is registered twice"


def _run(entry: Registered, ctx: Context) -> list[Finding]:
    found = list(entry.rule(ctx))
    for one in found:
        if one.code not in entry.codes:
            raise AssertionError(f"{entry.rule.__name__} emitted {one.code}, not registered for it")
    return found


def diagnose(
    facts: Facts, node: NodeFacts | None = None, *, required_extensions: Collection[str] = (),
    guest: GuestRef = NODE,
) -> list[Finding]:
    """All findings for one target, root cause first. `required_extensions` (inventory) are expected;
    `guest` is what the target is (a fix's commands differ for a container, a VM, a machine of its own)."""
    ctx = Context.build(facts, node, required_extensions, guest)
    findings = [f for entry in REGISTRY if not entry.after_fixes for f in _run(entry, ctx)]
    planned = ctx.with_planned_fixes(findings)
    findings += [f for entry in REGISTRY if entry.after_fixes for f in _run(entry, planned)]
    return sorted(findings, key=lambda f: _RANK[f.code])


__all__ = [
    "BUILD_EXTENSIONS_PLAYBOOK",
    "CODES",
    "CUDA_TOOLKIT_PIP_PLAYBOOK",
    "CUDA_TOOLKIT_PLAYBOOK",
    "DISK_ERROR_MB",
    "DISK_WARNING_MB",
    "QWEN_FAST_PATH_WARNING",
    "REGISTRY",
    "Context",
    "Finding",
    "Fix",
    "Registered",
    "Severity",
    "diagnose",
]
