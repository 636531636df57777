"""cuda-toolkit.yaml for real: overlay containers of the test bed, real apt/dpkg, the local NVIDIA-style
repository. No SSH here (the e2e suite covers that path): scripts enter the container with nsenter, with
the PATH `pct exec` forces."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleetfix.playbook.load import load_playbook
from fleetfix.playbook.records import RunRecorder, load_run
from fleetfix.playbook.runner import FleetAccess, RunHooks, RunOptions, run_playbook
from fleetfix.probe.run import gather_facts
from fleetfix.transport.base import CommandResult, OutputSink
from tests.lab.aptrepo import AptRepo, BuiltRepo, build_repo, serve_repo
from tests.lab.container import Container, NodeState, tree_digest
from tests.unit.playbook.conftest import REPO, StandInFleet, make_target

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="overlay containers and real dpkg need root"),
]

PLAYBOOK = REPO / "playbooks" / "cuda-toolkit.yaml"
DEAD_MIRROR = "http://127.0.0.1:9/compute/cuda/repos"  # loopback, nothing listening


class ContainerTransport:
    def __init__(self, container: Container) -> None:
        self.container, self.label = container, f"ct{container.ctid}"

    def execute(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
                on_output: OutputSink | None = None) -> CommandResult:
        started = time.monotonic()
        try:
            done = self.container.exec(list(argv), input=stdin, timeout=timeout or 300)
        except subprocess.TimeoutExpired:
            return CommandResult(-1, "", "", time.monotonic() - started, timed_out=True)
        if on_output is not None:
            on_output("stdout", done.stdout)
            on_output("stderr", done.stderr)
        return CommandResult(done.returncode, done.stdout.decode(errors="replace"),
                             done.stderr.decode(errors="replace"), time.monotonic() - started)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BuiltRepo:
    return build_repo(tmp_path_factory.mktemp("aptrepo"))


@pytest.fixture(scope="module")
def mirror(built: BuiltRepo) -> Iterator[AptRepo]:
    # A mirror whose keyring names another base URL (as NVIDIA's does): the playbook must repoint it.
    served = serve_repo(built, keyring_base_url=DEAD_MIRROR)
    yield served
    served.stop()


@pytest.fixture()
def node(tmp_path: Path) -> Iterator[NodeState]:
    state = NodeState.create(tmp_path / "node", "pve1")
    yield state
    for container in state.containers():
        container.destroy()


def start(node: NodeState, ctid: int) -> Container:
    container = node.create_container(ctid)
    container.start()
    return container


def apply(targets: list[Any], transports: dict[str, ContainerTransport], *, check: bool,
          recorder: RunRecorder | None = None, **cli_vars: Any) -> Any:
    cli_vars.setdefault("cuda_version", "12.8")  # these containers hold no torch to say it
    return run_playbook(
        load_playbook(PLAYBOOK), targets,
        # The real probe's facts: the playbook's facts_checks take them at their word.
        FleetAccess(StandInFleet(transports).map, lambda t, tr: gather_facts(t, tr).model_dump(mode="json")),
        RunOptions(vars=cli_vars, check_mode=check),
        RunHooks(recorder=recorder))


def test_fixes_a_container_idempotently_and_check_mode_changes_nothing(
    node: NodeState, mirror: AptRepo, tmp_path: Path,
) -> None:
    good, dead = start(node, 101), start(node, 102)
    # An old hand-written entry for the same repo: left alone, apt fails on the Signed-By conflict.
    good.sh(f"echo 'deb {mirror.repo_url} /' > /etc/apt/sources.list.d/cuda.list")
    targets = [make_target("pve1/101", 101, cuda_repo_base=mirror.base_url),
               make_target("pve1/102", 102, cuda_repo_base=DEAD_MIRROR)]
    transports = {"pve1/101": ContainerTransport(good), "pve1/102": ContainerTransport(dead)}
    assert "Unable to locate package" in good.sh("apt-get install -y cuda-nvcc-12-8", check=False
                                                  ).stderr.decode()

    before = tree_digest(good.upper_dir)
    checked = apply(targets[:1], transports, check=True)
    assert tree_digest(good.upper_dir) == before
    assert checked.targets[0].status == "would-change"
    assert [s.status for s in checked.targets[0].steps] == ["ok", "ok", "ok"] + ["would-change"] * 6

    with RunRecorder(tmp_path / "state") as recorder:
        first = apply(targets, transports, check=False, recorder=recorder)
    fixed, failed = first.targets
    print(*[(s.name, s.status, s.reason) for t in first.targets for s in t.steps], sep='\n')
    assert fixed.status == "changed", [(s.name, s.status, s.reason, s.stderr) for s in fixed.steps]
    assert fixed.counts()["changed"] == 5
    assert "release 12.8" in fixed.steps[-1].reason
    assert good.sh("test ! -e /etc/apt/sources.list.d/cuda.list", check=False).returncode == 0
    # A dead mirror is found before anything changes: the repository's index cannot be read.
    assert failed.status == "failed"
    assert failed.steps[-1].name == "NVIDIA apt repository serves this CUDA"
    assert "cannot read " + DEAD_MIRROR in failed.steps[-1].stderr
    assert failed.counts()["changed"] == 0
    record = load_run(tmp_path / "state", recorder.run_id)
    assert record.summary.status == "failed"
    assert any("apt-get" in script.script for step in record.targets["pve1/101"].steps
               for script in step.scripts)

    second = apply(targets[:1], transports, check=False)
    assert second.targets[0].status == "ok", [(s.name, s.status, s.reason) for s in second.targets[0].steps]
    assert second.targets[0].counts()["changed"] == 0
