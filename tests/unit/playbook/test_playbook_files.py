"""Every shipped playbook loads, renders against the problem-case facts, and is valid sh."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetfix.playbook.load import load_playbook
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import RunContext, plan_target, run_target
from fleetfix.transport.fake import FakeTransport
from tests.unit.playbook.conftest import REPO, make_target

PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yaml"))


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_playbook_validates_and_renders(path: Path, facts: dict[str, Any]) -> None:
    book = load_playbook(path)
    plan = plan_target([compile_playbook(b) for b in book.chain()], make_target("pve1/101"), facts, {})
    for play in plan.plays:
        for planned in play.steps:
            if planned.rendered is None:
                continue
            for phase in ("check", "apply", "verify"):
                script = planned.rendered.script(phase)
                if script is not None:
                    syntax = subprocess.run(["/bin/sh", "-n"], input=script, text=True, capture_output=True,
                                            check=False)
                    assert syntax.returncode == 0, f"{planned.compiled.step.name} {phase}: {syntax.stderr}"


def cuda_plan(facts: dict[str, Any], **cli_vars: Any) -> Any:
    book = load_playbook(REPO / "playbooks" / "cuda-toolkit.yaml")
    return plan_target([compile_playbook(book)], make_target("pve1/101"), facts, cli_vars)


def test_cuda_toolkit_vars_from_facts(facts: dict[str, Any]) -> None:
    plan = cuda_plan(facts)
    found = plan.plays[0].vars
    assert found["cuda_xy"] == "12.8" and found["cuda_pkg_suffix"] == "12-8"
    assert found["cuda_repo_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"
    assert found["cuda_packages"] == ["cuda-nvcc-12-8", "cuda-cudart-dev-12-8", "cuda-cccl-12-8"]
    steps = {p.compiled.step.name: p.rendered for p in plan.plays[0].steps}
    keyring = steps["cuda-keyring installed"]
    assert keyring is not None and keyring.apply is not None
    assert ("url=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
            "cuda-keyring_1.1-1_all.deb") in keyring.apply
    install = steps["toolkit packages installed"]
    assert install is not None and install.apply is not None
    assert "export DEBIAN_FRONTEND=noninteractive\n" in install.apply
    assert "--no-install-recommends cuda-nvcc-12-8 cuda-cudart-dev-12-8 cuda-cccl-12-8" in install.apply
    assert "libcublas" not in install.apply


def test_cuda_toolkit_overrides(facts: dict[str, Any]) -> None:
    plan = cuda_plan(facts, cuda_version="12.4", install_math_libs="true",
                     cuda_repo_base="http://127.0.0.1:8080/compute/cuda/repos/")
    found = plan.plays[0].vars
    assert found["cuda_repo_url"] == "http://127.0.0.1:8080/compute/cuda/repos/debian12/x86_64"
    install = {p.compiled.step.name: p.rendered for p in plan.plays[0].steps}["toolkit packages installed"]
    assert "cuda-nvcc-12-4" in install.apply and "libcusolver-dev-12-4" in install.apply
    assert "cuda-nvcc-12-8" not in install.apply


def test_cuda_toolkit_refuses_unsupported_distro_and_missing_torch(facts: dict[str, Any]) -> None:
    facts["os"].update(id="alpine", version_id="3.20", nvidia_distro=None, nvidia_arch=None)
    facts["torch"] = None
    plan = cuda_plan(facts)
    first = plan.plays[0].steps[0].rendered
    done = subprocess.run(["/bin/sh", "-s"], input=first.check, text=True, capture_output=True, check=False)
    assert done.returncode == 1 and "pass --var cuda_version=X.Y" in done.stderr
    second = plan.plays[0].steps[1].rendered
    done = subprocess.run(["/bin/sh", "-s"], input=second.check, text=True, capture_output=True, check=False)
    assert done.returncode == 1
    assert "NVIDIA publishes no CUDA apt repository for alpine 3.20 on x86_64" in done.stderr
    assert "playbooks/cuda-toolkit-pip.yaml" in done.stderr


def test_cuda_toolkit_without_apt_names_the_routes_that_work(facts: dict[str, Any]) -> None:
    facts["os"].update(id="rocky", version_id="9.4", nvidia_distro=None, nvidia_arch="x86_64")
    facts["apt"]["present"] = False
    repo_step = cuda_plan(facts).plays[0].steps[1].rendered
    done = subprocess.run(["/bin/sh", "-s"], input=repo_step.check, text=True, capture_output=True,
                          check=False)
    assert done.returncode == 1
    assert "no apt-get on this target: rocky 9.4" in done.stderr
    assert "cuda-toolkit-pip.yaml" in done.stderr and "dnf" in done.stderr


@pytest.mark.parametrize(("cuda", "route"), [
    # NVIDIA's cu12 nvcc wheels hold no nvcc (tests/unit/groundtruth): the pip toolkit is no way forward.
    ("12.8", "NVIDIA's pip wheels hold no nvcc for CUDA 12.8: install a torch built for CUDA 13.0"),
    ("13.0", "use playbooks/cuda-toolkit-pip.yaml (the pip toolkit)"),
])
def test_cuda_toolkit_refusal_names_a_route_that_works_for_the_cuda(facts: dict[str, Any], cuda: str,
                                                                    route: str) -> None:
    facts["os"].update(id="alpine", version_id="3.20", nvidia_distro=None, nvidia_arch=None)
    repo_step = cuda_plan(facts, cuda_version=cuda).plays[0].steps[1].rendered
    done = subprocess.run(["/bin/sh", "-s"], input=repo_step.check, text=True, capture_output=True,
                          check=False)
    assert done.returncode == 1 and route in done.stderr


def test_cuda_toolkit_check_mode_never_runs_apply(facts: dict[str, Any]) -> None:
    # Only the check scripts are scripted: every check reports "not there", except the two assertions.
    # The facts agree: a hand-written NVIDIA entry, so no step is known from them but dpkg's.
    facts["apt"]["nvidia_sources"] = [{
        "file": "/etc/apt/sources.list.d/cuda.list", "line": 1, "format": "list", "types": "deb",
        "uri": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", "suite": "/",
        "components": "", "signed_by": None, "enabled": True}]
    facts["dpkg"]["present"] = True
    fake = FakeTransport()
    fake.on("grep -Eq '^[0-9]+", stdout="CUDA 12.8\n")  # cuda version known
    fake.on("Packages.gz", stdout="cuda-nvcc-12-8 is in .../debian12/x86_64/Packages.gz\n")
    fake.on("dpkg state is clean", stdout="dpkg state is clean\n")
    fake.on("found=", rc=1,
            stdout="NVIDIA source entries besides the keyring's own: /etc/apt/sources.list.d/cuda.list\n")
    fake.on("status=$(dpkg-query", rc=1, stdout="cuda-keyring is not installed\n")
    fake.on("cuda-keyring's source list", rc=1, stdout="cuda-keyring's source list is not there yet\n")
    fake.on("Candidate:", rc=1, stdout="cuda-nvcc-12-8 is not in the apt index\n")
    fake.on("missing=", rc=1, stdout="not installed: cuda-nvcc-12-8\n")
    fake.on("--version", rc=1, stderr="/usr/local/cuda-12.8/bin/nvcc --version failed\n")
    run = run_target(cuda_plan(facts), fake, RunContext(check_mode=True))
    assert [s.status for s in run.steps] == ["ok", "ok", "ok"] + ["would-change"] * 6
    assert run.status == "would-change"
    assert not any("apt-get" in text and "install -y" in text for text in fake.scripts)
    assert not any("dpkg -i" in text or "apt-get -o DPkg::Lock::Timeout=600 update" in text
                   for text in fake.scripts)


def _stub_dpkg_query(tmp_path: Path, statuses: dict[str, list[str]]) -> dict[str, str]:
    """An environment whose PATH holds a dpkg-query answering `-W -f='${Package} ${Status}\\n' NAMES...`
    from statuses (each name's instances, as dpkg's database would list a multiarch package) and the
    few tools the checks use, no python3: a check that reads the repository's index says it cannot."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    table = tmp_path / "statuses"
    table.write_text("".join(f"{name} {status}\n" for name, lines in statuses.items() for status in lines))
    (bin_dir / "dpkg-query").write_text(
        "#!/bin/sh\n"
        f'echo call >> {tmp_path / "calls"}\n'
        '[ "$1" = -W ] || exit 1\n'
        "shift 2\n"
        "rc=0\n"
        'for p in "$@"; do\n'
        f'  grep "^$p " {table} || {{ echo "dpkg-query: no packages found matching $p" >&2; rc=1; }}\n'
        "done\n"
        "exit $rc\n")
    (bin_dir / "dpkg-query").chmod(0o755)
    for tool in ("awk", "grep", "head"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True, check=True)
        (bin_dir / tool).symlink_to(found.stdout.strip())
    return {"PATH": str(bin_dir)}


