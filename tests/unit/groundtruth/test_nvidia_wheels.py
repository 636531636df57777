"""The toolkit rules' tables checked against NVIDIA's real PyPI wheels, not against stand-ins.

Each wheel is downloaded once with `pip download --no-deps` (PyPI, or this machine's index) into
$FLEETFIX_TEST_CACHE/nvidia-wheels (default /opt/fleetfix-test-cache) and read as a zip: nothing is
installed or run. Volume: each cu12 nvcc wheel is 21-40 MB (four of them), each crt wheel ~150 kB.
Without PyPI the tests skip with the reason, except under CI=true, where they fail (tests/conftest.py).

What is checked, and the rule it grounds (fleetfix/probe/rules/tables.py):
- which wheels ship bin/nvcc                  -> PIP_NVCC_FROM (the pip route is offered from 13.0 only)
- `#if __GNUC__ > N` in crt/host_config.h      -> MAX_GCC_FOR_NVCC, every entry
- the glibc guards in crt/math_functions.h     -> MIN_NVCC_FOR_GLIBC (2.41 from 13.0, 2.42 from 13.2)
- torch 2.14.1's own headers and cpp_extension -> TORCH_CXX20_FROM, and its CUDA_GCC_VERSIONS against
  MAX_GCC_FOR_NVCC (read from the test bed's real torch venv, else from the torch wheel)
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetfix.probe.rules.base import major_minor
from fleetfix.probe.rules.route import pip_serves
from fleetfix.probe.rules.tables import (
    MAX_GCC_FOR_NVCC,
    MIN_NVCC_FOR_GLIBC,
    PIP_NVCC_FROM,
    TORCH_CXX20_FROM,
)
from tests.conftest import in_ci
from tests.lab.locks import cache_lock
from tests.lab.realtorch import REAL_TORCH_VERSION, cache_root, venv_path

# NVIDIA's wheels, one per CUDA minor the tables name. 12.x: the nvcc wheel holds the crt headers;
# 13.x: they moved to nvidia-cuda-crt (nvidia-cuda-nvcc requires it).
CU12_NVCC = {"12.4": "12.4.131", "12.6": "12.6.85", "12.8": "12.8.93", "12.9": "12.9.86"}
CU13_CRT = {"13.0": "13.0.88", "13.1": "13.1.115", "13.2": "13.2.86", "13.3": "13.3.73",
            "13.4": "13.4.92", "13.5": "13.5.37"}
CU13_NVCC = {"13.0": "13.0.88"}   # 37 MB; one is enough to show where 13.x's nvcc lives


def wheel(name: str, version: str) -> zipfile.ZipFile:
    """NVIDIA's wheel `name==version`, from the cache or downloaded into it (skip/fail without PyPI)."""
    dest = cache_root() / "nvidia-wheels" / f"{name}-{version}"
    with cache_lock(dest):  # another xdist worker (tests/e2e/test_groundtruth_glibc.py) may be downloading it
        found = sorted(dest.glob("*.whl"))
        if not found:
            dest.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                   "--disable-pip-version-check", "-d", str(dest), f"{name}=={version}"],
                                  capture_output=True, text=True, timeout=600)
            found = sorted(dest.glob("*.whl"))
            if done.returncode != 0 or not found:
                output = (done.stderr or done.stdout).strip()[-400:]
                reason = f"pip download {name}=={version} failed: {output}"
                if in_ci():
                    pytest.fail(f"CI=true: {reason}", pytrace=False)
                pytest.skip(reason)
    return zipfile.ZipFile(found[0])


def member(archive: zipfile.ZipFile, suffix: str) -> str:
    names = [n for n in archive.namelist() if n.endswith(suffix)]
    assert len(names) == 1, (archive.filename, suffix, names)
    return archive.read(names[0]).decode()


def bin_files(archive: zipfile.ZipFile) -> list[str]:
    return sorted(n for n in archive.namelist() if re.search(r"/bin/[^/]+$", n))


def gcc_limit(archive: zipfile.ZipFile) -> int:
    header = member(archive, "include/crt/host_config.h")
    limits = {int(n) for n in re.findall(r"^#if __GNUC__ > (\d+)\s*$", header, re.MULTILINE)}
    assert len(limits) == 1, limits
    limit = limits.pop()
    assert f"gcc versions later than {limit} are not supported" in header
    return limit


def glibc_guards(archive: zipfile.ZipFile) -> set[tuple[int, int]]:
    """The glibc versions whose new C23 declarations math_functions.h matches (`...PREREQ(2,41)`
    feeding __NV_GLIBC_PROVIDES_IEC_60559_FUNCS; `__GLIBC_PREREQ(2,42)` feeding the rsqrt specifier)."""
    header = member(archive, "include/crt/math_functions.h")
    guards = set()
    if "__NV_GLIBC_PROVIDES_IEC_60559_FUNCS" in header and re.search(r"PREREQ\(2,41\)", header):
        guards.add((2, 41))
    if re.search(r"__GLIBC_PREREQ\(2,42\)", header) and "_NV_RSQRT_SPECIFIER" in header:
        guards.add((2, 42))
    return guards


# ---------------------------------------------------------------- which wheels carry an nvcc


