"""benchmarks/apply_ansible.py without Ansible: the playbook it writes, the values it takes from fleetfix's
run record, how it reads ansible-playbook's recap, and what it calls a run that did not do the work.

Ansible itself (a 550 MB venv, minutes to install) is not run in CI; the e2e smoke test checks that the
bed serves the exact command lines proxmox_pct_remote sends (tests/e2e/test_benchmark_smoke.py).
"""

from __future__ import annotations

import re

import yaml

from benchmarks.apply_ansible import CUDA_PLAYBOOK, Row, parse_recap, playbook_vars, problems

# What fleetfix's run record holds for a problem-case target (TargetRecord.vars, rendered).
FLEETFIX_VARS = {
    "cuda_repo_base": "http://127.0.0.1:45107/compute/cuda/repos",
    "cuda_repo_url": "http://127.0.0.1:45107/compute/cuda/repos/debian12/x86_64",
    "cuda_version": "12.8", "cuda_xy": "12.8", "cuda_pkg_suffix": "12-8",
    "cuda_packages": ["cuda-nvcc-12-8", "cuda-cudart-dev-12-8", "cuda-cccl-12-8"],
    "keyring_version": "1.1-1", "apt_lock_timeout": 600, "install_math_libs": False,
}

RECAP = """\
PLAY RECAP *********************************************************************
node1-200         : ok=5    changed=3    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
node1-201         : ok=2    changed=1    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
node2-200         : ok=0    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0
node2-201         : ok=4    changed=0    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0
"""


def test_the_playbook_does_fleetfixs_work_with_its_values() -> None:
    values = playbook_vars(FLEETFIX_VARS)
    assert values == {
        "cuda_repo_url": "http://127.0.0.1:45107/compute/cuda/repos/debian12/x86_64", "cuda_xy": "12.8",
        "cuda_packages": ["cuda-nvcc-12-8", "cuda-cudart-dev-12-8", "cuda-cccl-12-8"],
        "keyring_version": "1.1-1", "apt_lock_timeout": 600,
        "keyring_list": "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",  # the keyring's own .list
    }
    [play] = yaml.safe_load(CUDA_PLAYBOOK)
    assert play["hosts"] == "containers" and play["gather_facts"] is False
    modules = [next(key for key in task if key.startswith("ansible.")) for task in play["tasks"]]
    assert modules == ["ansible.builtin.apt", "ansible.builtin.copy", "ansible.builtin.apt",
                       "ansible.builtin.apt", "ansible.builtin.command"]
    keyring, source, update, install, nvcc = play["tasks"]
    assert keyring["ansible.builtin.apt"]["deb"].endswith("/cuda-keyring_{{ keyring_version }}_all.deb")
    assert update["ansible.builtin.apt"]["update_cache"] is True
    assert update["when"] == "keyring is changed or source is changed"  # as fleetfix: no needless update
    assert install["ansible.builtin.apt"]["install_recommends"] is False  # fleetfix: --no-install-recommends
    assert source["ansible.builtin.copy"]["content"].endswith(" {{ cuda_repo_url }}/ /\n")
    assert nvcc["changed_when"] is False
    # Every variable the playbook names is one it is given or one a task registers.
    named = set(re.findall(r"\b(cuda_\w+|keyring_\w+|apt_\w+)\b", CUDA_PLAYBOOK))
    assert named <= set(values) | {"keyring"}, named - set(values)


def test_the_recap_counts_hosts_that_finished_and_those_that_changed() -> None:
    hosts = {"node1-200", "node1-201", "node2-200", "node2-201"}
    ok, changed, detail = parse_recap(RECAP + "fatal: [node1-201]: FAILED! => {}\n", hosts)
    assert (ok, changed) == (2, 1)  # a failed or unreachable host is neither
    assert detail["recap_hosts"] == 4 and detail["tasks_changed"] == 4
    assert detail["errors"] == ["fatal: [node1-201]: FAILED! => {}"]
    assert parse_recap(RECAP, {"node1-200"})[:2] == (1, 1)  # hosts outside the bed are not counted


def _row(run: str, ok: int, changed: int, returncode: int = 0, **detail: object) -> Row:
    return Row(run, 2, ok, changed, returncode, 1.0, 0.5, 1024, 2048, 1.0, 10, 1, 10, detail=dict(detail))


def test_a_run_that_did_not_do_the_work_is_a_problem() -> None:
    good = [_row("fleetfix-1st", 2, 2, nvcc_missing=[]), _row("fleetfix-2nd", 2, 0),
            _row("ansible-1st", 2, 2, nvcc_missing=[]), _row("ansible-2nd", 2, 0)]
    assert problems(good) == []
    bad = [_row("fleetfix-1st", 2, 2, nvcc_missing=["node1/201"]), _row("fleetfix-2nd", 2, 1),
           _row("ansible-1st", 1, 1, returncode=2, nvcc_missing=[]), _row("ansible-2nd", 2, 0)]
    assert problems(bad) == [
        "fleetfix-1st: no nvcc in ['node1/201']",
        "fleetfix-2nd: 1 changed on the second run",
        "ansible-1st: exit 2, 1/2 ok",
        "ansible-1st: 1/2 changed",
    ]
