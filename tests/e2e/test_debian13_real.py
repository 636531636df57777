"""Debian 13 with nothing standing in for the toolchain: the real nvcc 13.0 (this machine's
/usr/local/cuda-13.0, installed by apt from the test bed's debian13 tree), trixie's real gcc 14 and glibc
2.41, the real torch 2.14.1 (CUDA 13.0 build) for trixie's python 3.13 (tests/lab/torchlayer.py), and
NVIDIA's real CUDA 12.4, 12.6, 12.8 and 12.9 headers from their PyPI wheels.

* The seed's chain on trixie: torch cu130 without nvcc and without NVIDIA's repository, fixed by
  cuda-toolkit.yaml and then build-extensions.yaml (a real one-kernel extension), and a second apply of
  both changes nothing.
* Ground truth for glibc 2.41 against CUDA 12.x headers: NVIDIA's 12.8/12.9 crt/math_functions.h declare
  cospi, sinpi, cospif and sinpif without the exception specification glibc 2.41's <math.h> gives them, so
  every .cu translation unit fails on Debian 13; the same headers compile on Debian 12 (glibc 2.36), and
  13.0's headers (their __NV_GLIBC_PROVIDES_IEC_60559_FUNCS guard) compile on Debian 13. 12.4's and
  12.6's crt/host_config.h stop at gcc 14 before that (`gcc versions later than 13 are not supported!`).
  NVIDIA's cu12 wheels have no nvcc, so their headers go through the real nvcc 13.0 (-I first): the text
  that fails is NVIDIA's 12.x header against Debian's glibc and gcc, as it is for a 12.x nvcc.
"""

from __future__ import annotations

import io
import itertools
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetfix.probe.rules.tables import MAX_GCC_FOR_NVCC
from tests.e2e.conftest import CliResult, real_debian13_tree, run_cli, write_inventory
from tests.lab.aptrepo import KEYRING_FILE, REAL_CUDA_13_0, AptRepo, serve_repo
from tests.lab.bed import Lab
from tests.lab.cli import TINY_EXTENSION_IN_CT, TINY_EXTENSION_SOURCE, add_tiny_extension_source
from tests.lab.container import Container, tree_digest
from tests.lab.locks import cache_lock
from tests.lab.realtorch import cache_root
from tests.lab.template import ensure_template
from tests.lab.torch_stub import install_fla
from tests.lab.torchlayer import TorchLayer, ensure_torch_layer

pytestmark = [pytest.mark.slow]

TOOLKIT = "playbooks/cuda-toolkit.yaml"
BUILD = "playbooks/build-extensions.yaml"
TINY_EXTENSION = f"{TINY_EXTENSION_IN_CT}=fleetfix_tiny_cuda+fleetfix_tiny"
ONE_ARCH = ["--var", "cuda_arch_list=9.0"]   # no GPU is needed to compile; one arch keeps it short
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}
NVCC = "/usr/local/cuda-13.0/bin/nvcc"
# NVIDIA's last wheels of each 12.x line (pip index versions, 2026-12): crt/ is in the nvcc wheel,
# cuda_runtime.h and the rest of include/ in the runtime wheel. Neither wheel has an nvcc binary.
CUDA12_HEADER_WHEELS = {
    "12.4": ("nvidia-cuda-nvcc-cu12==12.4.131", "nvidia-cuda-runtime-cu12==12.4.127"),
    "12.6": ("nvidia-cuda-nvcc-cu12==12.6.85", "nvidia-cuda-runtime-cu12==12.6.77"),
    "12.8": ("nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-runtime-cu12==12.8.90"),
    "12.9": ("nvidia-cuda-nvcc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79"),
}
# What each release's crt/host_config.h accepts (`#if __GNUC__ > N` before its #error), as read in those
# wheels and in /usr/local/cuda-13.0; test_newest_gcc_table_agrees_with_nvidias_host_config_headers reads
# them again.
HOST_CONFIG_NEWEST_GCC = {"12.4": 13, "12.6": 13, "12.8": 14, "12.9": 14, "13.0": 15}
# A .cu file needs no kernel to fail: nvcc force-includes cuda_runtime.h, which reaches crt/math_functions.h.
VERSION_CU = '#include <cstdio>\nint main() { std::printf("%d\\n", CUDART_VERSION); return 0; }\n'
# What glibc 2.41 declares noexcept and NVIDIA's 12.x headers do not (mathcalls.h lines 79 and 81 on trixie).
GLIBC_241_CLASHES = ("cospi", "sinpi", "cospif", "sinpif")


