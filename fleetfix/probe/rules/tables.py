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
# new key (NVIDIA/cuda-repo-management#39), created in the 13.x era; NVIDIA/cuda-repo-management#40
# ("Debian13: backport active branches to new repo") is about the older branches it lacks. Where this table is
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
# GNU version! gcc versions later than N are not supported!"). Read in NVIDIA's own PyPI wheels:
# nvidia-cuda-nvcc-cu12 12.4.131 and 12.6.85 (nvidia/cuda_nvcc/include/crt/host_config.h line 141:
# `> 13`), 12.8.93 and 12.9.86 (line 141: `> 14`); nvidia-cuda-crt 13.0.88 to 13.3.73
# (nvidia/cu13/include/crt/host_config.h line 135: `> 15`), 13.4.92 and 13.5.37 (`> 16`).
# tests/unit/groundtruth/test_nvidia_wheels.py downloads those wheels and checks every entry against them.
# torch 2.14.1's cpp_extension.CUDA_GCC_VERSIONS agrees where it has an entry (12.8/12.9: < 15, 13.0: < 16).
# Versions without a wheel read here are left out (no finding rather than a guess).
MAX_GCC_FOR_NVCC: dict[tuple[int, int], int] = {
    (12, 4): 13, (12, 6): 13, (12, 8): 14, (12, 9): 14,
    (13, 0): 15, (13, 1): 15, (13, 2): 15, (13, 3): 15, (13, 4): 16, (13, 5): 16,
}

# The first nvcc whose crt/math_functions.h compiles against a glibc: glibc 2.41 declares C23's
# sinpi/cospi (and their f variants) with __THROW, which nvcc <= 12.9 declares without ("exception
# specification is incompatible with that of previous function \"cospi\"", NVIDIA/cuda-samples#378 on
# Ubuntu 25.04 with 12.9; 1CatAI/1Cat-vLLM#215 on Debian 13 with 12.8.93). The crt wheels 13.0.88 and
# 13.1.115 guard it (`__NV_GLIBC_PROVIDES_IEC_60559_FUNCS`, math_functions.h lines 122-126); glibc 2.42
# adds rsqrt/rsqrtf the same way, guarded from 13.2.86 on (`_NV_GLIBC_VERSION_GE_2_42` ->
# `_NV_RSQRT_SPECIFIER noexcept(true)`, lines 128-139; NixOS/nixpkgs#498678 patches older ones for it).
# glibc (major, minor) -> the oldest nvcc (major, minor) that builds against it; newer glibc: unknown.
MIN_NVCC_FOR_GLIBC: dict[tuple[int, int], tuple[int, int]] = {
    (2, 41): (13, 0),
    (2, 42): (13, 2),
}


def oldest_nvcc_for_glibc(glibc: tuple[int, int]) -> tuple[int, int] | None:
    """The oldest nvcc whose headers compile against this glibc (None: any, as far as is known)."""
    needs = [need for version, need in MIN_NVCC_FOR_GLIBC.items() if glibc >= version]
    return max(needs) if needs else None


# The CUDA versions NVIDIA's PyPI wheels carry a working nvcc for: only the 13.x `nvidia-cuda-nvcc`
# wheel ships nvidia/cu13/bin/nvcc; every `nvidia-cuda-nvcc-cu12` (12.4.131, 12.6.85, 12.8.93, 12.9.86
# read here) holds nvidia/cuda_nvcc/bin/ptxas and no nvcc. tests/unit/groundtruth checks both.
PIP_NVCC_FROM: tuple[int, int] = (13, 0)

# torch's headers refuse anything below C++20 from torch 2.13 on: torch 2.14.1's include/ATen/ATen.h
# line 5 `#error C++20 or later compatible compiler is required to use ATen.` (and
# torch/csrc/api/include/torch/all.h line 5); Dao-AILab/flash-attention#2879 ("PyTorch 2.13+ requires
# C++20"). gcc accepts -std=c++20 from gcc 10 on (gcc.gnu.org/projects/cxx-status.html: "use
# -std=c++2a in GCC 9 and earlier"), and torch's cpp_extension passes -std=c++20 (torch 2.14.1
# cpp_extension.py, append_std17_if_no_std_present). tests/unit/groundtruth reads both torch files.
TORCH_CXX20_FROM: tuple[int, int] = (2, 13)
GCC_CXX20_FROM = 10

# g++-N packages known to be in a distribution release's archive, for the fix that installs a gcc nvcc
# accepts. Debian 12: `apt-cache policy` on bookworm (g++-11 11.3.0-12, g++-12 12.2.0-14+deb12u1; no
# g++-10, g++-13). Debian 13: g++-14, installed from trixie in tests/lab's debootstrapped template.
# Only what was read is listed (a subset at worst); an OS not listed gets no package name.
DISTRO_GXX_MAJORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("debian", "12"): (11, 12),
    ("debian", "13"): (14,),
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
# cu130, cu128 without Volta from 2.11 on (pytorch#172352, pytorch#175253: "12.8.1 | Turing(7.5) ...
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
