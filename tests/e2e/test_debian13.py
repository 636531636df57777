"""Debian 13 (trixie) containers built from Debian's own packages: apt 3 with sqv, deb822 sources and
gcc 14 are real here, and the toolkit the debian13 tree serves is this machine's real nvcc 13.0. The
seed's problem fixed end to end on such a container (with the real cu130 torch, the real extension build
and a second apply that changes nothing) is in test_debian13_real.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import host_args, real_debian13_tree, run_cli
from tests.lab.aptrepo import AptRepo, build_repo, serve_repo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.torch_stub import install_fla, install_torch

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TRIXIE_SITE = "/usr/local/lib/python3.13/dist-packages"   # Debian 13's python3 is 3.13
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


@pytest.fixture(scope="session")
def nvidia_repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AptRepo]:
    """One server, two trees, keyed the way NVIDIA's are: debian13/x86_64 (CUDA 13.0 only, a key bound
    with SHA-256; its nvcc is this machine's real 13.0) and debian12/x86_64 (12.8 and 12.4 stand-ins, a
    key bound with SHA-1, which sqv rejects)."""
    debian13 = real_debian13_tree()
    debian12 = build_repo(tmp_path_factory.mktemp("aptrepo13"), distro="debian12", key_binding="sha1")
    served = serve_repo(debian13, more=[debian12])
    yield served
    served.stop()


def seed_problem(cuda: str, torch_version: str) -> Callable[[Container], None]:
    """The seed's problem on trixie: torch (CUDA runtime) and fla, no nvcc, no NVIDIA repository."""
    def setup(ct: Container) -> None:
        install_torch(ct, torch_version, cuda, site=TRIXIE_SITE)
        install_fla(ct, site=TRIXIE_SITE)
    return setup


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"] if f["severity"] in ("error", "warning")]


def test_the_template_is_real_debian_13(make_ct: Callable[..., Container], trixie: Path) -> None:
    ct = make_ct(template=trixie)
    out = ct.sh(". /etc/os-release; echo $VERSION_ID; apt-get --version | head -n 1; gcc -dumpversion; "
                "test -x /usr/bin/sqv && echo sqv; test -e /usr/bin/apt-key || echo no-apt-key").stdout
    version_id, apt, gcc, sqv, apt_key = out.decode().split("\n")[:5]
    assert version_id == "13" and apt.startswith("apt 3.") and gcc == "14"
    assert (sqv, apt_key) == ("sqv", "no-apt-key")


def test_sha1_bound_repository_key_is_rejected_by_apt_3_and_named_by_the_probe(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo,
) -> None:
    debian12 = nvidia_repos.tree("debian12")
    ct = make_ct(template=trixie, setup=seed_problem("12.8", "2.11.0+cu128"))
    ct.write_file("/root/cuda-keyring.deb", debian12.keyring_deb_path().read_bytes())
    ct.sh("dpkg -i /root/cuda-keyring.deb >/dev/null")
    update = ct.sh("apt-get update", check=False)
    output = update.stdout.decode() + update.stderr.decode()
    assert update.returncode == 100, output
    assert "/usr/bin/sqv returned an error code" in output
    assert "SHA1 is not considered secure since 2026-02-01" in output

    [report] = run_cli("probe", *host_args(lab, None, ct.ctid), "--json").json()["targets"]
    assert report["facts"]["apt"]["sqv"] is True and report["facts"]["apt"]["version"].startswith("3.")
    sha1 = next(f for f in report["findings"] if f["code"] == "APT_SHA1_KEY_REJECTED")
    assert sha1["evidence"]["repos"] == ["debian12"]
    assert "apt-key" not in str(report["findings"]), "apt 3 has no apt-key to advise"


def test_deb822_sources_are_what_apt_3_reads_and_what_the_probe_parses(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo,
) -> None:
    ct = make_ct(template=trixie, setup=seed_problem("13.0", "2.14.1+cu130"))
    ct.write_file("/usr/share/keyrings/cuda-archive-keyring.gpg", nvidia_repos.built.public_key.read_bytes())
    ct.write_file("/etc/apt/sources.list.d/cuda-debian13.sources",
                  f"Types: deb\nURIs: {nvidia_repos.repo_url}\nSuites: /\n"
                  "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg\n")
    assert ct.sh("apt-get -qq update && apt-cache policy cuda-nvcc-13-0").stdout.decode().count(
        "13.0.88-1") >= 1
    [report] = run_cli("probe", *host_args(lab, None, ct.ctid), "--json").json()["targets"]
    [source] = report["facts"]["apt"]["nvidia_sources"]
    assert (source["format"], source["file"]) == ("deb822", "/etc/apt/sources.list.d/cuda-debian13.sources")
    assert report["facts"]["apt"]["nvidia_repo_configured"] is True
    assert "NVIDIA_REPO_NOT_CONFIGURED" not in codes(report)
    assert "APT_SHA1_KEY_REJECTED" not in codes(report)