def report(name: str, value: str) -> None:
    # Shown with -s: the numbers docs/testbed.md quotes.
    print(f"[measure] {name}: {value}", file=sys.stderr)


@pytest.fixture(scope="session")
def torch_layer(trixie: Path) -> TorchLayer:
    started = time.monotonic()
    layer = ensure_torch_layer(ensure_template("trixie"))
    origin = "cached" if layer.from_cache else f"built in {layer.build_seconds:.0f} s"
    report("trixie torch layer", f"{time.monotonic() - started:.1f} s ({origin})")
    return layer


@pytest.fixture(scope="session")
def real_repo13() -> Iterator[AptRepo]:
    started = time.monotonic()
    tree = real_debian13_tree()
    report("debian13 real-13.0 repo", f"{time.monotonic() - started:.1f} s (from cache: {tree.from_cache})")
    served = serve_repo(tree)
    yield served
    served.stop()


def cuda12_include(version: str) -> Path:
    """NVIDIA's CUDA `version` include/ tree as its PyPI wheels lay it out, merged into one directory
    (downloaded and unpacked once per machine)."""
    dest = cache_root() / f"cuda-{version}-include"
    with cache_lock(dest):  # another xdist worker may be unpacking the same headers
        if not (dest / ".complete").is_file():
            _download_cuda12_include(version, dest)
    return dest


def _download_cuda12_include(version: str, dest: Path) -> None:
    wheels = cache_root() / f"wheels-cuda-{version}-headers"
    shutil.rmtree(wheels, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                           ":all:", "-d", str(wheels), *CUDA12_HEADER_WHEELS[version]],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(dest, ignore_errors=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                found = re.fullmatch(r"nvidia/cuda_(?:nvcc|runtime)/include/(.+\.(?:h|hpp))", member)
                if found:
                    target = dest / found.group(1)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(member))
    (dest / ".complete").write_text(" ".join(CUDA12_HEADER_WHEELS[version]))
    shutil.rmtree(wheels)


