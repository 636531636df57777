"""Issue 18, item 1: a node login that is not root, with only the sudoers lines docs/security.md documents
(`pct`, `qm`, `pvesh` as root, NOPASSWD), runs the probe and the cuda-toolkit playbook end to end.

The test bed's nodes have that login (`fleetfix`, tests/lab/sshd.py: NODE_SUDOERS); the `pct` stand-in
refuses anyone but root, as PVE's does, so nothing passes here without sudo doing its part.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import in_ci
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.sshd import LOGIN_USER

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


@pytest.fixture(autouse=True)
def needs_sudo(lab: Lab) -> None:
    if lab.node().ssh.login_user is None:
        if in_ci():
            pytest.fail("CI=true and sudo is missing (.ci/run installs it)", pytrace=False)
        pytest.skip("sudo is not installed: the test bed has no non-root login")


def login_args(lab: Lab, *ctids: int) -> list[str]:
    return [*host_args(lab, None, *ctids), "--user", LOGIN_USER]


def test_without_become_the_login_cannot_reach_its_containers(
    lab: Lab, make_ct: Callable[..., Container],
) -> None:
    ct = make_ct(setup=problem_case)
    result = run_cli("probe", *login_args(lab, ct.ctid), "--json")
    assert result.exit_code == 4, result.stdout + result.stderr
    error = result.json()["targets"][0]["error"]
    assert "pct" in error and "not found" in error, error


def test_probe_and_the_cuda_toolkit_playbook_through_sudo(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    first, second = make_ct(setup=problem_case), make_ct(setup=problem_case)
    node = lab.node()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts),
                     "user": LOGIN_USER, "become": True},
        "nodes": [{"name": node.name, "address": node.address, "port": node.port,
                   "containers": [{"ctid": first.ctid}, {"ctid": second.ctid}]}],
    }))
    probed = run_cli("probe", "-i", str(inventory), "--json")
    assert probed.exit_code == 3, probed.stdout + probed.stderr
    for report in probed.json()["targets"]:
        assert {f["code"] for f in report["findings"]} >= TOOLKIT_CODES, report

    state = ["--state-dir", str(tmp_path / "state")]
    applied = run_cli("apply", PLAYBOOK, "-i", str(inventory), "--var",
                      f"cuda_repo_base={apt_repo.base_url}", *state, "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert {t["status"] for t in applied.json()["targets"]} == {"changed"}

    # The flags do the same as the inventory fields.
    again = run_cli("probe", *login_args(lab, first.ctid, second.ctid), "--become", "--json")
    assert again.exit_code in (0, 3), again.stdout + again.stderr
    for report in again.json()["targets"]:
        assert not TOOLKIT_CODES & {f["code"] for f in report["findings"]}, report
    # Every pct call came through sudo as root: the stand-in refuses anyone else.
    assert node.pct_exec_count() > 0


def test_a_command_sudoers_does_not_allow_is_a_clear_error(lab: Lab, tmp_path: Path) -> None:
    """A node that is itself a target runs its commands through sudo: with only pct/qm/pvesh granted,
    `exec` on the node is refused by sudo, and said so in one line with the sudoers hint."""
    result = run_cli("exec", *login_args(lab), "--become", "--", "id", "-u")
    assert result.exit_code == 4, result.stdout + result.stderr
    assert "sudo -u root id: sudo: a password is required" in result.stdout
    assert "docs/security.md" in result.stdout


def test_become_password_is_a_reference_never_the_value(lab: Lab) -> None:
    result = run_cli("probe", *login_args(lab), "--become", "--become-password", "hunter2")
    assert result.exit_code == 2
    assert "hunter2" not in result.stdout + result.stderr
    assert "--become-password: expected @env:NAME or @file:PATH" in result.stderr
    missing = run_cli("probe", *login_args(lab), "--become", "--become-password", "@env:FLEETFIX_NO_SUCH_VAR")
    assert missing.exit_code == 2
    assert "$FLEETFIX_NO_SUCH_VAR is not set" in missing.stderr


def test_sudo_is_on_this_machine() -> None:
    assert shutil.which("sudo") or not in_ci()
