"""Real LXC containers (tests/lab/lxcreal.py): the node's `pct exec` is real `lxc-attach`, as on PVE.

The suite the namespace stand-in runs elsewhere, through real LXC: probe, cuda-toolkit apply (twice, the
second changing nothing), exec, snapshot and rollback; and what real lxc-attach does differently from the
stand-in (docs/testbed.md, "Real guests").
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import in_ci
from tests.e2e.conftest import CliResult, host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.e2e.test_snapshots import FAILING
from tests.lab import lxcreal
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


def failed_steps(result: CliResult) -> str:
    """What an apply's --json says went wrong: each failed step's name, duration and output tails."""
    try:
        targets = result.json()["targets"]
    except ValueError:
        return result.stdout[-2000:] + result.stderr[-2000:]
    lines = []
    for target in targets:
        for step in target.get("steps", []):
            if step.get("status") == "failed":
                lines.append(f"{target['target']}: {step['name']} ({step.get('duration')} s): "
                             f"{step.get('reason')} | {step.get('stdout', '')[-800:]} | "
                             f"{step.get('stderr', '')[-800:]}")
    return "\n".join(lines) or result.stdout[-2000:] + result.stderr[-2000:]


@pytest.fixture(autouse=True)
def _needs_lxc() -> None:
    problem = lxcreal.unavailable_reason()
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and real LXC cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


@pytest.fixture
def real_ct(make_ct: Callable[..., Container]) -> Callable[..., Container]:
    return lambda **options: make_ct(real_lxc=True, **options)


def in_ct(lab: Lab, ct: Container, script: str, input: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """`pct exec CT -- sh -c SCRIPT` over the node's real sshd."""
    return lab.ssh(None, ["pct", "exec", str(ct.ctid), "--", "sh", "-c", script], input=input)


def test_pct_exec_enters_the_container_through_lxc_attach(
    lab: Lab, real_ct: Callable[..., Container],
) -> None:
    ct = real_ct()
    assert ct.real_lxc and ct.running
    # Only lxc-attach enters LXC's cgroup namespace (nsenter in the stand-in never does): the command's
    # namespace is the container init's, and not this machine's.
    pid1 = ct.pid1
    inside = in_ct(lab, ct, "readlink /proc/self/ns/cgroup; cat /proc/1/cmdline | tr '\\0' ' '")
    assert inside.returncode == 0, inside.stderr
    namespace, init = inside.stdout.decode().splitlines()
    assert namespace == os.readlink(f"/proc/{pid1}/ns/cgroup") != os.readlink("/proc/self/ns/cgroup")
    assert init.strip() == f"/bin/sh /{lxcreal.INIT_PATH}"

    # PVE's environment: the caller's, PATH forced by pct, container=lxc from lxc-attach, no SSL_CERT_*;
    # --keep-env 0 is lxc-attach's --clear-env: its own PATH and container=lxc only.
    kept = lab.ssh(None, f"SSL_CERT_FILE=/x LC_PROBE=kept pct exec {ct.ctid} -- env")
    env = dict(line.split("=", 1) for line in kept.stdout.decode().splitlines() if "=" in line)
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert (env["container"], env["LC_PROBE"]) == ("lxc", "kept")
    assert "SSL_CERT_FILE" not in env and not any(key.startswith("FLEETFIX_LAB_") for key in env)
    cleared = lab.ssh(None, ["pct", "exec", str(ct.ctid), "--keep-env", "0", "--", "env"])
    assert sorted(cleared.stdout.decode().splitlines()) == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=lxc",
    ]


def test_what_real_lxc_attach_does_differently_from_the_stand_in(
    lab: Lab, real_ct: Callable[..., Container], make_ct: Callable[..., Container],
) -> None:
    real, stand_in = real_ct(), make_ct()
    # stdin: both pass it through and give EOF at its end.
    for ct in (real, stand_in):
        fed = in_ct(lab, ct, "cat; echo eof=$?", input=b"data\n")
        assert fed.stdout == b"data\neof=0\n"
    # A command killed by a signal: lxc-attach exits 128+N (so ssh reports an exit status), while the
    # stand-in dies of the signal itself (ssh's exit-signal: the client exits 255).
    assert in_ct(lab, real, "kill -TERM $$").returncode == 143
    assert in_ct(lab, real, "kill -KILL $$").returncode == 137
    assert in_ct(lab, stand_in, "kill -TERM $$").returncode == 255
    # /proc: LXC's proc:mixed mounts /proc/sys read-only (only /proc/sys/net writable).
    probe = "touch /proc/sys/kernel/hostname 2>/dev/null && echo writable || echo read-only"
    assert in_ct(lab, real, probe).stdout == b"read-only\n"
    # A terminal: lxc-attach opens a pty inside the container; the stand-in passes the node's pty, which
    # the container's own /dev/pts does not hold.
    for ct, expected in ((real, rb"^/dev/pts/\d+$"), (stand_in, rb"^not a tty$")):
        argv = lab.ssh_argv(None, ["pct", "exec", str(ct.ctid), "--", "tty"])
        argv.insert(1, "-tt")
        tty = subprocess.run(argv, capture_output=True, timeout=60)
        assert re.match(expected, tty.stdout.strip()), tty


