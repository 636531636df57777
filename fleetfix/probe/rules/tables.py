"""Version tables the rules compare against, each with its source (DOMAIN.md section named).

Driver versions are kept as NVIDIA writes them ('580.65.06'): turning them into integer tuples and
back would print '580.65.6'. Compare with `version_tuple`.
"""

from __future__ import annotations

# DOMAIN.md 4.2 table 2: minimum driver per CUDA major (minor-version compatibility).
MIN_DRIVER_BY_MAJOR: dict[int, tuple[int, ...]] = {11: (450,), 12: (525,), 13: (580,)}
# DOMAIN.md 4.2 table 3: the toolkit's own (full-feature) driver, per major.minor, GA release, x86_64.
FULL_FEATURE_DRIVER: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06", (13, 1): "590.44.01", (13, 2): "595.45.04",
    # 13.3 GA: ">=610.43.02" (CUDA 13.3 release notes, docs.nvidia.com/cuda/archive/13.3.0/
    # cuda-toolkit-release-notes, as quoted in several public setups). From 13.4 on the Linux driver is
    # no longer bundled with the toolkit and table 3 names none: those CUDAs get only the 580 minimum.
    (13, 3): "610.43.02",
}
# The oldest nvcc that can compile for a compute capability (DOMAIN.md 8, corrected 2026-12): 12.8 added
# sm_100, sm_101, sm_120; 12.9 added sm_103 and sm_121 (CUDA Features Archive 12.9); 13.0 renamed sm_101
# to sm_110 (Thor). A GPU is served by code for any listed arch of its own major with a minor <= its own
# (binary compatibility, CUDA C++ Programming Guide): sm_100 code runs on a 10.3 B300, sm_120 on a 12.1.
MIN_NVCC_FOR_ARCH: dict[tuple[int, int], tuple[int, int]] = {
    (9, 0): (11, 8), (10, 0): (12, 8), (10, 1): (12, 8), (12, 0): (12, 8),
    (10, 3): (12, 9), (12, 1): (12, 9), (11, 0): (13, 0),
}
# CUDA 13.0 removed offline compilation for Maxwell, Pascal and Volta (sm_50 to sm_72).
CUDA13_DROPPED_BELOW = (7, 5)

# NVIDIA apt repositories that start later than the CUDA releases torch wheels use: (distro, arch) ->
# the oldest CUDA major.minor there. debian12: "With the release of CUDA 12.3, the new Linux
# distribution Debian 12 has been added" (NVIDIA/nvidia-docker#1791). debian13: a new repository with a
# new key (NVIDIA/cuda-repo-management#39), created in the 13.x era; NVIDIA's own thread #40 ("Debian13:
# backport active branches to new repo") is about the older branches it lacks. Where this table is
# silent, apt's own index (facts.apt.nvidia_index) or the playbook's pre-flight read of the repository
# index decides: the table only picks which playbook the probe prescribes.
REPO_OLDEST_CUDA: dict[tuple[str, str], tuple[int, int]] = {
    ("debian12", "x86_64"): (12, 3),
    ("debian13", "x86_64"): (13, 0),
}
# NVIDIA apt repositories whose distro a CUDA release dropped: distro -> the newest CUDA major.minor it
# carries (any arch). Ubuntu 20.04: "Support for Ubuntu 20.04 has been dropped" in CUDA 13.0 (the 13.0
# release notes as summarised in easybuilders/easybuild-easyconfigs#23576, "CUDA v13.0.0"; NVIDIA's
# TensorRT 10.13.2, its first CUDA 13 release, dropped Ubuntu 20.04 too, NVIDIA/TensorRT#4556), so its
# repository ends at 12.9. (DOMAIN.md 1.2 had "dropped in 13.2", from a weak third-party summary.)
REPO_NEWEST_CUDA: dict[str, tuple[int, int]] = {"ubuntu2004": (12, 9)}


def oldest_nvcc_for(arch: tuple[int, int]) -> tuple[int, int] | None:
    """The oldest nvcc whose code runs on a GPU of this compute capability, counting binary
    compatibility within a major; None when the table has nothing for that major (older GPUs, which
    every supported nvcc serves)."""
    table = MIN_NVCC_FOR_ARCH.items()
    usable = [need for (major, minor), need in table if major == arch[0] and minor <= arch[1]]
    if usable:
        return min(usable)
    if any(major == arch[0] for major, _ in MIN_NVCC_FOR_ARCH):
        return min(need for (major, _), need in MIN_NVCC_FOR_ARCH.items() if major == arch[0])
    return None

