"""The stand-ins' facts held to the real artifacts (docs/testbed.md, "Stand-ins and what holds them").

A stand-in is only as good as what it imitates: these tests compare what the test bed's stand-ins print or
compute with what NVIDIA's and PyTorch's real files do, wherever those can be reached here (this machine's
real nvcc 13.0, NVIDIA's PyPI wheels, the real torch 2.14.1), so a wrong belief baked into a stand-in fails
here instead of passing every test built on it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.lab.aptrepo import REAL_CUDA_13_0, CudaRelease, nvcc_stand_in_script
from tests.lab.locks import cache_lock
from tests.lab.realtorch import RealTorch, cache_root, ensure_real_torch
from tests.lab.torch_stub import torch_files

pytestmark = [pytest.mark.slow]

# The aptrepo stand-ins' 12.x releases and the NVIDIA wheel whose ptxas is of the same build.
PTXAS_WHEELS = {"V12.8.93": "nvidia-cuda-nvcc-cu12==12.8.93", "V12.4.131": "nvidia-cuda-nvcc-cu12==12.4.131"}


@pytest.fixture(scope="module")
def real_torch() -> RealTorch:
    return ensure_real_torch()


def real_ptxas(requirement: str) -> Path:
    """NVIDIA's ptxas from the wheel (downloaded and unpacked once per machine)."""
    dest = cache_root() / f"ptxas-{requirement.split('==')[1]}"
    ptxas = dest / "ptxas"
    with cache_lock(dest):  # another xdist worker may be unpacking the same wheel
        if not ptxas.is_file():
            _unpack_ptxas(requirement, dest, ptxas)
    return ptxas


def _unpack_ptxas(requirement: str, dest: Path, ptxas: Path) -> None:
    wheels = dest / "wheel"
    shutil.rmtree(dest, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                           ":all:", "-d", str(wheels), requirement], capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if "/bin/" in m]
        # The cu12 nvcc wheels carry no nvcc (DOMAIN.md 9): ptxas is their only program.
        assert members == ["nvidia/cuda_nvcc/bin/ptxas"], members
        partial = dest / "ptxas.partial"
        partial.write_bytes(archive.read(members[0]))
    partial.chmod(0o755)
    shutil.rmtree(wheels)
    partial.rename(ptxas)


def test_stand_in_banner_has_the_real_nvcc_13_0_shape() -> None:
    # The stand-ins' banner code, given the release of this machine's real nvcc, prints that nvcc's banner.
    real = subprocess.run([str(REAL_CUDA_13_0 / "bin/nvcc"), "--version"], capture_output=True, text=True,
                          check=True).stdout
    assert CudaRelease("13.0", "V13.0.88").nvcc_banner() == real


