"""A test-bed Proxmox node: a real OpenSSH sshd on a loopback address, in a private mount namespace.

The private mount namespace lets the node have its own /root (so this machine's ~/.bashrc does not leak
into SSH sessions) and its own /usr/local/sbin (where the `pct` stand-in lives), while the rest of the
filesystem is shared with this machine, as container overlays need.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def keygen(path: Path, comment: str = "fleetfix-lab") -> str:
    """Create an ed25519 key pair at path (no passphrase); return the public key line."""
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True
        )
    return Path(f"{path}.pub").read_text().strip()


def wait_for_port(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class SshNode:
    name: str
    address: str
    port: int
    state_dir: Path
    host_key_line: str  # "ssh-ed25519 AAAA..." (no host part)
    sbin_dir: Path  # bind-mounted over /usr/local/sbin inside the node
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def known_hosts_line(self) -> str:
        host = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{host} {self.host_key_line}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def connections(self) -> int:
        """TCP connections sshd accepted and authenticated (LogLevel DEBUG1 logs one line each)."""
        return self.log_text().count("Accepted publickey for")

    def session_channels(self) -> int:
        """Session channels opened on all connections (one per exec)."""
        return self.log_text().count("server_input_channel_open: ctype session")

    def stop(self) -> None:
        if self.process is None:
            return
        # sshd -D is the namespace's child; kill the whole process group (sshd + its session children).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        self.process = None


def start_node(
    state_dir: Path,
    *,
    name: str = "pve1",
    address: str = "127.0.0.1",
    authorized_keys: list[str],
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> SshNode:
    """Start sshd for one node. authorized_keys: public key lines allowed to log in as root."""
    state_dir.mkdir(parents=True, exist_ok=True)
    home = state_dir / "home"
    sbin = state_dir / "sbin"
    for folder in (home, home / ".ssh", sbin):
        folder.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    host_key = state_dir / "ssh_host_ed25519_key"
    host_key_line = " ".join(keygen(host_key, f"{name}-host").split()[:2])
    auth_keys = state_dir / "authorized_keys"
    auth_keys.write_text("".join(f"{key}\n" for key in authorized_keys))
    auth_keys.chmod(0o600)
    port = port or free_port(address)
    log_path = state_dir / "sshd.log"
    set_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    config = state_dir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {address}:{port}",
                f"HostKey {host_key}",
                f"PidFile {state_dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {auth_keys}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "LogLevel DEBUG1",
                "Subsystem sftp internal-sftp",
                *( [f"SetEnv {set_env}"] if set_env else [] ),
                "",
            ]
        )
    )
    # Private mount and UTS namespaces: the node's own hostname (PVE's node name is the short hostname),
    # /root and /usr/local/sbin, then sshd in the foreground.
    inner = (
        f"echo {shlex.quote(name)} > /proc/sys/kernel/hostname && "
        f"mount --bind {shlex.quote(str(home))} /root && "
        f"mount --bind {shlex.quote(str(sbin))} /usr/local/sbin && "
        f"exec {SSHD} -D -E {shlex.quote(str(log_path))} -f {shlex.quote(str(config))}"
    )
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", inner],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    node = SshNode(name, address, port, state_dir, host_key_line, sbin, log_path, process)
    try:
        wait_for_port(address, port)
    except OSError:
        node.stop()
        raise RuntimeError(f"sshd for {name} did not start: {node.log_text()[-2000:]}") from None
    return node
