"""cuda-toolkit.yaml against the real apt 3 of a Debian 13 container, whose sources are deb822 files: the
step that clears conflicting NVIDIA entries takes only the NVIDIA stanzas out of a `.sources` file that
also holds the distro's own, and apt still reads what is left."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from tests.e2e.conftest import host_args, run_cli
from tests.e2e.test_debian13 import PLAYBOOK, nvidia_repos, seed_problem
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container

__all__ = ["nvidia_repos"]   # the session fixture this module shares with test_debian13

LOCAL_REPO = "/srv/distro-repo"   # stands in for deb.debian.org: a file: repository, so apt needs no network


def distro_stanza() -> str:
    return ("Types: deb\n"
            f"URIs: file:{LOCAL_REPO}\n"
            "Suites: ./\n"
            "Trusted: yes\n")


def local_repo(ct: Container) -> None:
    """An empty flat repository with a Release file that names its (empty) Packages index."""
    empty = hashlib.sha256(b"").hexdigest()
    ct.write_file(f"{LOCAL_REPO}/Packages", b"")
    ct.write_file(f"{LOCAL_REPO}/Release", f"Suite: local\nSHA256:\n {empty} 0 Packages\n")


def test_a_deb822_file_with_the_distros_stanza_keeps_it_when_the_nvidia_stanza_goes(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo, tmp_path: Path,
) -> None:
    ct = make_ct(template=trixie, setup=seed_problem("13.0", "2.14.1+cu130"))
    local_repo(ct)
    # The NVIDIA stanza written by hand into the distro's own file, without a key: the keyring's .list
    # would then conflict with it, so the step must take it out.
    sources = "/etc/apt/sources.list.d/debian.sources"
    nvidia = f"Types: deb\nURIs: {nvidia_repos.repo_url}\nSuites: /\n"
    ct.write_file(sources, "# the distro's sources\n\n" + distro_stanza() + "\n" + nvidia)
    assert ct.sh("apt-get -qq update", check=False).returncode != 0   # apt refuses the unsigned NVIDIA one

    applied = run_cli("apply", PLAYBOOK, *host_args(lab, None, ct.ctid),
                      "--var", f"cuda_repo_base={nvidia_repos.base_url}",
                      "--state-dir", str(tmp_path / "state"), "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    kept = ct.sh(f"cat {sources}").stdout.decode()
    assert kept == "# the distro's sources\n\n" + distro_stanza()
    backups = ct.sh("ls /var/backups/fleetfix-apt/*/debian.sources").stdout.decode().split()
    assert len(backups) == 1
    assert nvidia_repos.repo_url in ct.sh(f"cat {backups[0]}").stdout.decode()
    # apt reads the rewritten file and the keyring's own source: both repositories are there.
    update = ct.sh("apt-get update").stdout.decode()
    assert f"file:{LOCAL_REPO}" in update and nvidia_repos.repo_url.rstrip("/") in update
    assert ct.sh("test -x /usr/local/cuda-13.0/bin/nvcc", check=False).returncode == 0


def test_a_sources_file_with_only_nvidia_stanzas_is_removed(
    lab: Lab, make_ct: Callable[..., Container], trixie: Path, nvidia_repos: AptRepo, tmp_path: Path,
) -> None:
    ct = make_ct(template=trixie, setup=seed_problem("13.0", "2.14.1+cu130"))
    ct.write_file("/etc/apt/sources.list.d/nvidia.sources",
                  f"Types: deb\nURIs: {nvidia_repos.repo_url}\nSuites: /\n")
    applied = run_cli("apply", PLAYBOOK, *host_args(lab, None, ct.ctid),
                      "--var", f"cuda_repo_base={nvidia_repos.base_url}",
                      "--state-dir", str(tmp_path / "state"), "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert ct.sh("test -e /etc/apt/sources.list.d/nvidia.sources", check=False).returncode != 0
