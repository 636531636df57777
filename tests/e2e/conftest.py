"""Fixtures for the CLI end-to-end tests: the fleetfix CLI as a user runs it, against the test bed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lab.aptrepo import AptRepo, build_repo, serve_repo
from tests.lab.bed import Lab, LabNode

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