@pytest.mark.parametrize(("statuses", "missing"), [
    ({"cuda-nvcc-12-8": ["install ok installed"], "cuda-cudart-dev-12-8": ["hold ok installed"],
      "cuda-cccl-12-8": ["install ok installed"]}, None),
    # One instance installed of a multiarch package is enough, as `grep -q ' installed$'` per package said.
    ({"cuda-nvcc-12-8": ["deinstall ok config-files", "install ok installed"],
      "cuda-cudart-dev-12-8": ["install ok installed"], "cuda-cccl-12-8": ["install ok installed"]}, None),
    ({"cuda-nvcc-12-8": ["install ok unpacked"], "cuda-cudart-dev-12-8": ["unknown ok not-installed"],
      "cuda-cccl-12-8": ["install ok installed"]}, "not installed: cuda-nvcc-12-8 cuda-cudart-dev-12-8"),
    ({"cuda-cccl-12-8": ["install ok installed"]}, "not installed: cuda-nvcc-12-8 cuda-cudart-dev-12-8"),
])
def test_cuda_toolkit_packages_check_reads_every_package_in_one_query(
    facts: dict[str, Any], tmp_path: Path, statuses: dict[str, list[str]], missing: str | None,
) -> None:
    step = next(s for s in cuda_plan(facts).plays[0].steps
                if s.compiled.step.name == "toolkit packages installed")
    done = subprocess.run(["/bin/sh", "-s"], input=step.rendered.check, text=True, capture_output=True,
                          check=False, env=_stub_dpkg_query(tmp_path, statuses))
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    if missing is None:
        everything = "installed: cuda-nvcc-12-8 cuda-cudart-dev-12-8 cuda-cccl-12-8\n"
        assert (done.returncode, done.stdout) == (0, everything), done.stderr
    else:
        assert (done.returncode, done.stdout) == (1, missing + "\n"), done.stderr


@pytest.mark.parametrize("keyring", [None, "deinstall ok config-files", "install reinstreq installed"])
def test_cuda_toolkit_reads_the_index_whenever_something_would_be_installed(
    facts: dict[str, Any], tmp_path: Path, keyring: str | None,
) -> None:
    """The toolkit installed but cuda-keyring not (a status of "<want> ok installed", as its step asks;
    "reinstreq" is a broken package): the keyring step would download from the repository, so the index
    is read (here: no python3)."""
    toolkit = ("cuda-nvcc-12-8", "cuda-cudart-dev-12-8", "cuda-cccl-12-8")
    statuses = {p: ["install ok installed"] for p in toolkit}
    if keyring:
        statuses["cuda-keyring"] = [keyring]
    step = cuda_plan(facts, cuda_repo_base="http://127.0.0.1:9/repos").plays[0].steps[1]
    done = subprocess.run(["/bin/sh", "-s"], input=step.rendered.check, text=True, capture_output=True,
                          check=False, env=_stub_dpkg_query(tmp_path, statuses))
    assert done.returncode == 0 and done.stdout.startswith("no python3 to read "), done.stdout + done.stderr