def test_the_seed_problem_on_debian_13_is_diagnosed_and_check_mode_changes_nothing(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo, tmp_path: Path,
) -> None:
    # The fix itself (apply, the real extension build, a second apply) runs with the real cu130 torch:
    # test_debian13_real.py::test_seed_chain_is_fixed_end_to_end_on_debian_13_with_a_real_cu130_torch.
    ct = make_ct(template=trixie, setup=seed_problem("13.0", "2.14.1+cu130"))
    attempt = ct.sh("apt-get install -y cuda-nvcc-13-0", check=False)
    assert attempt.returncode == 100
    assert "Unable to locate package cuda-nvcc-13-0" in attempt.stderr.decode()   # apt 3: "Error: ..."

    targets = host_args(lab, None, ct.ctid)
    probed = run_cli("probe", *targets, "--json")
    assert probed.exit_code == 3
    [report] = probed.json()["targets"]
    assert set(codes(report)) >= TOOLKIT_CODES
    assert report["facts"]["os"]["nvidia_distro"] == "debian13"
    # The minbase template's python3 is externally managed and has no pip (torch was put there as pip
    # does): the extension's fix says to install pip, with python3-dev for Python.h, before any build.
    extension = next(f["fix"] for f in report["findings"] if f["code"] == "EXTENSION_MISSING")
    assert report["facts"]["pythons"][0]["externally_managed"] is True
    assert extension["playbook"] is None
    assert "apt-get install python3-pip python3-dev" in extension["hint"]
    fix = next(f["fix"] for f in report["findings"] if f["code"] == "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert (fix["playbook"], fix["vars"]) == (PLAYBOOK, {"cuda_version": "13.0"})

    state = ["--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={nvidia_repos.base_url}"]
    before = tree_digest(ct.upper_dir)
    checked = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--check", "--json")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert checked.json()["targets"][0]["status"] == "would-change"
    assert tree_digest(ct.upper_dir) == before, "check mode changed the container"


def test_a_cuda_the_debian13_repository_lacks_is_refused_before_anything_changes(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo, tmp_path: Path,
) -> None:
    ct = make_ct(template=trixie, setup=seed_problem("12.8", "2.11.0+cu128"))
    targets = host_args(lab, None, ct.ctid)
    [report] = run_cli("probe", *targets, "--json").json()["targets"]
    fixes = {f["code"]: f["fix"] for f in report["findings"]}
    # No 12.8 toolkit for Debian 13 at all (no apt branch, no nvcc in NVIDIA's cu12 wheels, glibc 2.41):
    # no playbook is prescribed, the way forward is a torch built for CUDA 13.
    assert fixes["CUDA_RUNTIME_WITHOUT_TOOLKIT"]["playbook"] is None
    assert "whl/cu130" in fixes["CUDA_RUNTIME_WITHOUT_TOOLKIT"]["hint"]

    before = tree_digest(ct.upper_dir)
    result = run_cli("apply", PLAYBOOK, *targets, "--var", f"cuda_repo_base={nvidia_repos.base_url}",
                     "--state-dir", str(tmp_path / "state"), "--json")
    assert result.exit_code == 1
    [target] = result.json()["targets"]
    failed = next(s for s in target["steps"] if s["status"] == "failed")
    assert failed["name"] == "NVIDIA apt repository serves this CUDA"
    assert "cuda-nvcc-12-8 is not in" in failed["stderr"] and "whl/cu130" in failed["stderr"]
    assert target["counts"]["changed"] == 0
    assert tree_digest(ct.upper_dir) == before


def test_debian_13s_glibc_2_41_rules_out_every_cuda_12_toolkit(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path,
) -> None:
    # The probe reads the template's real glibc; nvcc 12.6 (like every 12.x) cannot compile against it,
    # which makes its gcc limit (13, below Debian 13's gcc 14) moot: no 12.x toolkit is prescribed.
    ct = make_ct(template=trixie, setup=seed_problem("12.6", "2.6.0+cu126"))
    [report] = run_cli("probe", *host_args(lab, None, ct.ctid), "--json").json()["targets"]
    finding = next(f for f in report["findings"] if f["code"] == "NVCC_GLIBC_INCOMPATIBLE")
    assert (finding["evidence"]["glibc"], finding["evidence"]["nvcc_version"]) == ("2.41", "12.6")
    assert "the route is a torch built for CUDA >= 13.0" in finding["summary"]
    assert "HOST_COMPILER_TOO_NEW" not in [f["code"] for f in report["findings"]]
