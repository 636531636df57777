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
