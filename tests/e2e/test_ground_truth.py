"""The rules' beliefs checked against the real artifacts they describe, not against stand-ins: transformers'
wheels (which extensions go to the Hub), the real torch 2.14.1 cu130 wheel (which archs its kernels cover),
causal-conv1d's newest sdist (whether its setup.py still compiles the sm_103 cubin nvcc 13 miscompiles).
Downloads go through pip into the test cache, once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from fleetfix.probe import diagnose, parse_facts
from fleetfix.probe.rules.extensions import SM103_MISCOMPILE_FIXED_AFTER
from fleetfix.probe.rules.tables import TORCH_CUDA_BUILDS
from fleetfix.probe.script import build_probe_script
from tests.e2e.test_build_extensions import pip_download
from tests.lab.realtorch import cache_root, venv_path

REAL_TORCH = venv_path()
REAL_SITE = REAL_TORCH / "lib/python3.11/site-packages"
needs_real_torch = pytest.mark.skipif(not (REAL_SITE / "torch").is_dir(),
                                      reason="the real torch venv (tests/lab/realtorch.py) is not built here")


def wheel_of(name: str, version: str) -> Path:
    folder = pip_download(cache_root() / f"wheel-{name}-{version}", f"{name}=={version}",
                          extra=("--no-deps", "--only-binary", ":all:"))
    return next(folder.glob("*.whl"))


def unpack(wheel: Path, site: Path, members: tuple[str, ...]) -> None:
    """The wheel's files whose path starts with one of members (dist-info included), into site."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(members) or ".dist-info/" in member:
                archive.extract(member, site)


def probe_env(site: Path) -> dict[str, object]:
    """The real probe on this machine, python3 with site on its path; the env's facts as JSON."""
    script = build_probe_script(["python3"], discover=False)
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("version", "hub_first"), [("5.0.0", True), ("5.25.0", False)])
def test_which_transformers_takes_causal_conv1d_from_the_hub(tmp_path: Path, version: str,
                                                             hub_first: bool) -> None:
    site = tmp_path / "site"
    unpack(wheel_of("transformers", version), site,
           ("transformers/__init__.py", "transformers/integrations/hub_kernels.py"))
    unpack(wheel_of("kernels", "0.10.2"), site, ("kernels/__init__.py",))
    (site / "torch").mkdir()
    (site / "torch/__init__.py").write_text("raise SystemExit('the probe must not import torch')\n")
    (site / "torch/version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\nhip = None\n")
    (site / "causal_conv1d").mkdir()
    (site / "causal_conv1d/__init__.py").write_text("")
    (site / "causal_conv1d_cuda.py").write_text("")
    data = probe_env(site)
    env = data["pythons"][0]  # type: ignore[index]
    hub = env["hub_kernels"]
    assert (hub["transformers"], hub["kernels"]) == (version, "0.10.2")
    assert ("causal-conv1d" in hub["hub_mapped"]) is hub_first
    assert ("mamba-ssm" in hub["hub_mapped"]) is hub_first
    codes = [f.code for f in diagnose(parse_facts(json.dumps(data)))]
    assert ("EXTENSION_FROM_HUB" in codes) is hub_first


def test_transformers_5_0_mamba_fast_path_needs_both_extensions(tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel_of("transformers", "5.0.0")) as archive:
        source = archive.read("transformers/models/mamba/modeling_mamba.py").decode()
    needed = re.search(r"is_fast_path_available = all\(\s*\(([^)]*)\)", source)
    assert needed is not None
    names = {name.strip() for name in needed.group(1).split(",") if name.strip()}
    assert names == {"selective_state_update", "selective_scan_fn", "causal_conv1d_fn",
                     "causal_conv1d_update", "mamba_inner_fn"}
    assert 'lazy_load_kernel("causal-conv1d")' in source and 'lazy_load_kernel("mamba-ssm")' in source


@needs_real_torch
def test_the_cu130_build_table_is_what_the_real_wheel_carries() -> None:
    cuobjdump = REAL_SITE / "triton/backends/nvidia/bin/cuobjdump"
    if not cuobjdump.is_file():
        pytest.skip("the real torch venv has no triton cuobjdump")
    # One pass over the 500 MB library lists both: its cubins ("ELF file N: ....sm_90.cubin") and its PTX.
    listed = subprocess.run([str(cuobjdump), "--list-elf", "--list-ptx",
                             str(REAL_SITE / "torch/lib/libtorch_cuda.so")],
                            capture_output=True, text=True, timeout=600, check=True).stdout
    counts: dict[str, int] = {}
    for arch in re.findall(r"\.(sm_\d+[af]?)\.cubin", listed):
        counts[arch] = counts.get(arch, 0) + 1
    # The archs every kernel is built for (each fatbin has them), not the few kernels with an `a` variant.
    full = {arch for arch, count in counts.items() if count == max(counts.values())}
    assert full == set(TORCH_CUDA_BUILDS[(2, 14)]["13.0"])
    assert "PTX file" not in listed and ".ptx" not in listed   # no PTX, whatever RELEASE.md's "12.0+PTX" says


@needs_real_torch
def test_causal_conv1d_newest_setup_py_still_compiles_sm_103_with_nvcc_13() -> None:
    version = ".".join(str(part) for part in SM103_MISCOMPILE_FIXED_AFTER)
    folder = pip_download(cache_root() / f"sdist-causal-conv1d-{version}", f"causal-conv1d=={version}",
                          extra=("--no-deps", "--no-binary", ":all:", "--no-build-isolation"),
                          python=str(REAL_TORCH / "bin/python"),
                          env={"CAUSAL_CONV1D_SKIP_CUDA_BUILD": "TRUE"})
    with tarfile.open(next(folder.glob("*.tar.gz"))) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("/setup.py"))
        extracted = archive.extractfile(member)
        assert extracted is not None
        setup = extracted.read().decode()
    gated = re.search(r'if bare_metal_version >= Version\("13\.0"\):(.*?)\n\n', setup, re.S)
    assert gated is not None and "arch=compute_103,code=sm_103" in gated.group(1)
