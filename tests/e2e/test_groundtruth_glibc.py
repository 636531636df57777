"""NVCC_GLIBC_INCOMPATIBLE on real artifacts: Debian 13's real glibc 2.41 and gcc 14 (the test bed's
debootstrapped template), this machine's real nvcc 13.0, and the crt/math_functions.h of NVIDIA's real
nvidia-cuda-nvcc-cu12 12.8.93 wheel.

No 12.x nvcc binary can be had here (NVIDIA's cu12 wheels carry none), so the 12.8 side is 12.8's own
math header in front of 13.0's compiler: the one file the glibc guard lives in. The control proves the
mix itself compiles on this machine's glibc 2.36; only glibc 2.41 breaks it, with the error users report
(NVIDIA/cuda-samples#378), while 13.0's own header compiles there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import in_ci
from tests.lab.container import Container
from tests.lab.locks import cache_lock
from tests.lab.realtorch import cache_root

REAL_CUDA = Path("/usr/local/cuda-13.0")
CU12_WHEEL = ("nvidia-cuda-nvcc-cu12", "12.8.93")
SOURCE = ("#include <cmath>\n"
          "__global__ void k(double *x) { x[0] = sinpi(x[0]) + cospi(x[1]); }\n"
          "int main() { return 0; }\n")
COMPILE = "cd /tmp && printf '%s' \"$1\" > t.cu && \"$2/bin/nvcc\" -arch=sm_90 -c t.cu -o t.o"


def need(problem: str | None) -> None:
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"CI=true: {problem}", pytrace=False)
    pytest.skip(problem)



@pytest.fixture(scope="module")
def cu12_math_headers() -> dict[str, bytes]:
    """crt/math_functions.h and .hpp from NVIDIA's real 12.8.93 nvcc wheel (downloaded once)."""
    dest = cache_root() / "nvidia-wheels" / "-".join(CU12_WHEEL)
    with cache_lock(dest):  # tests/unit/groundtruth/test_nvidia_wheels.py fills the same directory
        if not sorted(dest.glob("*.whl")):
            dest.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                   "-d", str(dest), "==".join(CU12_WHEEL)],
                                  capture_output=True, text=True, timeout=600)
            need(None if done.returncode == 0
                 else f"pip download {'=='.join(CU12_WHEEL)}: {done.stderr[-300:]}")
    with zipfile.ZipFile(sorted(dest.glob("*.whl"))[0]) as wheel:
        return {name: wheel.read(f"nvidia/cuda_nvcc/include/crt/{name}")
                for name in ("math_functions.h", "math_functions.hpp")}


def toolkit_tree(dest: Path, math_headers: dict[str, bytes] | None = None) -> None:
    """The compiler parts of the real 13.0 toolkit at dest (hard links: same filesystem, read only by
    nvcc), optionally with another version's crt math headers as files of their own."""
    for part in ("bin", "nvvm", "include"):
        try:
            shutil.copytree(REAL_CUDA / part, dest / part, symlinks=True, copy_function=os.link)
        except OSError:
            shutil.rmtree(dest / part, ignore_errors=True)
            shutil.copytree(REAL_CUDA / part, dest / part, symlinks=True)
    for name, data in (math_headers or {}).items():
        target = dest / "include" / "crt" / name
        target.unlink()               # the link only: the real toolkit's file stays as it is
        target.write_bytes(data)


@pytest.fixture
def trixie_ct(make_ct: Callable[..., Container], trixie: Path,
              cu12_math_headers: dict[str, bytes]) -> Container:
    if not (REAL_CUDA / "bin" / "nvcc").is_file():
        pytest.fail(f"{REAL_CUDA}/bin/nvcc is missing: the ground-truth glibc test needs it")
    ct = make_ct(template=trixie, running=False)
    toolkit_tree(ct.upper_dir / "opt" / "cuda-13.0")
    toolkit_tree(ct.upper_dir / "opt" / "cuda-13.0-with-12.8-math", cu12_math_headers)
    ct.start()
    return ct


def compile_in(ct: Container, home: str) -> subprocess.CompletedProcess[bytes]:
    return ct.sh(f"set -- {quote(SOURCE)} {home}\n{COMPILE}", check=False, timeout=300)


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_glibc_2_41_breaks_12_8s_math_header_and_not_13_0s(
    trixie_ct: Container, cu12_math_headers: dict[str, bytes], tmp_path: Path,
) -> None:
    facts = trixie_ct.sh("getconf GNU_LIBC_VERSION; g++ -dumpversion").stdout.decode().split()
    assert facts[:2] == ["glibc", "2.41"] and facts[2].split(".")[0] == "14"

    real = compile_in(trixie_ct, "/opt/cuda-13.0")
    assert real.returncode == 0, real.stderr.decode()[-2000:]

    mixed = compile_in(trixie_ct, "/opt/cuda-13.0-with-12.8-math")
    assert mixed.returncode != 0
    assert 'exception specification is incompatible with that of previous function "cospi"' in \
        mixed.stderr.decode(errors="replace")

    # Control: the same mix compiles against this machine's older glibc, so glibc 2.41 is the cause.
    home = tmp_path / "cuda"
    toolkit_tree(home, cu12_math_headers)
    (tmp_path / "t.cu").write_text(SOURCE)
    control = subprocess.run([str(home / "bin" / "nvcc"), "-arch=sm_90", "-c", "t.cu", "-o", "t.o"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1]
    assert tuple(int(part) for part in glibc.split(".")) < (2, 41)
    assert control.returncode == 0, control.stderr[-2000:]
