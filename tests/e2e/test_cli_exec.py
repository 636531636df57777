"""Issue 2's acceptance, through the real CLI: exec over SSH + pct, exit codes, host keys, one connection."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fleetfix.secrets import MASK
from tests.e2e.conftest import REPO, host_args, run_cli, write_inventory
from tests.lab.bed import Lab
from tests.lab.container import Container

MARKER_OS_RELEASE = 'PRETTY_NAME="fleetfix test container 200"\nID=debian\nVERSION_ID="12"\n'


def test_exec_prints_the_containers_file(lab: Lab, make_ct: Callable[..., Container]) -> None:
    ct = make_ct(setup=lambda c: c.write_file("/etc/os-release", MARKER_OS_RELEASE))
    result = run_cli("exec", *host_args(lab, None, ct.ctid), "--", "cat", "/etc/os-release")
    assert result.exit_code == 0, result.stderr
    assert MARKER_OS_RELEASE in result.stdout
    # The host's own file is a different one: the command really ran inside the container.
    assert "fleetfix test container" not in Path("/etc/os-release").read_text()


def test_failing_command_exit_code_comes_back(lab: Lab, make_ct: Callable[..., Container]) -> None:
    ct = make_ct()
    script = "echo out; echo err >&2; exit 7"
    result = run_cli("exec", *host_args(lab, None, ct.ctid), "--json", "--", "sh", "-c", script)
    assert result.exit_code == 1
    [record] = result.json()
    assert (record["exit_code"], record["stdout"], record["stderr"]) == (7, "out\n", "err\n")


def test_stopped_container_is_a_clear_per_target_error(lab: Lab, make_ct: Callable[..., Container]) -> None:
    running, stopped = make_ct(), make_ct(running=False)
    result = run_cli("exec", *host_args(lab, None, running.ctid, stopped.ctid), "--", "true")
    assert result.exit_code == 4
    assert f"CT {stopped.ctid} on" in result.stdout and "stopped" in result.stdout
    assert f"/{running.ctid} exit 0" in result.stdout  # the other target still ran
    assert "Traceback" not in result.stderr


def test_unknown_host_key_refused_unless_accept_new(lab: Lab, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    args = host_args(lab)
    args[args.index("--known-hosts") + 1] = str(known_hosts)
    refused = run_cli("exec", *args, "--", "true")
    assert refused.exit_code == 4
    assert "SHA256:" in refused.stdout + refused.stderr
    assert not known_hosts.exists() or known_hosts.read_text() == ""

    accepted = run_cli("exec", *args, "--accept-new", "--", "hostname")
    assert accepted.exit_code == 0, accepted.stdout + accepted.stderr
    assert lab.node().ssh.host_key_line.split()[1] in known_hosts.read_text()
    # Recorded: the next run needs no --accept-new.
    assert run_cli("exec", *args, "--", "true").exit_code == 0


def test_changed_host_key_always_refused(lab: Lab, tmp_path: Path) -> None:
    node = lab.node()
    other_key = (tmp_path / "other.pub")
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    key_type, key_b64 = other_key.read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{node.address}]:{node.port} {key_type} {key_b64}\n")
    args = host_args(lab)
    args[args.index("--known-hosts") + 1] = str(known_hosts)
    result = run_cli("exec", *args, "--accept-new", "--", "touch", "/tmp/should-not-exist-fleetfix")
    assert result.exit_code == 4
    assert "CHANGED" in (result.stdout + result.stderr).upper()
    assert known_hosts.read_text() == f"[{node.address}]:{node.port} {key_type} {key_b64}\n"


def test_two_containers_share_one_tcp_connection(lab: Lab, make_ct: Callable[..., Container]) -> None:
    first, second = make_ct(), make_ct()
    node = lab.node().ssh
    connections, channels = node.connections(), node.session_channels()
    result = run_cli("exec", *host_args(lab, None, first.ctid, second.ctid), "--", "true")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert node.connections() - connections == 1
    assert node.session_channels() - channels == 2


def test_hostile_arguments_arrive_verbatim(lab: Lab, make_ct: Callable[..., Container]) -> None:
    ct = make_ct()
    hostile = "it's \"quoted\" $(touch /canary-a) `touch /canary-b`; touch /canary-c\nline2 \\ $HOME *"
    result = run_cli("exec", *host_args(lab, None, ct.ctid), "--json", "--", "printf", "%s", hostile)
    assert result.exit_code == 0, result.stderr
    assert result.json()[0]["stdout"] == hostile
    for canary in ("/canary-a", "/canary-b", "/canary-c"):
        assert not (ct.upper_dir / canary.lstrip("/")).exists()
        assert not Path(canary).exists()


def test_remote_stderr_streams_as_it_arrives_and_stdout_stays_clean(
    lab: Lab, make_ct: Callable[..., Container]
) -> None:
    ct = make_ct()
    # Both streams into one pipe, read as they come: stderr's line must come while the remote command
    # still sleeps, before the target's stdout (printed when it finishes).
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetfix", "exec", *host_args(lab, None, ct.ctid), "--",
         "sh", "-c", "echo a; echo b >&2; sleep 1; echo c"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    first_at = time.monotonic()
    rest = process.stdout.read()
    assert process.wait(timeout=60) == 0, first + rest
    assert first == "b\n"  # one target: the line as the command wrote it
    assert time.monotonic() - first_at > 0.5, "stderr came only when the command ended"
    header, *lines = rest.splitlines()
    assert header.startswith("== ") and header.endswith(f"/{ct.ctid} exit 0") and lines == ["a", "c"]


def test_streamed_stderr_masks_secret_vars(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path
) -> None:
    ct = make_ct()
    secret = "tok-e2e-very-secret"
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(ct.ctid, {"api_token": secret})])
    result = run_cli("exec", "-i", str(inventory), "--", "sh", "-c", 'echo "token=$0" >&2', secret)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"token={MASK}\n"