# The newest gcc major each nvcc accepts (crt/host_config.h: `#if __GNUC__ > N` -> "#error -- unsupported
# GNU version! gcc versions later than N are not supported!"). 13.0: read in this machine's real
# /usr/local/cuda-13.0/include/crt/host_config.h; 12.9: its literal error quoted from a
# /usr/local/cuda-12.9 build ("later than 14"); 12.4 and 12.6: quoted build failures ("later than 13").
# Versions without a verified source are left out (no finding rather than a guess).
MAX_GCC_FOR_NVCC: dict[tuple[int, int], int] = {
    (12, 4): 13, (12, 6): 13, (12, 9): 14, (13, 0): 15,
}


# NVIDIA's open GPU kernel modules are required, the proprietary flavor unsupported, on Grace Hopper and
# Blackwell: NVIDIA Technical Blog "NVIDIA Transitions Fully Towards Open-Source GPU Kernel Modules"
# (2024-07-17), read here only through reports of it ("Grace Hopper and Blackwell units must do so"); NixOS
# wiki, NVIDIA: "Data center GPUs starting from Grace Hopper or Blackwell must use open-source modules —
# proprietary modules are no longer supported". Blackwell data-center parts are compute
# capability 10.x (B200 10.0, B300 10.3: CUDA Programming Guide); Grace Hopper is named GH200 (its GPU is
# an H100, 9.0, so the name decides). Consumer Blackwell (12.x) is left out: no NVIDIA statement found.
OPEN_MODULE_ONLY_MAJORS: frozenset[int] = frozenset({10})
OPEN_MODULE_ONLY_NAMES: tuple[str, ...] = ("GH200", "GB200", "GB300")


def needs_open_kernel_module(cap: str | None, name: str | None) -> str | None:
    """Why a GPU of this compute capability or nvidia-smi name needs the open kernel modules, or None."""
    if cap:
        major = cap.split(".", 1)[0]
        if major.isdigit() and int(major) in OPEN_MODULE_ONLY_MAJORS:
            return f"compute capability {cap} is a Blackwell data-center GPU"
    if name:
        found = next((model for model in OPEN_MODULE_ONLY_NAMES if model in name.upper()), None)
        if found:
            return f"{name} is a Grace {'Hopper' if found == 'GH200' else 'Blackwell'} part"
    return None


# Which CUDA builds each torch release ships, and the archs each build's kernels cover (x86_64 Linux).
# pytorch/pytorch RELEASE.md "Release Compatibility Matrix" and "PyTorch CUDA Support Matrix" (2.12-2.14:
# cu126 Maxwell(5.0)..Hopper(9.0); cu130 and cu132 Turing(7.5)..Blackwell(10.0, 12.0)); 2.11: cu126, cu128,
# cu130, cu128 without Volta from 2.11 on (pytorch#172352, PR #175253: "12.8.1 | Turing(7.5) ...
# Blackwell(10.0, 12.0)"); 2.12 has no cu128 (its stable builds: 12.6, 13.0; 13.2 experimental), 2.14
# ships 12.6, 13.0 and 13.2 (pytorch#190355). Checked on the real wheels: 2.11.0+cu130 (PyPI) and
# 2.14.1+cu130 both say `sm_75 sm_80 sm_86 sm_90 sm_100 sm_120` in libtorch_python.so, and cuobjdump
# --list-elf of 2.14.1's libtorch_cuda.so has SASS for exactly those six (no PTX, despite the matrix's
# "12.0+PTX"). Older releases are left out of this table.
_CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
_CU13 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
TORCH_CUDA_BUILDS: dict[tuple[int, int], dict[str, tuple[str, ...]]] = {
    (2, 11): {"12.6": _CU126, "12.8": _CU13, "13.0": _CU13},
    (2, 12): {"12.6": _CU126, "13.0": _CU13},
    (2, 13): {"12.6": _CU126, "13.0": _CU13},
    (2, 14): {"12.6": _CU126, "13.0": _CU13, "13.2": _CU13},
}
