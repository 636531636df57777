"""A test-bed Proxmox node: a real OpenSSH sshd on a loopback address, in a private mount namespace.

The private mount namespace lets the node have its own /root (so this machine's ~/.bashrc does not leak
into SSH sessions), its own /usr/local/sbin (where the `pct` stand-in lives) and its own /var/tmp (where
fleetfix stages transfers and wheel builds on a node: a test that asserts nothing is left there sees only
its own node's, not those of a test running beside it), while the rest of the filesystem is shared with
this machine, as container overlays need.

Least privilege (issue 18): where sudo is installed, every node also has a login that is not root,
`fleetfix` (LOGIN_USER), allowed by sudoers exactly what docs/security.md tells a team to grant: `pct`,
`qm` and `pvesh` as root, without a password (NODE_SUDOERS). Its passwd, group and shadow entries, the
sudoers file and the node's /etc/hosts are bind-mounted over this machine's in the node's namespace only, so
the machine itself gains no user and no sudo rule (container overlays see the machine's own /etc: overlayfs
does not cross mount points). Its authorized_keys and home live in a world-traversable directory, because
sshd reads a user's keys as that user.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SUDO = "/usr/bin/sudo"
LOGIN_USER = "fleetfix"
LOGIN_UID = 4242  # above Debian's system range; refused below if this machine already uses it
# The lines docs/security.md documents, with the stand-ins' paths (a real node: /usr/sbin/pct, /usr/sbin/qm,
# /usr/bin/pvesh; `command -v` tells).
NODE_SUDOERS = (
    "Defaults env_reset\n"
    'Defaults secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
    "root ALL=(ALL:ALL) ALL\n"
    f"{LOGIN_USER} ALL=(root) NOPASSWD: /usr/local/sbin/pct, /usr/local/sbin/qm, /usr/local/sbin/pvesh\n"
)


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
    var_tmp: Path  # bind-mounted over /var/tmp inside the node
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    login_dir: Path | None = None  # the non-root login's keys and home; None without sudo

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

    @property
    def login_user(self) -> str | None:
        """The non-root login with sudo for pct/qm/pvesh, when this machine has sudo."""
        return LOGIN_USER if self.login_dir is not None else None

    def stop(self) -> None:
        if self.login_dir is not None:
            shutil.rmtree(self.login_dir, ignore_errors=True)
            self.login_dir = None
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


def _login_user_files(state_dir: Path, name: str, authorized_keys: list[str]) -> Path:
    """The node's own /etc/{passwd,group,shadow,hosts,sudoers} (this machine's plus the login), and the
    login's keys and home; returns the login's directory (removed by SshNode.stop)."""
    passwd = Path("/etc/passwd").read_text()
    if any(line.split(":")[2:3] == [str(LOGIN_UID)] for line in passwd.splitlines()):
        raise RuntimeError(f"uid {LOGIN_UID} is taken on this machine: the test bed's login needs it")
    login_dir = Path(tempfile.mkdtemp(prefix="fleetfix-lab-login-"))
    login_dir.chmod(0o755)  # sshd reads the keys as the login user: every directory above must let it in
    home, keys = login_dir / "home", login_dir / "keys"
    home.mkdir()
    keys.mkdir(mode=0o755)
    (keys / LOGIN_USER).write_text("".join(f"{key}\n" for key in authorized_keys))
    for path, mode in ((home, 0o700), (keys / LOGIN_USER, 0o600)):
        os.chown(path, LOGIN_UID, LOGIN_UID)
        path.chmod(mode)
    etc = state_dir / "etc"
    (etc / "sudoers.d").mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(passwd + f"{LOGIN_USER}:x:{LOGIN_UID}:{LOGIN_UID}::{home}:/bin/sh\n")
    (etc / "group").write_text(Path("/etc/group").read_text() + f"{LOGIN_USER}:x:{LOGIN_UID}:\n")
    # "*": no password, yet not locked ("!"), which sshd would refuse even for a key.
    (etc / "shadow").write_text(Path("/etc/shadow").read_text() + f"{LOGIN_USER}:*:19000:0:99999:7:::\n")
    (etc / "hosts").write_text(Path("/etc/hosts").read_text() + f"127.0.1.1 {name}\n")  # sudo looks it up
    (etc / "sudoers").write_text(NODE_SUDOERS)
    for file, mode in (("shadow", 0o640), ("sudoers", 0o440)):
        (etc / file).chmod(mode)
    return login_dir


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
    var_tmp = state_dir / "var-tmp"
    for folder in (home, home / ".ssh", sbin, var_tmp):
        folder.mkdir(parents=True, exist_ok=True)
    var_tmp.chmod(0o1777)  # as /var/tmp: the non-root login stages files there too
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    host_key = state_dir / "ssh_host_ed25519_key"
    host_key_line = " ".join(keygen(host_key, f"{name}-host").split()[:2])
    auth_keys = state_dir / "authorized_keys"
    auth_keys.write_text("".join(f"{key}\n" for key in authorized_keys))
    auth_keys.chmod(0o600)
    log_path = state_dir / "sshd.log"
    set_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    login_dir = _login_user_files(state_dir, name, authorized_keys) if os.access(SUDO, os.X_OK) else None
    keys_files = str(auth_keys) + (f" {login_dir}/keys/%u" if login_dir else "")
    config = state_dir / "sshd_config"
    # Private mount and UTS namespaces: the node's own hostname (PVE's node name is the short hostname),
    # /root, /usr/local/sbin and /var/tmp, then sshd in the foreground.
    etc = "".join(f"mount --bind {shlex.quote(str(state_dir / 'etc' / f))} /etc/{f} && "
                  for f in ("passwd", "group", "shadow", "hosts", "sudoers")) if login_dir else ""
    sudoers_d = (f"mount --bind {shlex.quote(str(state_dir / 'etc' / 'sudoers.d'))} /etc/sudoers.d && "
                 if login_dir and Path("/etc/sudoers.d").is_dir() else "")
    inner = (
        f"echo {shlex.quote(name)} > /proc/sys/kernel/hostname && "
        f"mount --bind {shlex.quote(str(home))} /root && "
        f"mount --bind {shlex.quote(str(sbin))} /usr/local/sbin && "
        f"mount --bind {shlex.quote(str(var_tmp))} /var/tmp && "
        f"{etc}{sudoers_d}"
        f"exec {SSHD} -D -E {shlex.quote(str(log_path))} -f {shlex.quote(str(config))}"
    )
    for attempt in range(5):
        listen_port = port or free_port(address)
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {address}:{listen_port}",
                    f"HostKey {host_key}",
                    f"PidFile {state_dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {keys_files}",
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
        log_start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", inner],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        node = SshNode(name, address, listen_port, state_dir, host_key_line, sbin, log_path, var_tmp, process,
                       login_dir)
        printed = _until_listening(node, log_start)
        if printed is None:
            wait_for_port(address, listen_port)
            return node
        # free_port's port can be taken before sshd binds it (another test, or a parallel test worker,
        # asked at the same moment): only sshd's own log line says the port is ours. Then try another.
        if port is None and "Address already in use" in printed and attempt < 4:
            node.login_dir = None  # kept for the next attempt
            node.stop()
            continue
        node.login_dir = login_dir
        node.stop()
        raise RuntimeError(f"sshd for {name} did not start: {printed[-2000:]}")
    raise AssertionError("unreachable")


def _until_listening(node: SshNode, log_start: int, timeout: float = 10.0) -> str | None:
    """None once this sshd logged that it listens on its address and port, else what it logged before it
    exited (or the time ran out). A connection alone would not tell: another process may own the port."""
    listening = f"Server listening on {node.address} port {node.port}."
    deadline = time.monotonic() + timeout
    assert node.process is not None
    while True:
        with open(node.log_path, "rb") as log:
            log.seek(log_start)
            printed = log.read().decode(errors="replace")
        if listening in printed:
            return None
        if node.process.poll() is not None or time.monotonic() > deadline:
            return printed or f"sshd exited with {node.process.returncode}"
        time.sleep(0.02)
