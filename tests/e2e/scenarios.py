"""Container set-ups for the end-to-end tests: the problem case, a healthy container, a mismatch."""

from __future__ import annotations

from pathlib import Path

from tests.lab.aptrepo import AptRepo
from tests.lab.container import Container
from tests.lab.torch_stub import install_causal_conv1d, install_fla, install_torch


def problem_case(ct: Container) -> None:
    """torch 2.11.0+cu128 (runtime 12.8), fla present, causal_conv1d absent, no nvcc, no NVIDIA repo."""
    install_torch(ct, "2.11.0+cu128", "12.8")
    install_fla(ct)


def install_toolkit(ct: Container, repo: AptRepo, cuda: str) -> None:
    """What an engineer would do by hand: keyring from the repo, apt-get update, nvcc + cudart-dev."""
    suffix = cuda.replace(".", "-")
    ct.write_file("/root/cuda-keyring.deb", repo.keyring_deb_path().read_bytes())
    ct.sh(
        "dpkg -i /root/cuda-keyring.deb >/dev/null && rm /root/cuda-keyring.deb\n"
        "apt-get -qq update\n"
        f"DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends "
        f"cuda-nvcc-{suffix} cuda-cudart-dev-{suffix} >/dev/null\n",
        timeout=120,
    )


def healthy(ct: Container, repo: AptRepo, stub_cache: Path) -> None:
    problem_case(ct)
    install_causal_conv1d(ct, compiled=True, cache_dir=stub_cache)
    install_toolkit(ct, repo, "12.8")
