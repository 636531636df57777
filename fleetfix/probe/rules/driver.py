"""Host driver rules: the container's userspace against the node's kernel module, and the driver
against torch's CUDA (DOMAIN.md 4.2, 5.1)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.facts import version_tuple
from fleetfix.probe.rules import guestkind
from fleetfix.probe.rules.base import Context, Finding, Severity, dotted, finding, major_minor
from fleetfix.probe.rules.tables import FULL_FEATURE_DRIVER, MIN_DRIVER_BY_MAJOR, needs_open_kernel_module


def driver_libs_mismatch(ctx: Context) -> Iterator[Finding]:
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
    yield finding(
        "DRIVER_LIBS_MISMATCH", Severity.ERROR,
        f"{guestkind.libraries_owner(ctx.guest)} NVIDIA driver libraries {', '.join(libs) or '(unknown)'} do "
        f"not match {guestkind.module_owner(ctx.guest)} {module or '(see nvidia-smi)'}: CUDA fails with "
        "'Driver/library version mismatch'",
        evidence,
        hint=guestkind.driver_libs_hint(ctx.guest, want),
    )


def driver_too_old(ctx: Context) -> Iterator[Finding]:
    driver, source = ctx.driver_version()
    have = version_tuple(driver)
    if have is None:
        return
    for cuda in ctx.torch_cudas:
        mm = major_minor(cuda)
        if mm is None:
            continue
        evidence = {"driver_version": driver, "driver_source": source, "torch_cuda": cuda}
        minimum = MIN_DRIVER_BY_MAJOR.get(mm[0])
        full = FULL_FEATURE_DRIVER.get(mm)
        if minimum and have < minimum:
            yield finding(
                "DRIVER_TOO_OLD", Severity.ERROR,
                f"{guestkind.driver_owner(ctx.guest)} {driver} is older than {dotted(minimum)}, the minimum "
                f"for any CUDA {mm[0]}.x "
                f"runtime: torch (CUDA {cuda}) fails with 'CUDA driver version is insufficient'",
                {**evidence, "minimum_driver": dotted(minimum)},
                hint=guestkind.driver_too_old_hint(ctx.guest, full or dotted(minimum)),
            )
        elif full and have < (version_tuple(full) or ()):
            yield finding(
                "DRIVER_BELOW_FULL_FEATURE", Severity.WARNING,
                f"{guestkind.driver_owner(ctx.guest)} {driver} runs CUDA {cuda} only through minor-version "
                "compatibility (its own "
                f"driver is {full}): PTX JIT of newer code fails with 'the provided PTX was "
                "compiled with an unsupported toolchain'",
                {**evidence, "full_feature_driver": full},
                hint="build extensions with SASS for the GPU's exact arch (no PTX JIT), or "
                     f"{guestkind.driver_upgrade(ctx.guest, full)}",
            )


def gpu_not_visible(ctx: Context) -> Iterator[Finding]:
    if ctx.torch_cudas and not ctx.facts.gpu.devices:
        yield finding(
            "GPU_NOT_VISIBLE", Severity.INFO,
            "torch is a CUDA build but no /dev/nvidia* device is visible in this target",
            {"torch_cuda": list(ctx.torch_cudas), "devices": []},
            hint=guestkind.gpu_not_visible_hint(ctx.guest),
        )


def gpu_passthrough_partial(ctx: Context) -> Iterator[Finding]:
    devices = set(ctx.facts.gpu.devices)
    gpus = sorted(d for d in devices if d[len("/dev/nvidia"):].isdigit())
    if not ctx.torch_cudas or not gpus:
        return
    missing = [d for d in ("/dev/nvidiactl", "/dev/nvidia-uvm") if d not in devices]
    if not missing:
        return
    yield finding(
        "GPU_PASSTHROUGH_PARTIAL", Severity.ERROR,
        f"{', '.join(gpus)} passed through but not {', '.join(missing)}: CUDA cannot initialise "
        "(torch.cuda.is_available() is False) even where nvidia-smi works",
        {"devices": sorted(devices), "missing": missing},
        hint=guestkind.passthrough_partial_hint(ctx.guest),
    )


def proprietary_module_on_open_only_gpu(ctx: Context) -> Iterator[Finding]:
    """Blackwell data-center GPUs and Grace Hopper are driven only by NVIDIA's open kernel modules; the
    node's /proc/driver/nvidia/version says which flavor is loaded (tables.needs_open_kernel_module)."""
    node = ctx.node
    if node is None or node.kernel_module_flavor != "proprietary":
        return
    gpu = ctx.facts.gpu
    caps = set(gpu.compute_caps) | {c for env in ctx.facts.pythons if env.deep for c in env.deep.capabilities}
    needing = sorted({why for why in (needs_open_kernel_module(cap, None) for cap in caps) if why}
                     | {why for why in (needs_open_kernel_module(None, name) for name in gpu.names) if why})
    if not needing:
        return
    yield finding(
        "DRIVER_PROPRIETARY_MODULE", Severity.ERROR,
        f"the node runs NVIDIA's proprietary kernel module, but {'; '.join(needing)}: NVIDIA supports "
        "these GPUs only with the open kernel modules",
        {"kernel_module_flavor": node.kernel_module_flavor, "nvrm_line": node.nvrm_line,
         "compute_caps": sorted(caps), "gpu_names": gpu.names},
        hint=guestkind.open_module_hint(ctx.guest),
    )


def cuda_unavailable_with_devices(ctx: Context) -> Iterator[Finding]:
    """--deep imported torch and CUDA did not initialise although every device node is there: the nodes
    exist but cannot be opened (a cgroup device rule for the wrong major, typically nvidia-uvm's, which
    is dynamic), or the driver underneath is unusable. Not judged without --deep, nor with a node
    missing (GPU_PASSTHROUGH_PARTIAL says that)."""
    devices = set(ctx.facts.gpu.devices)
    gpus = sorted(d for d in devices if d[len("/dev/nvidia"):].isdigit())
    if not gpus or not {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= devices:
        return
    for env in ctx.facts.torch_envs:
        deep = env.deep
        if env.torch is None or not env.torch.cuda or deep is None or deep.error:
            continue
        if deep.cuda_available is not False:
            continue
        yield finding(
            "CUDA_UNAVAILABLE_WITH_DEVICES", Severity.ERROR,
            f"torch {env.torch.version} in {env.interpreter} reports torch.cuda.is_available() False "
            f"although {', '.join(sorted(devices))} are all present: the device nodes cannot be used",
            {"interpreter": env.interpreter, "torch_version": env.torch.version, "torch_cuda": env.torch.cuda,
             "devices": sorted(devices), "nvidia_smi_error": ctx.facts.gpu.smi_error},
            hint=guestkind.cuda_unavailable_hint(ctx.guest),
        )