@pytest.mark.parametrize(("cuda", "version"), sorted(CU12_NVCC.items()))
def test_cu12_nvcc_wheels_ship_no_nvcc(cuda: str, version: str) -> None:
    files = bin_files(wheel("nvidia-cuda-nvcc-cu12", version))
    assert files == ["nvidia/cuda_nvcc/bin/ptxas"]
    assert not pip_serves(cuda), f"the pip route is offered for {cuda}, whose wheel has no nvcc"


@pytest.mark.parametrize(("cuda", "version"), sorted(CU13_NVCC.items()))
def test_cu13_nvcc_wheel_ships_nvcc(cuda: str, version: str) -> None:
    archive = wheel("nvidia-cuda-nvcc", version)
    assert "nvidia/cu13/bin/nvcc" in bin_files(archive) and "nvidia/cu13/bin/cudafe++" in bin_files(archive)
    requires = member(archive, ".dist-info/METADATA")
    assert "Requires-Dist: nvidia-cuda-crt" in requires   # the headers cuda-toolkit-pip.yaml asks for
    assert pip_serves(cuda) and major_minor(cuda) == PIP_NVCC_FROM


# ---------------------------------------------------------------- host compiler limits


@pytest.mark.parametrize(("cuda", "version"), sorted(CU12_NVCC.items()))
def test_gcc_limit_of_cu12_nvcc_is_the_headers(cuda: str, version: str) -> None:
    assert MAX_GCC_FOR_NVCC[major_minor(cuda) or (0, 0)] == gcc_limit(wheel("nvidia-cuda-nvcc-cu12", version))


@pytest.mark.parametrize(("cuda", "version"), sorted(CU13_CRT.items()))
def test_gcc_limit_of_cu13_nvcc_is_the_headers(cuda: str, version: str) -> None:
    assert MAX_GCC_FOR_NVCC[major_minor(cuda) or (0, 0)] == gcc_limit(wheel("nvidia-cuda-crt", version))


def test_every_gcc_limit_has_a_wheel_read() -> None:
    # A version added to the table without its header being read here is a guess.
    read = {major_minor(v) for v in (*CU12_NVCC, *CU13_CRT)}
    assert set(MAX_GCC_FOR_NVCC) == read


# ---------------------------------------------------------------- glibc 2.41 / 2.42


def newest_guard_needed(cuda: str) -> set[tuple[int, int]]:
    """The glibc versions the table says nvcc `cuda` compiles against (among those it names)."""
    mm = major_minor(cuda) or (0, 0)
    return {glibc for glibc, need in MIN_NVCC_FOR_GLIBC.items() if mm >= need}


@pytest.mark.parametrize(("cuda", "version"), sorted(CU12_NVCC.items()))
def test_cu12_headers_guard_no_glibc(cuda: str, version: str) -> None:
    assert glibc_guards(wheel("nvidia-cuda-nvcc-cu12", version)) == set() == newest_guard_needed(cuda)


@pytest.mark.parametrize(("cuda", "version"), sorted(CU13_CRT.items()))
def test_cu13_glibc_guards_are_the_tables(cuda: str, version: str) -> None:
    assert glibc_guards(wheel("nvidia-cuda-crt", version)) == newest_guard_needed(cuda)


def test_the_local_cuda_13_0_agrees_with_its_wheel() -> None:
    # This machine's real toolkit (the e2e tests build with it), where present.
    local = Path("/usr/local/cuda-13.0/include/crt/host_config.h")
    if not local.exists():
        pytest.skip("no /usr/local/cuda-13.0 here")
    assert "#if __GNUC__ > 15" in local.read_text()
    assert MAX_GCC_FOR_NVCC[(13, 0)] == 15


# ---------------------------------------------------------------- torch's side of the same limits


def torch_file(relative: str) -> str:
    """A file of the real torch (the lab's venv when built, else read from the wheel)."""
    for site in sorted(venv_path().glob("lib/python3*/site-packages/torch")):
        if (site / relative).is_file():
            return (site / relative).read_text()
    return member(wheel("torch", REAL_TORCH_VERSION), f"torch/{relative}")


def test_torch_2_14_requires_cxx20() -> None:
    aten = torch_file("include/ATen/ATen.h")
    assert "__cplusplus < 202002L" in aten
    assert "#error C++20 or later compatible compiler is required to use ATen." in aten
    assert (major_minor(REAL_TORCH_VERSION) or (0, 0)) >= TORCH_CXX20_FROM
    # cpp_extension adds -std=c++20 itself, only where the extension passes no -std of its own.
    assert "cpp_flag = cpp_flag_prefix + 'c++20'" in torch_file("utils/cpp_extension.py")


def test_torchs_gcc_bounds_agree_with_nvidias_headers() -> None:
    # torch refuses the host compiler itself (_check_cuda_version) before nvcc runs: its exclusive upper
    # bound must be one above the header's limit wherever both know the CUDA version.
    source = torch_file("utils/cpp_extension.py")
    table = source[source.index("CUDA_GCC_VERSIONS"):source.index("MINIMUM_CLANG_VERSION")]
    bounds = {cuda: int(upper) for cuda, upper in re.findall(r"'(\d+\.\d+)': \(.*?, \((\d+), 0\)\)", table)}
    shared = {cuda for cuda in bounds if major_minor(cuda) in MAX_GCC_FOR_NVCC}
    assert {"12.4", "12.6", "12.8", "12.9", "13.0"} <= shared
    for cuda in shared:
        assert bounds[cuda] == MAX_GCC_FOR_NVCC[major_minor(cuda) or (0, 0)] + 1, cuda