@pytest.mark.parametrize("release", sorted(PTXAS_WHEELS))
def test_stand_in_12x_banners_carry_the_lines_nvidias_own_ptxas_prints(release: str) -> None:
    # nvcc and ptxas of one release print the same copyright, release and build lines (13.0's do, checked
    # here too); only their "Built on" stamps differ, which no real 12.x program here can confirm.
    nvcc13 = subprocess.run([str(REAL_CUDA_13_0 / "bin/nvcc"), "--version"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    ptxas13 = subprocess.run([str(REAL_CUDA_13_0 / "bin/ptxas"), "--version"], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    assert [nvcc13[i] for i in (1, 3, 4)] == [ptxas13[i] for i in (1, 3, 4)]

    ptxas = subprocess.run([str(real_ptxas(PTXAS_WHEELS[release])), "--version"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    version = release[1:].rsplit(".", 1)[0]
    stand_in = CudaRelease(version, release).nvcc_banner().splitlines()
    assert [stand_in[i] for i in (1, 3, 4)] == [ptxas[i] for i in (1, 3, 4)], (stand_in, ptxas)


def test_stand_in_nvcc_without_input_fails_as_the_real_one(tmp_path: Path) -> None:
    script = tmp_path / "nvcc"
    script.write_bytes(nvcc_stand_in_script(CudaRelease("12.8", "V12.8.93")).data)
    script.chmod(0o755)
    real = subprocess.run([str(REAL_CUDA_13_0 / "bin/nvcc")], capture_output=True, text=True, check=False)
    fake = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    assert (fake.returncode, fake.stdout, fake.stderr) == (real.returncode, real.stdout, real.stderr)


def _assigned_names(source: str) -> set[str]:
    tree = ast.parse(source)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - {"__all__"}


def test_torch_stub_version_module_has_the_real_wheels_names(real_torch: RealTorch) -> None:
    [real] = real_torch.venv.glob("lib/python3*/site-packages/torch/version.py")
    declared = ast.literal_eval(next(
        n.value for n in ast.parse(real.read_text()).body
        if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]))
    assert _assigned_names(real.read_text()) == set(declared)
    assert _assigned_names(torch_files("2.14.1+cu130", "13.0")["torch/version.py"]) == set(declared)


# Each case: environment changes, then what CUDA_HOME torch's _find_cuda_home() settles on.
CUDA_HOME_CASES = {
    "CUDA_HOME": {"CUDA_HOME": "/opt/elsewhere/cuda", "CUDA_PATH": "/opt/other"},
    "CUDA_PATH": {"CUDA_PATH": "/opt/other"},
    "nvcc on PATH": {"PATH": "{toolkit}/bin"},
    "nothing": {"PATH": "/nonexistent"},
}
# torch's logging prefix: level, MMDD HH:MM:SS.micro, pid (torch/_logging); compared without time and pid.
GLOG_PREFIX = re.compile(r"^W\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ ")
_FIND_CUDA_HOME = """
import contextlib, io, json, os, sys
import torch.utils.cpp_extension as cpp_extension
out = {}
for name, changes in json.loads(sys.argv[1]).items():
    saved = dict(os.environ)
    for key in ("CUDA_HOME", "CUDA_PATH"):
        os.environ.pop(key, None)
    os.environ.update(changes)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        home = cpp_extension._find_cuda_home()
    os.environ.clear()
    os.environ.update(saved)
    out[name] = [home, [line for line in err.getvalue().splitlines() if line]]
print(json.dumps(out))
"""


def test_torch_stub_finds_cuda_home_as_the_real_torch_does(real_torch: RealTorch, tmp_path: Path) -> None:
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin/nvcc").write_text("#!/bin/sh\nexit 0\n")
    (toolkit / "bin/nvcc").chmod(0o755)
    cases = json.dumps({name: {k: v.format(toolkit=toolkit) for k, v in changes.items()}
                        for name, changes in CUDA_HOME_CASES.items()})
    site = tmp_path / "site"
    for relative, text in torch_files("2.14.1+cu130", "13.0").items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)

    def run(python: str, env: dict[str, str]) -> dict[str, list[object]]:
        done = subprocess.run([python, "-c", _FIND_CUDA_HOME, cases], capture_output=True, text=True,
                              timeout=300, env={**os.environ, **env}, check=False)
        assert done.returncode == 0, done.stderr
        result: dict[str, list[object]] = json.loads(done.stdout)
        for _home, lines in result.values():
            assert isinstance(lines, list)
            lines[:] = [GLOG_PREFIX.sub("W<time> <pid> ", line) for line in lines]
        return result

    real = run(str(real_torch.python), {})
    stub = run(sys.executable, {"PYTHONPATH": str(site)})
    assert stub == real
    assert real["nvcc on PATH"][0] == str(toolkit)   # the cases do reach each of torch's guesses
    assert real["CUDA_HOME"] == ["/opt/elsewhere/cuda", [
        "W<time> <pid> torch/utils/cpp_extension.py:183] "
        "No CUDA runtime is found, using CUDA_HOME='/opt/elsewhere/cuda'"]]
