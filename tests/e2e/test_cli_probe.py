"""Issue 3's acceptance through the real CLI: the problem chain, a healthy container, a 12.4 toolkit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import healthy, install_toolkit, problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container

EXIT_FINDINGS = 3


def problems(report: dict[str, Any]) -> list[str]:
    """Error and warning codes (the test bed has no GPU, so the info-level GPU finding is expected)."""
    return [f["code"] for f in report["findings"] if f["severity"] in ("error", "warning")]


def test_problem_case_gets_the_whole_chain_with_fixes(lab: Lab, make_ct: Callable[..., Container]) -> None:
    ct = make_ct(setup=problem_case)
    result = run_cli("probe", *host_args(lab, None, ct.ctid), "--json")
    assert result.exit_code == EXIT_FINDINGS, result.stderr
    [report] = result.json()["targets"]
    assert report["facts"]["torch"]["cuda"] == "12.8"
    assert problems(report) == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED", "EXTENSION_MISSING",
    ]
    fixes = {f["code"]: f["fix"] for f in report["findings"]}
    assert fixes["CUDA_RUNTIME_WITHOUT_TOOLKIT"]["playbook"] == "playbooks/cuda-toolkit.yaml"
    assert fixes["CUDA_RUNTIME_WITHOUT_TOOLKIT"]["vars"]["cuda_version"] == "12.8"
    missing = next(f for f in report["findings"] if f["code"] == "EXTENSION_MISSING")
    assert "causal_conv1d" in missing["summary"]
    assert "Unable to locate package" in fixes["NVIDIA_REPO_NOT_CONFIGURED"]["hint"] + str(
        next(f for f in report["findings"] if f["code"] == "NVIDIA_REPO_NOT_CONFIGURED"))

    # The human report names the same root cause and its fix.
    text = run_cli("probe", *host_args(lab, None, ct.ctid))
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" in text.stdout
    assert "fleetfix apply playbooks/cuda-toolkit.yaml" in text.stdout


def test_healthy_container_gets_no_findings(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, stub_cache: Path,
) -> None:
    ct = make_ct(setup=lambda c: healthy(c, apt_repo, stub_cache))
    result = run_cli("probe", *host_args(lab, None, ct.ctid), "--json")
    [report] = result.json()["targets"]
    assert problems(report) == [], report["findings"]
    assert result.exit_code == 0
    assert [tk["version"] for tk in report["facts"]["cuda"]["toolkits"]] == ["12.8"]


def test_older_toolkit_is_a_minor_mismatch(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, stub_cache: Path,
) -> None:
    def setup(ct: Container) -> None:
        healthy(ct, apt_repo, stub_cache)
        ct.sh("apt-get -qq purge -y cuda-nvcc-12-8 cuda-cudart-dev-12-8 >/dev/null")
        install_toolkit(ct, apt_repo, "12.4")

    ct = make_ct(setup=setup)
    [report] = run_cli("probe", *host_args(lab, None, ct.ctid), "--json").json()["targets"]
    assert problems(report) == ["CUDA_TOOLKIT_MINOR_MISMATCH"]


def test_a_nodes_containers_and_its_facts_share_one_channel(
    lab: Lab, make_ct: Callable[..., Container],
) -> None:
    # Three containers, one of them stopped: one connection and one channel, the batch's
    # (guests/pctbatch.py), which runs the node facts' script too; the stopped one is reported as such and
    # does not hold up the others.
    first, second, stopped = make_ct(setup=problem_case), make_ct(setup=problem_case), make_ct(running=False)
    node = lab.node().ssh
    connections, channels = node.connections(), node.session_channels()
    result = run_cli("probe", *host_args(lab, None, first.ctid, second.ctid, stopped.ctid), "--json")
    reports = {report["ctid"]: report for report in result.json()["targets"]}
    assert node.connections() - connections == 1
    assert node.session_channels() - channels == 1
    for ct in (first, second):
        assert reports[ct.ctid]["status"] == "ok"
        assert reports[ct.ctid]["node_facts"]["hostname"] == node.name  # run by the node, not in a CT
        assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" in problems(reports[ct.ctid])
    stopped_report = reports[stopped.ctid]
    assert stopped_report["status"] == "unreachable"
    assert stopped_report["error"] == f"CT {stopped.ctid} on {stopped_report['node']} is stopped"


def test_probe_local_reports_the_real_nvcc() -> None:
    result = run_cli("probe", "--local", "--json")
    assert result.exit_code in (0, EXIT_FINDINGS), result.stderr
    toolkits = result.json()["targets"][0]["facts"]["cuda"]["toolkits"]
    if Path("/usr/local/cuda-13.0/bin/nvcc").exists():
        assert {"path": "/usr/local/cuda-13.0", "version": "13.0"}.items() <= next(
            tk for tk in toolkits if tk["path"] == "/usr/local/cuda-13.0").items()


REAL_TORCH_PYTHON = Path("/opt/fleetfix-torch-2.14.1/bin/python3")


@pytest.mark.skipif(not REAL_TORCH_PYTHON.exists(), reason="no real torch venv on this machine")
def test_probe_local_judges_a_discovered_venv_and_python_pins_the_list() -> None:
    # --local takes no inventory: discovery is what finds torch outside python3, and --python is what
    # the command line offers to pin the list (the advice its findings give).
    found = run_cli("probe", "--local", "--json")
    assert found.exit_code in (0, EXIT_FINDINGS), found.stderr
    [target] = found.json()["targets"]
    env = next(p for p in target["facts"]["pythons"] if p["interpreter"] == str(REAL_TORCH_PYTHON))
    assert env["discovered"] == "venv" and env["torch"]["cuda"] == "13.0"
    assert "TORCH_IN_UNINSPECTED_ENV" not in [f["code"] for f in target["findings"]]

    pinned = run_cli("probe", "--local", "--python", "python3", "--json")
    assert pinned.exit_code in (0, EXIT_FINDINGS), pinned.stderr
    [target] = pinned.json()["targets"]
    assert [p["interpreter"] for p in target["facts"]["pythons"]] == ["python3"]
    assert target["facts"]["discovered_pythons"] == []
    if target["facts"]["torch"] is None:   # this machine's python3 has no torch
        note = next(f for f in target["findings"] if f["code"] == "TORCH_NOT_FOUND")
        assert "--python PATH" in note["fix"]["hint"]
