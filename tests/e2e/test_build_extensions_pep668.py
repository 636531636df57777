"""The EXTENSION_MISSING fix in a container whose system python is externally managed (PEP 668).

The container's python3 is this machine's Debian 12 python 3.11 (an overlay of it), whose stdlib holds the
real /usr/lib/python3.11/EXTERNALLY-MANAGED: pip refuses `pip install` there ("error:
externally-managed-environment") unless told --break-system-packages. Before, the fix the probe hands out
(`fleetfix apply playbooks/build-extensions.yaml --var extensions=... --var python=python3 ...`) stopped
at "build requirements installed" with that refusal.

torch in the system site, the faithful and cheap way: `pip install --break-system-packages torch` on
Debian 12 puts torch and every distribution it requires (filelock, sympy, networkx, jinja2, fsspec,
setuptools>=77, triton, cuda-toolkit's and nvidia's wheels ...) into /usr/local/lib/python3.11/dist-packages,
each .dist-info with INSTALLER "pip". The real torch 2.14.1 cu130 venv (tests/lab/realtorch.py, built from
/usr/bin/python3.11 with Debian's pip 23.0.1, `pip install torch` plus the build requirements) holds
those files, installed by pip; they are linked into the container's dist-packages instead of copied
(5.4 GB). What `pip install torch` would not have put there is left out: pip itself (Debian's
python3-pip is the one that runs), and wheel, packaging and ninja, which torch does not require: the
build must install them, and that install is what PEP 668 refuses. A torch the
distribution installed has no INSTALLER at all (no Debian package on this machine ships one:
/usr/lib/python3/dist-packages/*.dist-info): that case is the same tree with torch's .dist-info copied
without it.

The real nvcc 13.0 (/usr/local/cuda-13.0 of this machine, shared into the container) and our one-kernel
extension (tests/fixtures/extensions/fleetfix-tiny-ext) make it a real build.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import CliResult, run_cli, write_inventory
from tests.e2e.test_build_extensions import BUILD, ONE_ARCH, TINY_EXTENSION, pip_download, real_torch
from tests.lab.bed import Lab
from tests.lab.cli import add_tiny_extension_source
from tests.lab.container import Container, tree_digest
from tests.lab.realtorch import RealTorch, cache_root

__all__ = ["real_torch"]  # the session fixture, shared with test_build_extensions

pytestmark = [pytest.mark.slow]

SYSTEM_SITE = "/usr/local/lib/python3.11/dist-packages"
REAL_CUDA = "/usr/local/cuda-13.0"
DECISION = "pip may install into the env"
NOT_FROM_PIP = r"pip|pip-*|wheel|wheel-*|packaging|packaging-*|ninja|ninja-*|__pycache__"


@pytest.fixture(scope="module")
def build_requirements() -> Path:
    """setuptools, wheel, packaging and ninja from PyPI (pip download, kept across sessions)."""
    return pip_download(cache_root() / "wheels-build-requirements",
                        "setuptools", "wheel", "packaging", "ninja")


def system_torch_ct(make_ct: Callable[..., Container], lab: Lab, real_torch: RealTorch, tmp_path: Path, *,
                    installer: str | None) -> tuple[Container, list[str]]:
    """A container whose Debian python3 has torch in its system site (see the module docstring); its
    inventory names python3 only and requires causal_conv1d, so EXTENSION_MISSING is that env's."""
    ct = make_ct(share=(str(real_torch.venv), REAL_CUDA))
    add_tiny_extension_source(ct)
    site = f"{real_torch.venv}/lib/python3.11/site-packages"
    ct.sh(f"mkdir -p {SYSTEM_SITE} && for entry in {site}/*; do name=${{entry##*/}}; "
          f"case $name in {NOT_FROM_PIP}) continue ;; esac; ln -s \"$entry\" {SYSTEM_SITE}/$name; done")
    info = f"{SYSTEM_SITE}/torch-{real_torch.version}.dist-info"
    if installer != "pip":
        ct.sh(f"rm {info} && cp -r {site}/torch-{real_torch.version}.dist-info {info} && rm {info}/INSTALLER")
        if installer is not None:
            ct.sh(f"echo {installer} > {info}/INSTALLER")
    pinned = {"pythons": ["python3"], "required_extensions": ["causal_conv1d"]}
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(ct.ctid, pinned)])
    return ct, ["-i", str(inventory), "--state-dir", str(tmp_path / "state")]


def probed(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """python3's EXTENSION_MISSING finding and python3's facts."""
    [target] = run_cli("probe", *args[:2], "--json").json()["targets"]
    [finding] = [f for f in target["findings"] if f["code"] == "EXTENSION_MISSING"]
    assert finding["evidence"]["interpreter"] == "python3"
    env = next(p for p in target["facts"]["pythons"] if p["interpreter"] == "python3")
    assert env["executable"] == "/usr/bin/python3"
    return finding, env


def prescribed(finding: dict[str, Any], offline: Path) -> list[str]:
    """The finding's own command, with the tiny real extension in place of causal_conv1d (its full build
    takes 1.5 h here) and the build requirements from the local download."""
    fix = finding["fix"]
    assert fix["playbook"] == BUILD
    variables = {**fix["vars"], "extensions": TINY_EXTENSION}
    options = [word for name, value in variables.items() for word in ("--var", f"{name}={value}")]
    return [*options, "--var", f"pip_args=--no-index --find-links {offline}", *ONE_ARCH]


def steps(result: CliResult) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in result.json()["targets"][0]["steps"]}