def test_probe_names_the_chain_and_cuda_toolkit_fixes_it_twice_through_lxc_attach(
    lab: Lab, real_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    # Two containers: the probe's node batch (pctbatch.pl) forks `pct exec` for each, through lxc-attach.
    first, second = real_ct(setup=problem_case), real_ct(setup=problem_case)
    targets = host_args(lab, None, first.ctid, second.ctid)
    probed = run_cli("probe", *targets, "--json")
    for report in probed.json()["targets"]:
        assert report["status"] == "ok", report
        assert {f["code"] for f in report["findings"]} >= TOOLKIT_CODES, report["findings"]

    state = ["--state-dir", str(tmp_path / "state")]
    mirror = ["--var", f"cuda_repo_base={apt_repo.base_url}"]
    before = tree_digest(first.upper_dir)
    checked = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--check", "--json")
    assert checked.exit_code == 0, failed_steps(checked)
    assert tree_digest(first.upper_dir) == before, "check mode changed the container"

    applied = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json")
    assert applied.exit_code == 0, failed_steps(applied)
    assert {t["status"] for t in applied.json()["targets"]} == {"changed"}
    for ct in (first, second):
        nvcc = in_ct(lab, ct, "/usr/local/cuda-12.8/bin/nvcc --version")
        assert b"release 12.8, V12.8.93" in nvcc.stdout, nvcc

    again = run_cli("apply", PLAYBOOK, *targets, *mirror, *state, "--json")
    assert again.exit_code == 0, failed_steps(again)
    for target in again.json()["targets"]:
        assert (target["status"], target["counts"]["changed"]) == ("ok", 0), target
    reprobed = run_cli("probe", *targets, "--json").json()["targets"]
    for report in reprobed:
        assert not TOOLKIT_CODES & {f["code"] for f in report["findings"]}, report["findings"]


def test_exec_exit_codes_and_a_stopped_container(lab: Lab, real_ct: Callable[..., Container]) -> None:
    running, stopped = real_ct(), real_ct(running=False)
    script = "echo out; echo err >&2; exit 7"
    result = run_cli("exec", *host_args(lab, None, running.ctid), "--json", "--", "sh", "-c", script)
    assert result.exit_code == 1, result.stdout + result.stderr
    [record] = result.json()
    assert (record["exit_code"], record["stdout"], record["stderr"]) == (7, "out\n", "err\n")

    both = run_cli("exec", *host_args(lab, None, running.ctid, stopped.ctid), "--", "hostname")
    assert both.exit_code == 4
    assert f"CT {stopped.ctid} on" in both.stdout and "stopped" in both.stdout
    assert f"/{running.ctid} exit 0" in both.stdout


def test_failed_apply_is_rolled_back_on_a_real_lxc_container(
    lab: Lab, real_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = real_ct(setup="echo before > /etc/lab-state")
    before = tree_digest(ct.upper_dir)
    book = tmp_path / "book.yaml"
    book.write_text(FAILING)
    state = ["--state-dir", str(tmp_path / "state")]
    result = run_cli("apply", str(book), *host_args(lab, None, ct.ctid), *state,
                     "--snapshot", "--rollback-on-failure", "--json")
    assert result.exit_code == 1, result.stdout + result.stderr
    [target] = result.json()["targets"]
    assert target["snapshot"]["rolled_back"] is True, target["snapshot"]
    # Rolled back (LXC stopped the container, the upper dir was restored) and started again by LXC.
    assert ct.running and ct.real_lxc
    assert tree_digest(ct.upper_dir) == before
    assert in_ct(lab, ct, "cat /etc/lab-state; test -e /etc/fleetfix-marker || echo gone").stdout == (
        b"before\ngone\n"
    )
