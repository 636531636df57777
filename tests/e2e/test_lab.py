"""The test bed itself, proven with plain OpenSSH: sshd node -> `pct` stand-in -> overlay container.

These tests say what the other e2e tests may rely on: real sshd, pct semantics (docs/DOMAIN.md 5.2), real
apt/dpkg/python3 inside hermetic containers whose writes land in their upper dir only, and a teardown that
leaves no process or mount behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import sshd
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.torch_stub import install_causal_conv1d, install_fla, install_torch
from tests.waiting import wait_for

MakeCt = Callable[..., Container]


def pct(
    lab: Lab, *args: str, input: bytes = b"", node: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    return lab.ssh(node, ["pct", *args], input=input)


def text(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode()


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


# --- pct exec ---------------------------------------------------------------------------------------------
def test_pct_exec_prints_the_containers_own_file(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200, setup="printf 'PRETTY_NAME=\"CT two hundred\"\\nID=debian\\n' > /etc/os-release")
    result = pct(lab, "exec", "200", "--", "cat", "/etc/os-release")
    assert result.returncode == 0, err(result)
    assert text(result) == 'PRETTY_NAME="CT two hundred"\nID=debian\n'
    assert "CT two hundred" not in Path("/etc/os-release").read_text()
    # /etc/os-release is a symlink to ../usr/lib/os-release: the write landed there, in the upper dir.
    assert (ct.upper_dir / "usr/lib/os-release").read_text() == text(result)


def test_writes_land_in_the_upper_dir_only(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200)
    host_issue = Path("/etc/issue").read_bytes()
    result = pct(
        lab, "exec", "200", "--", "sh", "-c", "echo lab-was-here >> /etc/issue && echo new > /etc/lab-new"
    )
    assert result.returncode == 0, err(result)
    assert Path("/etc/issue").read_bytes() == host_issue
    assert not Path("/etc/lab-new").exists()
    assert (ct.upper_dir / "etc/issue").read_bytes() == host_issue + b"lab-was-here\n"
    assert (ct.upper_dir / "etc/lab-new").read_text() == "new\n"


@pytest.mark.parametrize("code", [0, 1, 2, 7, 100, 254])
def test_exit_codes_pass_through(lab: Lab, make_ct: MakeCt, code: int) -> None:
    make_ct(200)
    assert pct(lab, "exec", "200", "--", "sh", "-c", f"exit {code}").returncode == code


def test_a_command_killed_by_a_signal_kills_pct_with_it(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200)
    # Seen from the node's shell: pct died of SIGTERM (143), as lxc-attach would report it.
    result = lab.ssh(None, "pct exec 200 -- sh -c 'kill -TERM $$'; echo \"status=$?\"")
    assert text(result).strip() == "status=143"


def test_one_megabyte_of_stdin_passes_through_verbatim(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200)
    data = os.urandom(1 << 20)
    result = pct(lab, "exec", "200", "--", "sha256sum", input=data)
    assert result.returncode == 0, err(result)
    assert text(result).split()[0] == hashlib.sha256(data).hexdigest()
    echoed = pct(lab, "exec", "200", "--", "cat", input=data)
    assert echoed.stdout == data


def test_exec_environment_is_pves(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200)
    result = lab.ssh(None, "SSL_CERT_FILE=/x LANG=C.UTF-8 FOO=bar pct exec 200 -- env")
    env = dict(line.split("=", 1) for line in text(result).splitlines() if "=" in line)
    assert env["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert env["container"] == "lxc"
    assert env["FOO"] == "bar" and env["LANG"] == "C.UTF-8"  # the caller's environment is kept
    assert "SSL_CERT_FILE" not in env
    assert not [key for key in env if key.startswith("FLEETFIX_LAB")]
    cleared = pct(lab, "exec", "200", "--keep-env", "0", "--", "env")
    assert sorted(text(cleared).split()) == sorted(
        ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=lxc"]
    )


def test_stopped_unknown_and_empty_exec_fail_like_pct(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(201, running=False)
    stopped = pct(lab, "exec", "201", "--", "true")
    assert (stopped.returncode, err(stopped)) == (255, "container '201' not running!\n")
    unknown = pct(lab, "exec", "999", "--", "true")
    assert (unknown.returncode, err(unknown)) == (
        255,
        "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n",
    )
    make_ct(200)
    empty = pct(lab, "exec", "200")
    assert (empty.returncode, err(empty)) == (255, "missing command\n")


def test_closing_the_ssh_channel_kills_the_container_command(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200)
    client = subprocess.Popen(
        lab.ssh_argv(None, ["pct", "exec", "200", "--", "sleep", "1234"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def sleepers() -> str:
        return ct.exec(["pgrep", "-f", "sleep 1234"]).stdout.decode()

    wait_for(sleepers, 10, "the command to start")
    client.kill()
    client.wait()
    wait_for(lambda: not sleepers(), 10, "the container command to end with its SSH channel")


# --- list / status / start / stop ---------------------------------------------------------------------
def test_pct_list_prints_nothing_without_containers(lab_factory: Callable[..., Lab]) -> None:
    bed = lab_factory()
    result = pct(bed, "list")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_pct_list_status_start_stop(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(201, name="beta", running=False)
    make_ct(200, name="alpha")
    row = "%-10s %-10s %-12s %-20s\n"
    expected = row % ("VMID", "Status", "Lock", "Name") + row % (200, "running", "", "alpha")
    expected += row % (201, "stopped", "", "beta")
    assert text(pct(lab, "list")) == expected
    assert text(pct(lab, "status", "201")) == "status: stopped\n"
    assert pct(lab, "start", "201").returncode == 0
    assert text(pct(lab, "status", "201")) == "status: running\n"
    assert text(pct(lab, "exec", "201", "--", "hostname")) == "beta\n"
    again = pct(lab, "start", "201")
    assert (again.returncode, err(again)) == (255, "CT 201 already running\n")
    assert pct(lab, "stop", "201").returncode == 0
    assert text(pct(lab, "status", "201")) == "status: stopped\n"
    assert pct(lab, "status", "999").returncode == 255


def test_every_pct_call_is_logged(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200)
    node = lab.node()
    before = node.pct_exec_count()
    pct(lab, "exec", "200", "--", "true")
    pct(lab, "status", "200")
    assert node.pct_exec_count() == before + 1
    assert node.pct_calls()[-2:] == [["exec", "200", "--", "true"], ["status", "200"]]


# --- hermetic containers with real tools -------------------------------------------------------------
def test_containers_are_hermetic(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200)
    script = (
        "ls -d /usr/local/cuda* 2>/dev/null; ls -A /etc/apt/sources.list.d; cat /etc/apt/sources.list;"
        " ls /etc/ld.so.conf.d | grep -i cuda; ls -A /root; ls -A /tmp; ls -d /work 2>/dev/null; true"
    )
    result = pct(lab, "exec", "200", "--", "sh", "-c", script)
    assert text(result).split() == [".bashrc", ".profile"]
    if Path("/usr/local/cuda-13.0").exists():  # hidden by a whiteout: the host keeps its files
        assert (ct.upper_dir / "usr/local/cuda-13.0").is_char_device()
        assert Path("/usr/local/cuda-13.0").is_dir()


def test_real_apt_and_dpkg_run_inside(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200)
    install = pct(lab, "exec", "200", "--", "apt-get", "install", "-y", "cuda-nvcc-12-8")
    assert install.returncode == 100
    assert "E: Unable to locate package cuda-nvcc-12-8" in err(install)
    update = pct(lab, "exec", "200", "--", "apt-get", "update")  # no sources: offline and clean
    assert update.returncode == 0, err(update)
    listed = pct(lab, "exec", "200", "--", "dpkg-query", "-W", "-f", "${Package} ${Status}\\n", "dpkg")
    assert text(listed) == "dpkg install ok installed\n"
    assert re.search(r"^ii +apt +", text(pct(lab, "exec", "200", "--", "dpkg", "-l", "apt")), re.M)
    # PATH is /sbin:/bin:...: with Debian's merged /usr that finds /bin/python3 = Debian's own python.
    python = pct(
        lab, "exec", "200", "--", "python3", "-c", "import sys; print(sys.prefix, sys.version_info[:2])"
    )
    assert text(python) == "/usr (3, 11)\n"


def test_two_containers_are_separate(lab: Lab, make_ct: MakeCt) -> None:
    one, two = make_ct(200, name="one"), make_ct(201, name="two")
    assert text(pct(lab, "exec", "200", "--", "hostname")) == "one\n"
    assert text(pct(lab, "exec", "201", "--", "hostname")) == "two\n"
    assert text(lab.ssh(None, "hostname")) == "pve1\n"
    # Each has its own PID namespace whose PID 1 is its own init.
    assert one.pid1 != two.pid1
    for ctid in ("200", "201"):
        assert "trap" in text(pct(lab, "exec", ctid, "--", "cat", "/proc/1/cmdline"))
    pct(lab, "exec", "200", "--", "touch", "/only-in-200")
    assert pct(lab, "exec", "201", "--", "test", "-e", "/only-in-200").returncode == 1


def test_upper_dir_digest_sees_reads_as_no_change_and_writes_as_change(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200)
    before = tree_digest(ct.upper_dir)
    for command in (["cat", "/etc/os-release"], ["dpkg", "-l"], ["python3", "-c", "import json"]):
        assert pct(lab, "exec", "200", "--", *command).returncode == 0
    assert tree_digest(ct.upper_dir) == before
    pct(lab, "exec", "200", "--", "chmod", "600", "/etc/hostname")
    changed = tree_digest(ct.upper_dir)
    assert {path for path in changed if changed[path] != before.get(path)} == {"etc/hostname"}


# --- snapshots, push/pull, pvesh -----------------------------------------------------------------------
def test_snapshot_rollback_restores_the_upper_dir(lab: Lab, make_ct: MakeCt) -> None:
    ct = make_ct(200, setup="echo v1 > /etc/lab-state")
    before = tree_digest(ct.upper_dir)
    assert pct(lab, "snapshot", "200", "fleetfix-20260101").returncode == 0
    pct(lab, "exec", "200", "--", "sh", "-c", "echo v2 > /etc/lab-state; rm -rf /usr/share/doc; touch /new")
    assert tree_digest(ct.upper_dir) != before
    assert pct(lab, "rollback", "200", "fleetfix-20260101").returncode == 0
    assert text(pct(lab, "status", "200")) == "status: stopped\n"  # rollback stops a running CT
    assert tree_digest(ct.upper_dir) == before
    assert pct(lab, "rollback", "200", "fleetfix-20260101", "--start", "1").returncode == 0
    assert text(pct(lab, "exec", "200", "--", "cat", "/etc/lab-state")) == "v1\n"
    listing = text(pct(lab, "listsnapshot", "200")).splitlines()
    assert re.fullmatch(r"`-> fleetfix-20260101 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +no-description", listing[0])
    assert re.fullmatch(r" `-> current +You are here!", listing[1])
    assert pct(lab, "delsnapshot", "200", "fleetfix-20260101").returncode == 0
    assert text(pct(lab, "listsnapshot", "200")).split() == ["`->", "current", "You", "are", "here!"]
    missing = pct(lab, "rollback", "200", "fleetfix-20260101")
    assert (missing.returncode, err(missing)) == (255, "snapshot 'fleetfix-20260101' does not exist\n")


@pytest.mark.parametrize("name", ["1starts-with-digit", "has.dot", "x" * 41, "a"])
def test_snapshot_names_follow_pve_rules(lab: Lab, make_ct: MakeCt, name: str) -> None:
    make_ct(200)
    result = pct(lab, "snapshot", "200", name)
    assert result.returncode == 255
    assert f"invalid configuration ID '{name}'" in err(result)


def test_push_and_pull_need_a_running_ct(lab: Lab, make_ct: MakeCt, tmp_path: Path) -> None:
    make_ct(200)
    make_ct(201, running=False)
    node_file = tmp_path / "payload"  # the node shares this machine's filesystem
    node_file.write_bytes(b"pushed\n")
    assert pct(lab, "push", "200", str(node_file), "/root/payload", "--perms", "600").returncode == 0
    assert text(pct(lab, "exec", "200", "--", "stat", "-c", "%a %s", "/root/payload")) == "600 7\n"
    pulled = tmp_path / "pulled"
    assert pct(lab, "pull", "200", "/etc/hostname", str(pulled)).returncode == 0
    assert pulled.read_text() == "ct200\n"
    refused = pct(lab, "push", "201", str(node_file), "/root/payload")
    assert (refused.returncode, err(refused)) == (255, "can only push files to a running CT\n")



# --- template, clone, destroy (pve-container API2/LXC.pm: template, clone_vm, destroy_vm) ----------------
def test_a_template_clones_linked_by_default_and_its_clone_is_destroyed(lab: Lab, make_ct: MakeCt) -> None:
    template = make_ct(9000, setup="echo from-template > /etc/lab-state")
    assert pct(lab, "stop", "9000").returncode == 0
    assert pct(lab, "template", "9000").returncode == 0
    assert "template: 1" in text(pct(lab, "config", "9000")).splitlines()
    refused = pct(lab, "start", "9000")
    assert (refused.returncode, err(refused)) == (255, "you can't start a CT if it's a template\n")
    storage = pct(lab, "clone", "9000", "9001", "--storage", "local-lvm")
    assert (storage.returncode, err(storage)) == (255, "parameter 'storage' not allowed for linked clones\n")
    assert pct(lab, "clone", "9000", "9001", "--hostname", "fleetfix-build-9001").returncode == 0
    try:
        config = text(pct(lab, "config", "9001")).splitlines()
        assert "hostname: fleetfix-build-9001" in config
        assert not any(line.startswith("template:") for line in config)
        taken = pct(lab, "clone", "9000", "9001")
        node_name = lab.node().name
        assert (taken.returncode, err(taken)) == (255, f"CT 9001 already exists on node '{node_name}'\n")
        assert pct(lab, "start", "9001").returncode == 0
        assert text(pct(lab, "exec", "9001", "--", "cat", "/etc/lab-state")) == "from-template\n"
        assert text(pct(lab, "exec", "9001", "--", "hostname")) == "fleetfix-build-9001\n"
        pct(lab, "exec", "9001", "--", "sh", "-c", "echo clone-wrote > /etc/lab-state")
        # The template's tree is untouched by what its clone writes.
        assert (template.upper_dir / "etc/lab-state").read_text() == "from-template\n"
        running = pct(lab, "destroy", "9001")
        expected = "unable to destroy CT 9001 - container is running\n"
        assert (running.returncode, err(running)) == (255, expected)
        assert pct(lab, "stop", "9001").returncode == 0
        assert pct(lab, "destroy", "9001").returncode == 0
        assert "9001" not in text(pct(lab, "list"))
        gone = pct(lab, "status", "9001")
        assert gone.returncode == 255 and "does not exist" in err(gone)
    finally:
        lab.node().state.container(9001).destroy()


def test_a_plain_ct_clones_full_and_storage_applies(lab: Lab, make_ct: MakeCt) -> None:
    make_ct(200, setup="echo v1 > /etc/lab-state")
    running = pct(lab, "clone", "200", "201")
    assert (running.returncode, err(running)) == (
        255, "Full clone of a running container is only possible from a snapshot\n")
    assert pct(lab, "stop", "200").returncode == 0
    assert pct(lab, "clone", "200", "201", "--storage", "fast").returncode == 0
    try:
        clone = lab.node().state.container(201)
        assert (clone.upper_dir / "etc/lab-state").read_text() == "v1\n"
        assert text(pct(lab, "config", "201")).count("rootfs: fast:vm-201-disk-0") == 1
        assert pct(lab, "destroy", "201").returncode == 0
    finally:
        lab.node().state.container(201).destroy()

def test_pvesh_lists_containers_as_json(lab: Lab, make_ct: MakeCt) -> None:
    import json

    make_ct(200, name="gpu-a", tags=["gpu", "ml"])
    make_ct(201, name="idle", running=False)
    result = lab.ssh(None, ["pvesh", "get", "/nodes/pve1/lxc", "--output-format", "json"])
    entries = {entry["vmid"]: entry for entry in json.loads(result.stdout)}
    assert {vmid: (entry["name"], entry["status"], entry.get("tags")) for vmid, entry in entries.items()} == {
        200: ("gpu-a", "running", "gpu;ml"),
        201: ("idle", "stopped", None),
    }


# --- torch stand-in ---------------------------------------------------------------------------------------
def test_torch_stub_is_seen_by_python_and_importlib_metadata(
    lab: Lab, make_ct: MakeCt, stub_cache: Path
) -> None:
    def setup(ct: Container) -> None:
        install_torch(ct)
        install_fla(ct)
        install_causal_conv1d(ct, compiled=False, cache_dir=stub_cache)

    make_ct(200, setup=setup)
    probe = (
        "import importlib.metadata as m, torch\n"
        "print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), m.version('torch'),"
        " m.version('flash-linear-attention'))\n"
        "import fla\n"
        "try:\n    import causal_conv1d\nexcept ImportError as e:\n    print(type(e).__name__, e.name)\n"
    )
    result = pct(lab, "exec", "200", "--", "python3", "-c", probe)
    assert result.returncode == 0, err(result)
    assert text(result).splitlines() == [
        "2.11.0+cu128 12.8 False 2.11.0+cu128 0.6.0",
        "ModuleNotFoundError causal_conv1d_cuda",
    ]
    assert pct(lab, "exec", "200", "--", "python3", "-c", "import torch").returncode == 0


def test_compiled_causal_conv1d_imports(lab: Lab, make_ct: MakeCt, stub_cache: Path) -> None:
    ct = make_ct(200, setup=lambda ct: install_causal_conv1d(ct, compiled=True, cache_dir=stub_cache))
    result = ct.exec(
        ["python3", "-c", "import causal_conv1d, causal_conv1d_cuda; print(causal_conv1d_cuda.__file__)"]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip().endswith("causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so")


# --- speed and teardown -----------------------------------------------------------------------------------
def _mount_table() -> str:
    return Path("/proc/self/mountinfo").read_text()


def test_a_lab_starts_fast_and_leaves_nothing_behind(tmp_path: Path) -> None:
    started = time.monotonic()
    bed = Lab(tmp_path / "bed", nodes=2)
    first = bed.add_container("pve1", 200)
    bed.add_container("pve2", 200)
    elapsed = time.monotonic() - started
    # ~0.5 s here; the bound only catches a bed that waits on something (its speed is not a test's business).
    assert elapsed < 15, f"2 nodes + 2 containers took {elapsed:.2f}s"
    # A container started through `pct start` over SSH must be cleaned up too.
    bed.add_container("pve2", 201, running=False)
    assert pct(bed, "start", "201", node="pve2").returncode == 0
    assert pct(bed, "exec", "200", "--", "true", node="pve2").returncode == 0
    pids = [ct.pid1 for node in bed.nodes.values() for ct in node.state.containers()]
    pids += [node.ssh.process.pid for node in bed.nodes.values() if node.ssh.process]
    assert len([pid for pid in pids if pid]) == 5
    upper = str(first.upper_dir)
    bed.close()
    for pid in pids:
        assert pid is not None
        state = Path(f"/proc/{pid}/stat")
        assert not state.exists() or state.read_text().split(") ")[1].startswith("Z"), (
            f"pid {pid} still alive"
        )
    assert upper not in _mount_table()
    assert not (tmp_path / "bed").exists()


def test_a_node_whose_port_another_process_took_first_moves_to_another_port(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parallel test workers: free_port's answer can be bound by someone else before sshd binds it. A
    # connection to the port would then reach the wrong server; start_node must notice and move on.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        answers = iter([taken])
        real_free_port = sshd.free_port
        monkeypatch.setattr(sshd, "free_port", lambda address: next(answers, None) or real_free_port(address))
        node = sshd.start_node(tmp_path / "node", name="moved", authorized_keys=[lab.client_public_key])
        try:
            assert node.port != taken
            assert f"Server listening on 127.0.0.1 port {node.port}." in node.log_text()
            assert "Address already in use" in node.log_text()
            assert node.login_dir is None or node.login_dir.is_dir()  # kept through the retry
        finally:
            node.stop()


def test_a_nodes_var_tmp_is_its_own(lab: Lab) -> None:
    # fleetfix stages transfers there; a test counting what is left must not see another worker's.
    name = f"fleetfix-own-{uuid.uuid4().hex[:8]}"
    assert name in lab.ssh(None, f"touch /var/tmp/{name} && ls /var/tmp").stdout.decode().split()
    assert name in os.listdir(lab.node().ssh.var_tmp) and not os.path.exists(f"/var/tmp/{name}")
    os.unlink(lab.node().ssh.var_tmp / name)
