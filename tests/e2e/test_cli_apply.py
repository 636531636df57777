"""Issue 4's acceptance through the real CLI: cuda-toolkit.yaml fixes the problem case on the test bed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetfix.playbook.records import list_runs, load_run
from tests.e2e.conftest import host_args, run_cli, write_inventory
from tests.e2e.scenarios import problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.httpproxy import HttpProxy

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


def nvcc_version(ct: Container) -> str:
    return ct.sh("/usr/local/cuda-12.8/bin/nvcc --version", check=False).stdout.decode()


def test_apply_fixes_two_containers_check_changes_nothing_and_rerun_is_a_noop(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    first, second = make_ct(setup=problem_case), make_ct(setup=problem_case)
    # The problem as the engineer met it: the obvious install fails.
    attempt = first.sh("apt-get install -y cuda-nvcc-12-8 cuda-cudart-dev-12-8", check=False)
    assert attempt.returncode == 100
    assert "E: Unable to locate package cuda-nvcc-12-8" in attempt.stderr.decode()

    targets = host_args(lab, None, first.ctid, second.ctid)
    state = ["--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={apt_repo.base_url}"]

    before = tree_digest(first.upper_dir)
    checked = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--check", "--json")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert {t["status"] for t in checked.json()["targets"]} == {"would-change"}
    assert tree_digest(first.upper_dir) == before, "check mode changed the container"

    applied = run_cli("apply", PLAYBOOK, *targets, *mirror, *state)
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert "PLAY RECAP" in applied.stdout
    for ct in (first, second):
        assert "release 12.8, V12.8.93" in nvcc_version(ct)
        installed = ct.sh("dpkg-query -W -f='${Package}\\n'", check=False).stdout.decode().split()
        assert "cuda-nvcc-12-8" in installed and "cuda-cudart-dev-12-8" in installed
        assert not [p for p in installed if p.startswith(("cuda-drivers", "nvidia-driver"))]

    probed = run_cli("probe", *targets, "--json").json()["targets"]
    for report in probed:
        assert not TOOLKIT_CODES & {f["code"] for f in report["findings"]}, report["findings"]

    execs = lab.node(None).pct_exec_count()
    again = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json")
    assert again.exit_code == 0
    for target in again.json()["targets"]:
        assert target["counts"]["changed"] == 0, target
        assert target["status"] == "ok"
        # Nothing would be installed, so the repository's index is not read (docs/playbooks.md).
        guard = next(s for s in target["steps"] if s["name"] == "NVIDIA apt repository serves this CUDA")
        assert guard["reason"].startswith("nothing to install: "), guard
        # Every step but the first is known from the facts read in the same command (its facts_check);
        # only "cuda version known", which has none, runs its check.
        known = [s["name"] for s in target["steps"] if s["reason"].endswith(" (from the facts)")]
        assert known == [s["name"] for s in target["steps"]][1:], target["steps"]
    # Per container one `pct exec`: its facts, then the check the facts cannot answer, in the same
    # command (not one `pct exec` for the facts and one per check).
    assert lab.node(None).pct_exec_count() - execs == 2 * 1
    last = load_run(tmp_path / "state", list_runs(tmp_path / "state")[-1].run_id)
    batches = [e for e in last.events if e.get("kind") == "check-batch"]
    assert [(e["with_facts"], e["ran"], e["error"]) for e in batches] == [(True, 1, None)] * 2, batches


def test_a_failing_container_is_reported_and_the_other_still_fixed(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    broken, good = make_ct(setup=problem_case), make_ct(setup=problem_case)
    missing_mirror = apt_repo.base_url + "/not-mirrored"  # the server answers 404 below it
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [
        (broken.ctid, {"cuda_repo_base": missing_mirror}),
        (good.ctid, {"cuda_repo_base": apt_repo.base_url}),
    ])
    state_dir = tmp_path / "state"
    result = run_cli("apply", PLAYBOOK, "-i", str(inventory), "--state-dir", str(state_dir), "--json")
    assert result.exit_code == 1, result.stdout + result.stderr
    by_ctid = {t["target"].rsplit("/", 1)[-1]: t for t in result.json()["targets"]}
    failed, fixed = by_ctid[str(broken.ctid)], by_ctid[str(good.ctid)]
    assert failed["status"] == "failed"
    failing_step = next(s for s in failed["steps"] if s["status"] == "failed")
    assert "404" in failing_step["stdout"] + failing_step["stderr"]
    assert "not-mirrored" in failing_step["stdout"] + failing_step["stderr"]
    assert fixed["status"] == "changed"
    assert "release 12.8" in nvcc_version(good)

    runs = run_cli("runs", "list", "--state-dir", str(state_dir), "--json").json()
    assert len(runs) == 1 and runs[0]["status"] == "failed"
    detail = run_cli("runs", "show", runs[0]["run_id"], "--state-dir", str(state_dir), "--json").json()
    recorded = detail["targets"][failed["target"]]["steps"]
    assert [s["name"] for s in recorded] == [s["name"] for s in failed["steps"]]
    recorded_failure = next(s for s in recorded if s["status"] == "failed")
    assert any("404" in script["stdout"] + script["stderr"] for script in recorded_failure["scripts"])
    assert detail["targets"][fixed["target"]]["status"] == "changed"


def test_behind_apts_proxy_the_keyring_and_the_index_come_through_it(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    """A fleet whose only way out is the proxy apt is configured with: the repository is named by a host
    the container cannot reach directly (/etc/hosts points it at a dead loopback address, so no DNS query
    leaves the machine); the pre-flight index read, the keyring download and apt all go through the
    proxy."""
    upstream = apt_repo.base_url.split("/compute/")[0]
    proxy = HttpProxy(upstream).start()
    try:
        def behind_proxy(ct: Container) -> None:
            problem_case(ct)
            ct.sh("echo '127.0.0.9 nvidia-mirror.invalid' >> /etc/hosts\n"
                  f"echo 'Acquire::http::Proxy \"{proxy.url}\";' > /etc/apt/apt.conf.d/90proxy\n")
        ct = make_ct(setup=behind_proxy)
        direct = ct.sh("python3 -c 'import urllib.request; urllib.request.urlopen("
                       "\"http://nvidia-mirror.invalid/\", timeout=5)'", check=False)
        assert direct.returncode != 0   # no way there but the proxy
        base = "http://nvidia-mirror.invalid/compute/cuda/repos"
        result = run_cli("apply", PLAYBOOK, *host_args(lab, None, ct.ctid), "--var", f"cuda_repo_base={base}",
                         "--state-dir", str(tmp_path / "state"), "--json")
        assert result.exit_code == 0, result.stdout + result.stderr
        assert "release 12.8, V12.8.93" in nvcc_version(ct)
        seen = proxy.seen
        assert f"GET {base}/debian12/x86_64/Packages.gz" in seen                       # the pre-flight
        assert f"GET {base}/debian12/x86_64/cuda-keyring_1.1-1_all.deb" in seen        # the keyring
        assert any(line.endswith("/debian12/x86_64/InRelease") for line in seen)       # apt itself
    finally:
        proxy.stop()



def test_a_failed_steps_one_line_reason_is_the_error_not_the_outputs_last_line(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path, trixie: Path,
) -> None:
    """Real pip and apt, failing as they do on a fleet: the reason printed for the failed target is their
    error line, not the output's last line (pip's PEP 668 refusal ends in a `hint:`)."""
    bookworm, trixie_ct = make_ct(), make_ct(template=trixie)
    state = ["--state-dir", str(tmp_path / "state")]
    pip_book = tmp_path / "pip.yaml"
    pip_book.write_text("name: pip\nsteps:\n  - name: install x\n"
                        "    apply: python3 -m pip install fleetfix-x\n")
    pip = run_cli("apply", str(pip_book), *host_args(lab, None, bookworm.ctid), *state, "--json")
    assert pip.exit_code == 1, pip.stdout + pip.stderr
    [step] = pip.json()["targets"][0]["steps"]
    assert step["stderr"].rstrip().splitlines()[-1] == "hint: See PEP 668 for the detailed specification."
    assert step["reason"] == "apply failed: exit 1: error: externally-managed-environment"
    # The recap as printed, and `runs show` of the run.
    recap = run_cli("apply", str(pip_book), *host_args(lab, None, bookworm.ctid), *state).stdout
    assert f"failed {pip.json()['targets'][0]['target']}: step 'install x': apply failed: exit 1: " \
           "error: externally-managed-environment\n" in recap, recap
    shown = run_cli("runs", "show", "last", *state).stdout
    assert "apply failed: exit 1: error: externally-managed-environment" in shown, shown

    apt_book = tmp_path / "apt.yaml"
    apt_book.write_text("name: apt\nsteps:\n  - name: install x\n"
                        "    apply: apt install -y fleetfix-no-such-package\n")
    apt = run_cli("apply", str(apt_book), *host_args(lab, None, trixie_ct.ctid), *state)
    assert apt.exit_code == 1, apt.stdout + apt.stderr
    # apt 3 (Debian 13) prints a warning about its CLI before its error, and `Error:`, not `E:`.
    assert ": step 'install x': apply failed: exit 100: Error: Unable to locate package " \
           "fleetfix-no-such-package\n" in apt.stdout, apt.stdout
