"""Fixtures for the CLI end-to-end tests: the fleetfix CLI as a user runs it, against the test bed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import in_ci
from tests.lab.aptrepo import REAL_CUDA_13_0, AptRepo, BuiltRepo, build_repo, serve_repo
from tests.lab.bed import Lab, LabNode
from tests.lab.realtorch import cache_root
from tests.lab.template import ensure_template

REPO = Path(__file__).resolve().parents[2]


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> CliResult:
    """`python -m fleetfix ARGS` in a child process: the real entry point, exit code and streams."""
    done = subprocess.run(
        [sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "NO_COLOR": "1", **(env or {})}, cwd=REPO,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def host_args(lab: Lab, node: LabNode | None = None, *ctids: int) -> list[str]:
    target = lab.node(node)
    args = ["--host", target.address, "--port", str(target.port), "--identity", str(lab.client_key),
            "--known-hosts", str(lab.known_hosts)]
    for ctid in ctids:
        args += ["--ct", str(ctid)]
    return args


def write_inventory(path: Path, lab: Lab, containers: Sequence[tuple[int, dict[str, Any]]],
                    node: LabNode | None = None) -> Path:
    """An inventory file for containers on one lab node: [(ctid, vars), ...]."""
    target = lab.node(node)
    document = {
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{
            "name": target.name, "address": target.address, "port": target.port,
            "containers": [{"ctid": ctid, "vars": ct_vars} for ctid, ct_vars in containers],
        }],
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="session")
def apt_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AptRepo]:
    """The local NVIDIA-style repository (cuda 12.8 and 12.4 sets), served on 127.0.0.1."""
    served = serve_repo(build_repo(tmp_path_factory.mktemp("aptrepo")))
    yield served
    served.stop()


# --- Debian 13 (trixie): tests/e2e/test_debian13.py and test_debian13_real.py -------------------------

def real_debian13_tree() -> BuiltRepo:
    """NVIDIA's debian13/x86_64 tree as the test bed serves it: CUDA 13.0 only, its cuda-nvcc-13-0,
    cuda-cudart-dev-13-0 and cuda-cccl-13-0 carrying this machine's real /usr/local/cuda-13.0 (built once
    per machine under $FLEETFIX_TEST_CACHE/aptrepo)."""
    if not (REAL_CUDA_13_0 / "bin" / "nvcc").is_file():
        problem = f"{REAL_CUDA_13_0}/bin/nvcc is missing: the Debian 13 toolkit tests install the real one"
        if in_ci():
            pytest.fail(f"CI=true: {problem}", pytrace=False)
        pytest.skip(problem)
    return build_repo(cache_root() / "aptrepo", cuda_versions=(), distro="debian13", real_13_0=True)


@pytest.fixture(scope="session")
def trixie() -> Path:
    """The Debian 13 root filesystem (built once per machine by debootstrap, then cached)."""
    if shutil.which("debootstrap") is None and not os.path.exists("/usr/sbin/debootstrap"):
        problem = "the Debian 13 template needs debootstrap (apt-get install debootstrap)"
        if in_ci():
            pytest.fail(f"CI=true: {problem}", pytrace=False)
        pytest.skip(problem)
    return ensure_template("trixie").rootfs