def copy_tree_into(ct: Container, source: Path, target: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(source, arcname=".")
    ct.exec(["/bin/sh", "-c", f"mkdir -p {target} && tar -x -C {target}"], input=buffer.getvalue(),
            check=True)


def install_real_toolkit_by_apt(ct: Container, repo: AptRepo) -> None:
    """What cuda-toolkit.yaml leaves behind, done by hand: NVIDIA's key and source, then the packages."""
    ct.write_file(KEYRING_FILE, repo.built.public_key.read_bytes())
    ct.write_file("/etc/apt/sources.list.d/cuda-debian13-x86_64.list",
                  f"deb [signed-by={KEYRING_FILE}] {repo.repo_url} /\n")
    ct.sh("apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
          "--no-install-recommends cuda-nvcc-13-0 cuda-cudart-dev-13-0 >/dev/null", timeout=600)


def device_archs(ct: Container, path: str) -> list[str]:
    """The SASS archs in an object's fatbinary (nvcc keeps each cubin's ptxas options, "-arch sm_90 -m 64",
    in the .nv_fatbin section); [] when it has no device code. No cuobjdump: the packaged toolkit's bin/
    is nvcc's only, as on this machine."""
    listed = ct.sh(f"readelf -S {path} | grep -q '[.]nv_fatbin' && strings -a {path} | "
                   "grep -o -- '-arch sm_[0-9a-z]*' | sort -u || true").stdout.decode()
    return [line.split()[-1] for line in listed.splitlines()]


def codes(report_: dict[str, Any]) -> set[str]:
    return {f["code"] for f in report_["findings"] if f["severity"] in ("error", "warning")}


def probe(args: list[str]) -> dict[str, Any]:
    probed = run_cli("probe", *args[:2], "--json")
    [target] = probed.json()["targets"]
    return dict(target)


def timed(*args: str, timeout: float = 900) -> tuple[CliResult, float]:
    started = time.monotonic()
    result = run_cli(*args, timeout=timeout)
    return result, time.monotonic() - started


@pytest.mark.timeout(1200)
def test_seed_chain_is_fixed_end_to_end_on_debian_13_with_a_real_cu130_torch(
    lab: Lab, make_ct: Callable[..., Container], torch_layer: TorchLayer, real_repo13: AptRepo,
    tmp_path: Path,
) -> None:
    ct = make_ct(template=torch_layer.layers)
    # The seed's fla beside torch (the stand-in: pure Python importing torch). The extension built is the
    # tiny one; causal-conv1d's full build is test_build_extensions.py's opt-in test (docs/testbed.md).
    install_fla(ct, site=f"{torch_layer.venv}/lib/python3.13/site-packages")
    add_tiny_extension_source(ct)
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(ct.ctid, {"python": torch_layer.python})])
    args = ["-i", str(inventory), "--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={real_repo13.base_url}"]
    build = ["--var", f"extensions={TINY_EXTENSION}", "--var", "pip_args=--no-index", *ONE_ARCH]

    before = probe(args)
    assert before["facts"]["os"]["nvidia_distro"] == "debian13"
    torch = before["facts"]["torch"]
    assert (torch["version"], torch["cuda"], torch["interpreter"]) == (
        "2.14.1+cu130", "13.0", torch_layer.python), torch
    assert codes(before) >= TOOLKIT_CODES, before["findings"]
    # python3-dev is in the layer, and nvcc 13.0 accepts gcc 14 (its host_config.h: gcc <= 15).
    assert not {"PYTHON_HEADERS_MISSING", "HOST_COMPILER_TOO_NEW"} & codes(before), before["findings"]
    fix = next(f["fix"] for f in before["findings"] if f["code"] == "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert (fix["playbook"], fix["vars"]) == (TOOLKIT, {"cuda_version": "13.0"})
    missing = next(f for f in before["findings"] if f["code"] == "EXTENSION_MISSING")
    assert (missing["evidence"]["extension"], missing["fix"]["playbook"]) == ("causal_conv1d", BUILD), missing

    toolkit, toolkit_s = timed("apply", TOOLKIT, *args, *mirror, "--json")
    assert toolkit.exit_code == 0, toolkit.stdout + toolkit.stderr
    assert toolkit.json()["targets"][0]["status"] == "changed"
    listed = ct.sh("cat /etc/apt/sources.list.d/cuda-debian13-x86_64.list").stdout.decode()
    assert f"{real_repo13.base_url}/debian13/x86_64/" in listed
    banner = ct.sh(f"{NVCC} --version").stdout.decode()
    real_banner = subprocess.run([str(REAL_CUDA_13_0 / "bin/nvcc"), "--version"], capture_output=True,
                                 text=True, check=True).stdout
    assert banner == real_banner, "the container's nvcc is not this machine's real one"

    before_build = tree_digest(ct.upper_dir)
    checked = run_cli("apply", BUILD, *args, *build, "--check", "--json")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert checked.json()["targets"][0]["status"] == "would-change"
    assert tree_digest(ct.upper_dir) == before_build, "check mode changed the container"

    built, build_s = timed("apply", BUILD, *args, *build, "--json")
    assert built.exit_code == 0, built.stdout[-3000:] + built.stderr[-3000:]
    report("debian13 chain", f"cuda-toolkit.yaml {toolkit_s:.0f} s, build-extensions.yaml {build_s:.0f} s")
    imported = ct.sh(f"{torch_layer.python} -c 'import torch, fleetfix_tiny_cuda, fleetfix_tiny; "
                     "print(fleetfix_tiny_cuda.__file__, fleetfix_tiny_cuda.built_with_cuda())'", timeout=300)
    module, cudart = imported.stdout.decode().split()
    assert cudart == "13000"   # CUDART_VERSION: nvcc 13.0's headers compiled the kernel file
    assert module.endswith(".cpython-313-x86_64-linux-gnu.so"), module
    # Trixie's own toolchain built it: g++ 14 signs .comment, and the kernel is sm_90 device code.
    comment = ct.sh(f"readelf -p .comment {module}").stdout.decode()
    assert re.search(r"GCC: \(Debian 14\.\d+\.\d+-\d+\) 14\.", comment), comment
    assert device_archs(ct, module) == ["sm_90"]

    after = probe(args)
    assert not (TOOLKIT_CODES | {"CUDA_TOOLKIT_MAJOR_MISMATCH", "HOST_COMPILER_TOO_NEW"}) & codes(after), \
        after["findings"]

    for playbook, extra in ((TOOLKIT, mirror), (BUILD, build)):
        again = run_cli("apply", playbook, *args, *extra, "--json")
        assert again.exit_code == 0, again.stdout[-2000:] + again.stderr[-2000:]
        [target] = again.json()["targets"]
        assert (target["status"], target["counts"]["changed"]) == ("ok", 0), (playbook, target)


@pytest.fixture(scope="module")
def trixie_nvcc(lab: Lab, trixie: Path, real_repo13: AptRepo) -> Iterator[Container]:
    """A Debian 13 container with the real nvcc 13.0 installed by apt, shared by the compile tests."""
    state = lab.node(None).state
    ctid = next(i for i in itertools.count(900) if state.id_owner(i) is None)
    ct = lab.add_container(None, ctid, template=trixie)
    try:
        install_real_toolkit_by_apt(ct, real_repo13)
        versions = ct.sh("ldd --version | head -n 1; g++ -dumpfullversion").stdout.decode().split("\n")
        assert versions[0].endswith(" 2.41") and versions[1].startswith("14."), versions
        ct.write_file("/root/ver.cu", VERSION_CU)
        yield ct
    finally:
        ct.destroy()


@pytest.mark.timeout(600)
def test_cuda_13_0_compiles_a_real_kernel_with_gcc_14_and_glibc_2_41(trixie_nvcc: Container) -> None:
    # 13.0's own headers (their __NV_GLIBC_PROVIDES_IEC_60559_FUNCS guard) on glibc 2.41.
    ct = trixie_nvcc
    ct.write_file("/root/add_one.cu", (TINY_EXTENSION_SOURCE / "csrc" / "add_one.cu").read_bytes())
    ct.sh(f"cd /root && {NVCC} -c -O2 -gencode arch=compute_90,code=sm_90 add_one.cu -o add_one.o "
          f"&& {NVCC} ver.cu -o ver13", timeout=300)
    assert ct.sh("/root/ver13").stdout.decode().strip() == "13000"
    assert device_archs(ct, "/root/add_one.o") == ["sm_90"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", sorted(CUDA12_HEADER_WHEELS))
def test_cuda_12_headers_that_debian_12_compiles_fail_on_debian_13(
    trixie_nvcc: Container, version: str, tmp_path: Path,
) -> None:
    include = cuda12_include(version)
    major, minor = (int(part) for part in version.split("."))
    # Debian 12 (this machine: glibc 2.36, gcc 12): the 12.x headers compile, and they are what was
    # compiled: the binary prints their CUDART_VERSION (12040 ... 12090).
    source, binary = tmp_path / "ver.cu", tmp_path / "ver"
    source.write_text(VERSION_CU)
    host = subprocess.run([str(REAL_CUDA_13_0 / "bin/nvcc"), f"-I{include}", str(source), "-o", str(binary)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert host.returncode == 0, host.stderr
    printed = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.strip()
    assert printed == str(major * 1000 + minor * 10)

    # Debian 13 (glibc 2.41, gcc 14): the same compile fails, in NVIDIA's headers.
    ct = trixie_nvcc
    copy_tree_into(ct, include, f"/opt/cuda-{version}-include")
    failed = ct.sh(f"cd /root && {NVCC} -I/opt/cuda-{version}-include ver.cu -o ver{version}",
                   check=False, timeout=300)
    output = failed.stdout.decode() + failed.stderr.decode()
    assert failed.returncode != 0, output
    newest_gcc = HOST_CONFIG_NEWEST_GCC[version]
    if newest_gcc < 14:
        # crt/host_config.h stops gcc 14 before any glibc header is read.
        assert f"error -- unsupported GNU version! gcc versions later than {newest_gcc} are not supported!" \
            in output, output
        assert "exception specification" not in output
    else:
        clashes = re.findall(r'bits/mathcalls\.h\(\d+\): error: exception specification is incompatible with '
                             r'that of previous function "(\w+)" \(declared at line \d+ of '
                             rf"/opt/cuda-{re.escape(version)}-include/crt/math_functions\.h\)", output)
        assert sorted(clashes) == sorted(GLIBC_241_CLASHES), (CUDA12_HEADER_WHEELS[version], output)


def test_newest_gcc_table_agrees_with_nvidias_host_config_headers() -> None:
    # The rule table (fleetfix/probe/rules/tables.py) against the `#if __GNUC__ > N` that precedes the
    # "unsupported GNU version" #error in each real crt/host_config.h: a version the table encodes must
    # say what NVIDIA's header says.
    headers = {version: cuda12_include(version) / "crt/host_config.h" for version in CUDA12_HEADER_WHEELS}
    headers["13.0"] = REAL_CUDA_13_0 / "include/crt/host_config.h"
    for version, header in headers.items():
        found = re.search(r"#if __GNUC__ > (\d+)\s*\n\s*#error -- unsupported GNU version! "
                          r"gcc versions later than (\d+)", header.read_text())
        assert found and found.group(1) == found.group(2), header
        newest = int(found.group(1))
        assert HOST_CONFIG_NEWEST_GCC[version] == newest, (version, newest)
        major, minor = (int(part) for part in version.split("."))
        assert MAX_GCC_FOR_NVCC.get((major, minor), newest) == newest, (version, newest)