def imports_tiny(ct: Container, python: str) -> str:
    done = ct.sh(f"{python} -c 'import torch, fleetfix_tiny_cuda, fleetfix_tiny; "
                 "print(fleetfix_tiny_cuda.built_with_cuda())'", check=False, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().strip()


@pytest.mark.timeout(1200)
def test_torch_pip_installed_into_debians_python_gets_a_fix_that_builds(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch, build_requirements: Path,
    tmp_path: Path,
) -> None:
    ct, args = system_torch_ct(make_ct, lab, real_torch, tmp_path, installer="pip")
    assert "externally-managed-environment" in ct.sh(
        "python3 -m pip install --no-index wheel", check=False).stderr.decode()   # the marker is real
    finding, env = probed(args)
    # The command the probe prescribes runs to a built extension (before: "build requirements installed"
    # failed with pip's "error: externally-managed-environment").
    built = run_cli("apply", BUILD, *args, *prescribed(finding, build_requirements), "--json", timeout=900)
    assert built.exit_code == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (env["externally_managed"], env["torch_installer"], env["pip_version"]) == (True, "pip", "23.0.1")
    assert finding["fix"]["vars"]["break_system_packages"] == "true"
    assert "pip install --break-system-packages" in finding["fix"]["hint"]
    done = steps(built)
    assert done[DECISION]["reason"].endswith(
        "torch was installed there by pip, so this build does the same: --break-system-packages")
    assert done["build requirements installed"]["status"] == "changed"
    assert done["extensions built"]["status"] == "changed"
    assert imports_tiny(ct, "python3") == "13000"   # CUDART_VERSION: compiled by the real nvcc 13.0
    listed = ct.sh(f"ls {SYSTEM_SITE}").stdout.decode().split()
    assert any(name.startswith("fleetfix_tiny") for name in listed) and "ninja" in listed


@pytest.mark.timeout(1200)
def test_a_distribution_torch_is_refused_before_anything_changes_and_the_venv_route_builds(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch, build_requirements: Path,
    tmp_path: Path,
) -> None:
    ct, args = system_torch_ct(make_ct, lab, real_torch, tmp_path, installer=None)
    finding, env = probed(args)
    assert (env["externally_managed"], env["torch_installer"]) == (True, None)
    # No command that would fail: the hint is the way that works.
    assert finding["fix"]["playbook"] is None
    hint = finding["fix"]["hint"]
    venv_command = "python3 -m venv --system-site-packages /opt/torch-venv"
    assert venv_command in hint and "--var python=/opt/torch-venv/bin/python --var cuda_version=13.0" in hint

    # The command the probe handed out before (python=python3) is refused in its decision step, with the
    # reason and the way forward, and nothing in the container changed.
    before = tree_digest(ct.upper_dir)
    old_fix = ["--var", f"extensions={TINY_EXTENSION}", "--var", "python=python3",
               "--var", "cuda_version=13.0",
               "--var", f"pip_args=--no-index --find-links {build_requirements}", *ONE_ARCH]
    refused = run_cli("apply", BUILD, *args, *old_fix, "--json")
    assert refused.exit_code == 1, refused.stdout + refused.stderr
    [target] = refused.json()["targets"]
    failed = next(s for s in target["steps"] if s["status"] == "failed")
    assert failed["name"] == DECISION
    assert "EXTERNALLY_MANAGED: python3 is externally managed (PEP 668" in failed["reason"]
    assert "no INSTALLER (a distribution package)" in failed["reason"] and venv_command in failed["reason"]
    assert target["counts"]["changed"] == 0 and "build requirements installed" not in steps(refused)
    assert tree_digest(ct.upper_dir) == before

    # The way forward, as the hint says it: a venv that sees the system's torch, then the build there.
    ct.sh(venv_command, timeout=300)
    venv_fix = [word.replace("python=python3", "python=/opt/torch-venv/bin/python") for word in old_fix]
    built = run_cli("apply", BUILD, *args, *venv_fix, "--json", timeout=900)
    assert built.exit_code == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert steps(built)[DECISION]["reason"] == (
        "/opt/torch-venv/bin/python is not externally managed (PEP 668): pip installs into it as it is")
    assert imports_tiny(ct, "/opt/torch-venv/bin/python") == "13000"
    system = ct.sh(f"ls {SYSTEM_SITE}").stdout.decode().split()
    assert not any(name.startswith("fleetfix_tiny") for name in system)   # the system site untouched
