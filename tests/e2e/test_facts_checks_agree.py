"""cuda-toolkit.yaml's facts_check against its checks, on a real container in the states a fleet meets:
wherever the facts (the real probe's, over SSH and `pct exec`) say a step is in its desired state, its
check, run in the same container, passes. A facts_check is a sufficient condition, never more lenient
than its check (docs/playbooks.md, "Known from the facts"); where the facts cannot tell, the check runs.
Each state also says which steps the facts do know, so a facts_check that never says anything fails too."""

from __future__ import annotations

from collections.abc import Callable

from fleetfix.playbook import load_playbook
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import plan_target
from fleetfix.target import GuestRef, NodeRef, Target
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
ALL_STEPS = ["cuda version known", "NVIDIA apt repository serves this CUDA", "dpkg not interrupted",
             "no conflicting NVIDIA apt sources", "cuda-keyring installed",
             "keyring source points at cuda_repo_base", "apt index has the toolkit",
             "toolkit packages installed", "nvcc matches torch"]


def known_and_checked(lab: Lab, ct: Container, repo_base: str) -> list[tuple[str, bool, int]]:
    """Per step: whether the facts know it, and its check's exit status in the container now."""
    probed = run_cli("probe", *host_args(lab, None, ct.ctid), "--json")
    [report] = probed.json()["targets"]
    book = load_playbook(PLAYBOOK)
    target = Target(name=f"ct{ct.ctid}", node=NodeRef("pve", None), guest=GuestRef.lxc(ct.ctid))
    plan = plan_target([compile_playbook(b) for b in book.chain()], target, report["facts"],
                       {"cuda_repo_base": repo_base})
    rows = []
    for planned in plan.plays[-1].steps:
        assert planned.rendered is not None and planned.rendered.check is not None
        checked = ct.sh(planned.rendered.check, check=False)
        rows.append((planned.compiled.step.name, planned.known is not None, checked.returncode))
    return rows


def assert_agree(rows: list[tuple[str, bool, int]], known: list[str]) -> None:
    lenient = [(name, rc) for name, is_known, rc in rows if is_known and rc != 0]
    assert lenient == [], f"the facts say these are done, their checks do not: {lenient}"
    assert [name for name, is_known, _ in rows if is_known] == known


def test_where_the_facts_know_a_steps_state_its_check_passes(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo,
) -> None:
    ct = make_ct(setup=problem_case)
    url = apt_repo.base_url
    # The problem case: nothing there, so only what is true of any clean container is known.
    assert_agree(known_and_checked(lab, ct, url),
                 ["dpkg not interrupted", "no conflicting NVIDIA apt sources"])

    applied = run_cli("apply", PLAYBOOK, *host_args(lab, None, ct.ctid), "--var", f"cuda_repo_base={url}")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert_agree(known_and_checked(lab, ct, url), ALL_STEPS[1:])

    # Another mirror: the keyring's list does not name it, so neither the guard nor its source step is
    # known (and that step's check fails); the rest still is.
    rows = known_and_checked(lab, ct, "http://127.0.0.1:9/compute/cuda/repos")
    assert_agree(rows, [s for s in ALL_STEPS[2:] if s != "keyring source points at cuda_repo_base"])
    assert ("keyring source points at cuda_repo_base", False, 1) in rows

    # A held keyring is installed (dpkg: "hold ok installed"), for the facts and the checks alike.
    ct.sh("echo cuda-keyring hold | dpkg --set-selections")
    assert_agree(known_and_checked(lab, ct, url), ALL_STEPS[1:])
    ct.sh("echo cuda-keyring install | dpkg --set-selections")

    # A second NVIDIA entry (the hand-written kind), and a disabled deb822 stanza: both conflict.
    ct.write_file("/etc/apt/sources.list.d/cuda.list",
                  "deb https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n")
    rows = known_and_checked(lab, ct, url)
    assert_agree(rows, [s for s in ALL_STEPS[1:] if s != "no conflicting NVIDIA apt sources"])
    assert ("no conflicting NVIDIA apt sources", False, 1) in rows
    ct.sh("rm /etc/apt/sources.list.d/cuda.list")
    ct.write_file("/etc/apt/sources.list.d/nvidia.sources",
                  "Types: deb\nURIs: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/\n"
                  "Suites: /\nEnabled: no\n")
    assert_agree(known_and_checked(lab, ct, url),
                 [s for s in ALL_STEPS[1:] if s != "no conflicting NVIDIA apt sources"])
    ct.sh("rm /etc/apt/sources.list.d/nvidia.sources")

    # One toolkit package gone, and an interrupted dpkg: neither the packages nor the guard are known.
    ct.sh("dpkg -r --force-depends cuda-cccl-12-8 >/dev/null 2>&1")
    ct.sh("touch /var/lib/dpkg/updates/0001")
    rows = known_and_checked(lab, ct, url)
    assert_agree(rows, ["no conflicting NVIDIA apt sources", "cuda-keyring installed",
                        "keyring source points at cuda_repo_base", "apt index has the toolkit",
                        "nvcc matches torch"])
    failing = ("toolkit packages installed", "dpkg not interrupted")
    assert [rc for name, _, rc in rows if name in failing] == [1, 1]
