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
# DOMAIN.md 4.3: the oldest nvcc that can compile for a compute capability.
MIN_NVCC_FOR_ARCH: dict[tuple[int, int], tuple[int, int]] = {
    (9, 0): (11, 8), (10, 0): (12, 8), (12, 0): (12, 8),
    (10, 3): (13, 0), (11, 0): (13, 0), (12, 1): (13, 0), (10, 1): (13, 0),
}
# CUDA 13.0 removed offline compilation for Maxwell, Pascal and Volta (sm_50 to sm_72).
CUDA13_DROPPED_BELOW = (7, 5)
