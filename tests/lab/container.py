"""Test-bed LXC containers: overlay mounts of this machine's root, each with a long-lived PID 1.

A container is a directory ``<node_dir>/ct/<ID>/`` holding ``upper/`` and ``work/`` (the overlay's writable
layer and scratch dir) and ``rootfs/`` (the mount point, used only inside the container's own mount
namespace), plus a config file ``<node_dir>/lxc/<ID>.conf`` in the format of ``/etc/pve/lxc/<ID>.conf``.

Starting a container runs a small sh "init" inside ``unshare --mount --pid --uts --ipc --fork``: it mounts the
overlay (lowerdir=/, or a template's root filesystem), /proc, /sys (read-only), a minimal /dev and a /run
tmpfs, sets the hostname, then chroots into the overlay and idles as PID 1, reaping orphans. Because every
mount lives in the container's private mount namespace, killing PID 1 tears the whole container down (the
kernel kills everything in the PID namespace and drops the mounts): no mount ever leaks into this machine's
namespace. Writes land in ``upper/`` only; the host's files are never touched.

The container is made hermetic at creation by seeding ``upper/`` (whiteouts = char devices 0:0, opaque
directories = the ``trusted.overlay.opaque`` xattr): no apt sources, no apt lists, no NVIDIA keyring/pin, no
``/usr/local/cuda*``, a fresh /root and /tmp, and none of this machine's non-Debian top-level directories.

A container made from a template (``create_container(..., template=ROOTFS)``, e.g. the Debian 13 tree of
``tests/lab/template.py``) uses that directory as its lower layer instead of this machine's /; the template
is hermetic already, so its upper dir starts with only the hostname. The template's path is kept in
``<ct dir>/lower``. A template may be a stack of layers, top first (``template=(LAYER, ROOTFS)``: e.g. the
real cu130 torch venv of ``tests/lab/realtorch.py`` built once on top of the Debian 13 tree); they become the
overlay's ``lowerdir=LAYER:ROOTFS``, read-only like a single template.

This module is imported both by the test suite (``tests.lab.container``) and by the ``pct`` stand-in, which
runs it with the node's ``/usr/bin/python3`` (Debian's 3.11): standard library only.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

if __package__:  # imported by the test suite
    from tests.lab import lxcreal
else:  # run by the `pct` stand-in from tests/lab
    import lxcreal  # type: ignore[no-redef]

# Set (by the node's `pct` wrapper) to the node's state directory.
NODE_DIR_ENV = "FLEETFIX_LAB_NODE_DIR"
NSENTER = "/usr/bin/nsenter"
UNSHARE = "/usr/bin/unshare"
# What PVE's CLI handler forces PATH to (pct exec keeps the rest of the caller's environment).
PVE_CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"

# Top-level entries a Debian container has; anything else on this machine (/work, /farm...) is hidden.
_ROOTFS_TOP = frozenset({
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "opt", "proc",
    "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var",
})  # fmt: skip
# Host files a fresh container must not inherit (globs, relative to /). Hidden with whiteouts.
_HIDDEN_GLOBS = (
    "usr/local/cuda*",
    "usr/local/bin/nvcc",  # this machine's wrapper into /usr/local/cuda-13.0
    "etc/ld.so.conf.d/*cuda*",
    "etc/apt/preferences.d/*cuda*",
    "etc/apt/trusted.gpg.d/*cuda*",
    "etc/apt/trusted.gpg.d/*nvidia*",
    "usr/share/keyrings/*cuda*",
    "usr/share/keyrings/*nvidia*",
    "var/cache/apt/*.bin",
    "etc/alternatives/cuda*",
    # The real-torch venv (realtorch.py) is a torch env under /opt: the probe's interpreter discovery
    # would report it in every container. Only containers created with share=(its path,) see it.
    "opt/fleetfix-torch-*",
)
# Directories replaced by empty opaque ones (so the host's contents disappear).
# dist-packages too: pip installs of this machine's Debian python must not leak into containers.
_OPAQUE_DIRS = (
    "etc/apt/sources.list.d", "var/lib/apt/lists", "root", "tmp", "usr/local/lib/python3.11/dist-packages",
)

# The container's init, run as PID 1 of the new PID namespace by `unshare --fork`.
# $1 upper, $2 work, $3 mount point, $4 hostname, $5 lower dir. Prints "ready <host pid>" once the mounts
# are up.
_INIT_SCRIPT = r"""
set -e
U=$1 W=$2 M=$3 NAME=$4 L=$5
mount -t overlay overlay -o "lowerdir=$L,upperdir=$U,workdir=$W" "$M"
mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys"
mount -t tmpfs -o mode=755,size=16m,nosuid tmpfs "$M/dev"
for dev in null zero full random urandom tty; do
    : > "$M/dev/$dev"
    mount --bind "/dev/$dev" "$M/dev/$dev"
done
mkdir -p "$M/dev/pts" "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$M/dev/pts"
ln -s pts/ptmx "$M/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$M/dev/shm"
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"
ln -s /proc/self/fd/1 "$M/dev/stdout"
ln -s /proc/self/fd/2 "$M/dev/stderr"
mount -t tmpfs -o mode=755,nosuid,nodev,size=64m tmpfs "$M/run"
mkdir -p "$M/run/lock" && chmod 1777 "$M/run/lock"
echo "$NAME" > /proc/sys/kernel/hostname
# The host's /proc is still mounted at /proc here: `read` is a builtin, so /proc/self is this shell,
# and the first field is its PID as this machine sees it (inside the namespace it is 1).
read -r host_pid _ < /proc/self/stat
exec </dev/null
# "ready" is printed only from inside the chroot: until then /proc/PID/root is this machine's own /, and a
# write or nsenter --root through it would land on the host.
# PID 1: idle and reap whatever gets reparented to us (dash's `wait` reaps any child).
exec chroot "$M" /bin/sh -c '
    echo "ready $1"; exec >/dev/null
    trap "exit 0" TERM; while :; do sleep 2147483647 & wait; done' sh "$host_pid"
"""


class ContainerError(RuntimeError):
    """A container operation failed (the message is pct-style, one line)."""


# --------------------------------------------------------------------------------------------------------
# /etc/pve/lxc/ID.conf: "key: value" lines, then one "[snapname]" section per snapshot.
# --------------------------------------------------------------------------------------------------------
class CtConfig:
    def __init__(self, main: dict[str, str], snapshots: dict[str, dict[str, str]]) -> None:
        self.main = main
        self.snapshots = snapshots

    @classmethod
    def parse(cls, text: str) -> CtConfig:
        main: dict[str, str] = {}
        snapshots: dict[str, dict[str, str]] = {}
        section = main
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            header = re.fullmatch(r"\[([^\]]+)\]", line)
            if header:
                section = snapshots.setdefault(header.group(1), {})
                continue
            key, _, value = line.partition(":")
            section[key.strip()] = value.strip()
        return cls(main, snapshots)

    def render(self) -> str:
        def block(values: dict[str, str]) -> str:
            return "".join(f"{key}: {value}\n" for key, value in values.items())

        parts = [block(self.main)]
        parts += [f"\n[{name}]\n{block(values)}" for name, values in self.snapshots.items()]
        return "".join(parts)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------
# Process helpers (PIDs are checked with their start time, so a reused PID is never mistaken for ours).
# --------------------------------------------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live process, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _alive(pid: int, start_time: int) -> bool:
    info = _proc_stat(pid)
    return info is not None and info[0] not in ("Z", "X") and info[1] == start_time


def _wait_gone(pid: int, start_time: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start_time):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# --------------------------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------------------------
class Container:
    # A plain class, not a dataclass: importing dataclasses costs ~15 ms on every `pct` call.
    # Where this kind of guest keeps its state under the node dir, and its config (tests/lab/vm.py reuses
    # the whole mechanism for VMs with "vm" and "qemu-server").
    state_subdir = "ct"
    conf_subdir = "lxc"

    def __init__(self, node: NodeState, ctid: int) -> None:
        self.node = node
        self.ctid = ctid

    def __repr__(self) -> str:
        return f"Container({self.node.dir}, {self.ctid})"

    # -- paths ---------------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.node.dir / self.state_subdir / str(self.ctid)

    @property
    def upper_dir(self) -> Path:
        """The overlay's writable layer: everything the container ever wrote, and nothing else."""
        return self.dir / "upper"

    @property
    def work_dir(self) -> Path:
        return self.dir / "work"

    @property
    def mount_point(self) -> Path:
        return self.dir / "rootfs"

    @property
    def snapshot_root(self) -> Path:
        return self.dir / "snapshots"

    @property
    def conf_path(self) -> Path:
        return self.node.dir / self.conf_subdir / f"{self.ctid}.conf"

    @property
    def lower_layers(self) -> tuple[Path, ...]:
        """The overlay's read-only layers, top first: a template's (one or more), or this machine's /."""
        try:
            lines = (self.dir / "lower").read_text().split()
        except FileNotFoundError:
            return (Path("/"),)
        return tuple(Path(line) for line in lines)

    @property
    def lower_dir(self) -> Path:
        """The overlay's bottom layer: a template's root filesystem, or this machine's /."""
        return self.lower_layers[-1]

    @property
    def _run_file(self) -> Path:
        return self.dir / "run.json"

    # -- config --------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.conf_path.is_file()

    def config(self) -> CtConfig:
        return CtConfig.parse(self.conf_path.read_text())

    def save_config(self, config: CtConfig) -> None:
        _atomic_write(self.conf_path, config.render())

    @property
    def name(self) -> str:
        return self.config().main.get("hostname", f"CT{self.ctid}")

    @property
    def hostname(self) -> str:
        """What the guest's own hostname is set to when it starts."""
        return self.name

    # -- runtime state -------------------------------------------------------------------------------
    def _run_state(self) -> dict[str, int] | None:
        try:
            state: dict[str, int] = json.loads(self._run_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return state

    @property
    def pid1(self) -> int | None:
        """PID (as this machine sees it) of the container's init, None when stopped."""
        state = self._run_state()
        if state and _alive(state["pid1"], state["pid1_start"]):
            return state["pid1"]
        return None

    @property
    def running(self) -> bool:
        return self.pid1 is not None

    @property
    def status(self) -> str:
        return "running" if self.running else "stopped"

    @property
    def root_path(self) -> Path:
        """The container's / as seen from outside: /proc/PID1/root while running, else the upper dir.

        Writing through it from the host is fine for plain paths; an absolute symlink inside the container
        would be resolved against the *host's* root, so use `exec` for anything clever.
        """
        pid = self.pid1
        return Path(f"/proc/{pid}/root") if pid else self.upper_dir

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> int:
        """Start the container; returns PID 1's host PID. Raises ContainerError when already running."""
        if self.running:
            raise ContainerError(f"CT {self.ctid} already running")
        if self.real_lxc:
            return self._start_real_lxc(timeout)
        # A fresh workdir each start: overlay wants it empty-ish and it is scratch space only.
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True)
        self.mount_point.mkdir(parents=True, exist_ok=True)
        log_path = self.dir / "init.log"
        argv = [
            UNSHARE,
            "--mount",
            "--pid",
            "--uts",
            "--ipc",
            "--fork",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            _INIT_SCRIPT,
            "ct-init",
            str(self.upper_dir),
            str(self.work_dir),
            str(self.mount_point),
            self.hostname,
            ":".join(str(layer) for layer in self.lower_layers),
        ]
        deadline = time.monotonic() + timeout
        while True:
            ready = self._launch(argv, log_path, timeout)
            if ready is not None:
                break
            # Right after a stop the old overlay may still be being torn down (upper dir "in use"); retry.
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
                raise ContainerError(f"CT {self.ctid} failed to start: {tail.strip()}")
            time.sleep(0.05)
        pid1, launcher = ready
        info, launcher_info = _proc_stat(pid1), _proc_stat(launcher)
        if info is None or launcher_info is None:
            raise ContainerError(f"CT {self.ctid} exited right after starting")
        state = {
            "pid1": pid1,
            "pid1_start": info[1],
            "launcher": launcher,
            "launcher_start": launcher_info[1],
        }
        _atomic_write(self._run_file, json.dumps(state))
        return pid1

    @property
    def real_lxc(self) -> bool:
        """Run by LXC (lxc-start, lxc-attach: tests/lab/lxcreal.py) rather than by the namespace stand-in."""
        return lxcreal.is_real(self.node.dir, self.ctid)

    def _start_real_lxc(self, timeout: float) -> int:
        try:
            pid1 = lxcreal.start(self.node.dir, self.ctid, timeout)
        except lxcreal.LxcError as error:
            raise ContainerError(f"CT {self.ctid} failed to start: {error}") from error
        info = _proc_stat(pid1)
        if info is None:
            raise ContainerError(f"CT {self.ctid} exited right after starting")
        # The init is its own "launcher": LXC's monitor, not this process, owns the container.
        state = {"pid1": pid1, "pid1_start": info[1], "launcher": pid1, "launcher_start": info[1]}
        _atomic_write(self._run_file, json.dumps(state))
        return pid1

    def _launch(self, argv: list[str], log_path: Path, timeout: float) -> tuple[int, int] | None:
        """Run the init detached (own session, not our child); return (pid1, launcher pid) or None."""
        read_fd, write_fd = os.pipe()
        with open(log_path, "ab") as log:
            # Double fork: the `unshare` launcher is re-parented to init at once, so neither pytest nor a
            # short-lived `pct start` has to reap it, and it outlives the SSH session that started it.
            middle = os.fork()
            if middle == 0:  # pragma: no cover - runs in the child
                try:
                    os.setsid()
                    launcher = os.fork()
                    if launcher == 0:
                        # Python ignores SIGPIPE/SIGXFSZ and exec would keep that: restore the defaults.
                        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                        os.dup2(write_fd, 1)
                        os.dup2(log.fileno(), 2)
                        os.closerange(3, 1024)
                        os.execv(argv[0], argv)
                    os.write(write_fd, f"launcher {launcher}\n".encode())
                finally:
                    os._exit(0)
        os.close(write_fd)
        os.waitpid(middle, 0)
        output = b""
        with os.fdopen(read_fd, "rb") as pipe:
            # Read up to "ready": the unshare parent keeps the pipe's write end, so no EOF on success.
            # On failure everything exits and EOF ends the loop.
            for line in iter(pipe.readline, b""):
                output += line
                if line.startswith(b"ready "):
                    break
        launcher_match = re.search(rb"launcher (\d+)", output)
        ready_match = re.search(rb"ready (\d+)", output)
        if not ready_match or not launcher_match:
            return None
        return int(ready_match.group(1)), int(launcher_match.group(1))

    def stop(self, timeout: float = 10.0) -> None:
        """Hard stop (like `pct stop`): kill PID 1; the kernel kills the rest and drops the mounts."""
        if self.real_lxc:
            try:
                lxcreal.stop(self.node.dir, self.ctid, timeout)
            except lxcreal.LxcError as error:
                raise ContainerError(f"CT {self.ctid}: {error}") from error
            self._run_file.unlink(missing_ok=True)
            return
        state = self._run_state()
        if state is None:
            return
        if _alive(state["pid1"], state["pid1_start"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state["pid1"], signal.SIGKILL)
        ok = _wait_gone(state["pid1"], state["pid1_start"], timeout)
        # The launcher shares the container's mount namespace: once it is gone, the overlay is unmounted.
        ok = _wait_gone(state["launcher"], state["launcher_start"], timeout) and ok
        if not ok:
            raise ContainerError(f"CT {self.ctid} did not stop within {timeout}s")
        self._run_file.unlink(missing_ok=True)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(Path(lxcreal.config_path(self.node.dir, self.ctid)).parent, ignore_errors=True)
        self.conf_path.unlink(missing_ok=True)

    # -- running commands ----------------------------------------------------------------------------
    def nsenter_argv(self, command: list[str]) -> list[str]:
        """argv that runs command inside the container (`--wd` bare: the target's cwd, inside the chroot)."""
        pid = self.pid1
        if pid is None:
            raise ContainerError(f"container '{self.ctid}' not running!")
        return [
            NSENTER,
            f"--target={pid}",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--root",
            "--wd",
            "--",
            *command,
        ]

    def exec(
        self,
        command: list[str],
        *,
        input: bytes = b"",
        check: bool = False,
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run command in the container directly (no SSH, no pct), as test set-up does."""
        run_env = env if env is not None else {"PATH": PVE_CLI_PATH, "LANG": "C.UTF-8", "container": "lxc"}
        return subprocess.run(
            self.nsenter_argv(command),
            input=input,
            capture_output=True,
            check=check,
            timeout=timeout,
            env=run_env,
        )

    def sh(
        self, script: str, *, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a POSIX sh script inside the container (sent on stdin)."""
        result = self.exec(["/bin/sh", "-s"], input=script.encode(), timeout=timeout)
        if check and result.returncode != 0:
            raise ContainerError(
                f"CT {self.ctid}: script failed (exit {result.returncode}): "
                f"{result.stderr.decode(errors='replace').strip()[-800:]}"
            )
        return result

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create a file inside the container (parents too), running or stopped.

        A running container writes from inside (nsenter), so symlinks resolve against the container's root
        and a stale PID 1 can never point the write at this machine's own files. A stopped one writes into
        its upper dir, refusing any symlink on the way."""
        payload = data.encode() if isinstance(data, str) else data
        if self.running:
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
            self.exec(["/bin/sh", "-c", script, "sh", path, format(mode, "o")], input=payload, check=True)
            return
        target = self.upper_dir / path.lstrip("/")
        relative = target.relative_to(self.upper_dir)
        for part in [*reversed(relative.parents), relative]:
            if (self.upper_dir / part).is_symlink():
                raise ContainerError(f"refusing to write {path} through a symlink in a stopped CT")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(payload)
        target.chmod(mode)

    # -- snapshots (a snapshot is a copy of the upper dir plus a config section, as PVE keeps it) ----
    def snapshot_dir(self, name: str) -> Path:
        return self.snapshot_root / name / "upper"

    def copy_upper_to(self, destination: Path) -> None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        # cp -a keeps modes, owners, times, hard links, whiteouts (char 0:0) and the trusted.overlay.* xattrs.
        subprocess.run(["cp", "-a", "--", str(self.upper_dir), str(destination)], check=True)

    def restore_upper_from(self, source: Path) -> None:
        if self.running:
            raise ContainerError(f"CT {self.ctid} is running")
        staging = self.dir / "upper.restore"
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(["cp", "-a", "--", str(source), str(staging)], check=True)
        shutil.rmtree(self.upper_dir)
        os.replace(staging, self.upper_dir)


# --------------------------------------------------------------------------------------------------------
# The node's container registry
# --------------------------------------------------------------------------------------------------------
class NodeState:
    """A node's state directory: its name, its containers' configs and dirs, and the pct call log."""

    def __init__(self, node_dir: Path) -> None:
        self.dir = node_dir

    @classmethod
    def from_env(cls) -> NodeState:
        value = os.environ.get(NODE_DIR_ENV)
        if not value:
            raise ContainerError(f"{NODE_DIR_ENV} is not set: this pct stand-in only runs on a test-bed node")
        return cls(Path(value))

    @classmethod
    def create(cls, node_dir: Path, name: str) -> NodeState:
        for sub in ("lxc", "ct", "qemu-server", "vm"):
            (node_dir / sub).mkdir(parents=True, exist_ok=True)
        (node_dir / "nodename").write_text(f"{name}\n")
        return cls(node_dir)

    @property
    def name(self) -> str:
        return (self.dir / "nodename").read_text().strip()

    @property
    def pct_log(self) -> Path:
        return self.dir / "pct.log"

    def conf_path(self, ctid: int) -> Path:
        return self.dir / "lxc" / f"{ctid}.conf"

    def id_owner(self, vmid: int) -> str | None:
        """"CT" or "VM" when a guest of this node already has this id (PVE: one id space per cluster)."""
        if (self.dir / "lxc" / f"{vmid}.conf").is_file():
            return "CT"
        if (self.dir / "qemu-server" / f"{vmid}.conf").is_file():
            return "VM"
        return None

    def ctids(self) -> list[int]:
        ids = [int(path.stem) for path in (self.dir / "lxc").glob("*.conf") if path.stem.isdigit()]
        return sorted(ids)

    def container(self, ctid: int) -> Container:
        return Container(self, ctid)

    def containers(self) -> list[Container]:
        return [Container(self, ctid) for ctid in self.ctids()]

    def create_container(
        self,
        ctid: int,
        *,
        hostname: str | None = None,
        tags: tuple[str, ...] = (),
        extra_config: dict[str, str] | None = None,
        template: Path | tuple[Path, ...] | None = None,
        share: tuple[str, ...] = (),
        real_lxc: bool = False,
    ) -> Container:
        """A stopped container; `template` is a root filesystem to use instead of this machine's / (or a
        stack of layers over one, top first); `share` names host paths normally hidden (the real-torch
        venv) that this container sees; `real_lxc` makes it a real LXC container (tests/lab/lxcreal.py) over
        the same layers."""
        ct = Container(self, ctid)
        owner = self.id_owner(ctid)
        if owner is not None:
            raise ContainerError(f"unable to create CT {ctid} - {owner} {ctid} already exists on node "
                                 f"'{self.name}'")
        hostname = hostname or f"ct{ctid}"
        shutil.rmtree(ct.dir, ignore_errors=True)
        ct.dir.mkdir(parents=True)
        if template is None:
            seed_hermetic_upper(ct.upper_dir, hostname, share=share)
        else:
            layers = (template,) if isinstance(template, Path) else template
            rootfs = layers[-1]
            if not any((rootfs / path).exists() for path in ("etc/os-release", "usr/lib/os-release")):
                raise ContainerError(f"{rootfs} is not a root filesystem (no os-release)")
            for layer in layers:
                if not layer.is_dir() or ":" in str(layer) or any(c.isspace() for c in str(layer)):
                    raise ContainerError(f"{layer}: not a directory usable as an overlay layer")
            (ct.dir / "lower").write_text("".join(f"{layer}\n" for layer in layers))
            ct.upper_dir.mkdir()
            (ct.upper_dir / "etc").mkdir()
            (ct.upper_dir / "etc/hostname").write_text(f"{hostname}\n")
        main = {
            "arch": "amd64",
            "cores": "2",
            "hostname": hostname,
            "memory": "2048",
            "ostype": "debian",
            "rootfs": f"local-lvm:vm-{ctid}-disk-0,size=8G",
            "swap": "512",
        }
        if tags:
            main["tags"] = ";".join(tags)
        main.update(extra_config or {})
        if real_lxc:
            lxcreal.install_init(str(ct.upper_dir))
            lxcreal.write_config(self.dir, ctid, lxcreal.render_config(
                ctid, hostname, ":".join(str(layer) for layer in ct.lower_layers), str(ct.upper_dir)))
        ct.save_config(CtConfig(main, {}))
        return ct

    def clone_container(self, source: Container, newid: int, *, hostname: str | None) -> Container:
        """A stopped copy of source as CT newid (`pct clone`, pve-container's clone_vm): the source's layers
        and a copy of its upper dir, for a linked clone too. (Stacking the source's upper dir as one more
        lower layer would be closer to a linked clone, but overlayfs refuses it with ELOOP when the bottom
        layer is this machine's /, which holds that upper dir: overlapping layers.) The config is the
        source's without template/snapshot/lock keys, its rootfs renamed to the new id, hostname replaced
        if given (pct.py checks which kind of clone pct may make)."""
        owner = self.id_owner(newid)
        if owner is not None:
            # pve-cluster PVE::Cluster::check_vmid_unused, via create_and_lock_config in clone_vm.
            raise ContainerError(f"{owner} {newid} already exists on node '{self.name}'")
        clone = Container(self, newid)
        shutil.rmtree(clone.dir, ignore_errors=True)
        clone.dir.mkdir(parents=True)
        source.copy_upper_to(clone.upper_dir)
        if (source.dir / "lower").is_file():
            shutil.copy2(source.dir / "lower", clone.dir / "lower")
        config = source.config()
        main = {key: value for key, value in config.main.items()
                if key not in ("template", "lock", "parent", "snaptime", "snapstate", "digest")}
        if "rootfs" in main:
            volume, comma, rest = main["rootfs"].partition(",")
            storage = volume.split(":", 1)[0]
            main["rootfs"] = f"{storage}:vm-{newid}-disk-0{comma}{rest}"
        if hostname:
            main["hostname"] = hostname
        (clone.upper_dir / "etc").mkdir(exist_ok=True)
        (clone.upper_dir / "etc/hostname").write_text(f"{main.get('hostname', f'CT{newid}')}\n")
        clone.save_config(CtConfig(main, {}))
        return clone

    def pct_calls(self) -> list[list[str]]:
        """Every pct invocation so far, as argv lists (without the program name): the JSON lines
        pct_exec.log_invocation appends."""
        if not self.pct_log.exists():
            return []
        return [json.loads(line) for line in self.pct_log.read_text().splitlines() if line]


# --------------------------------------------------------------------------------------------------------
# Seeding the upper dir
# --------------------------------------------------------------------------------------------------------
def _mkdir_like_host(upper: Path, relative: str) -> Path:
    """Create upper/relative (and parents), copying each directory's mode/owner from the host."""
    path = upper
    for part in Path(relative).parts:
        path = path / part
        if not path.is_dir():
            path.mkdir()
            host = Path("/") / path.relative_to(upper)
            with contextlib.suppress(FileNotFoundError):
                info = host.lstat()
                os.chown(path, info.st_uid, info.st_gid)
                os.chmod(path, stat.S_IMODE(info.st_mode))
    return path


def _whiteout(upper: Path, relative: str) -> None:
    parent = _mkdir_like_host(upper, str(Path(relative).parent))
    target = parent / Path(relative).name
    if not target.exists() and not target.is_symlink():
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _opaque_dir(upper: Path, relative: str) -> Path:
    path = _mkdir_like_host(upper, relative)
    os.setxattr(path, "trusted.overlay.opaque", b"y")
    return path


def seed_hermetic_upper(upper: Path, hostname: str, *, share: tuple[str, ...] = ()) -> None:
    """Lay out the upper dir so the container starts clean (see the module docstring); host paths in
    `share` stay visible."""
    shared = {path.rstrip("/") for path in share}
    upper.mkdir(parents=True, exist_ok=True)
    for entry in os.listdir("/"):
        if entry not in _ROOTFS_TOP:
            _whiteout(upper, entry)
    for pattern in _HIDDEN_GLOBS:
        for host_path in glob.glob("/" + pattern):
            if host_path not in shared:
                _whiteout(upper, host_path[1:])
    for relative in _OPAQUE_DIRS:
        _opaque_dir(upper, relative)
    (upper / "tmp").chmod(0o1777)
    root_home = upper / "root"
    root_home.chmod(0o700)
    for dotfile in (".bashrc", ".profile"):
        skel = Path("/etc/skel") / dotfile
        if skel.is_file():
            shutil.copy2(skel, root_home / dotfile)
    # apt wants lists/partial (owned by _apt, mode 700, like the host's).
    partial = upper / "var/lib/apt/lists/partial"
    partial.mkdir()
    with contextlib.suppress(FileNotFoundError):
        info = Path("/var/lib/apt/lists/partial").stat()
        os.chown(partial, info.st_uid, info.st_gid)
        os.chmod(partial, stat.S_IMODE(info.st_mode))
    # No apt sources at all: only what a test configures is used.
    _mkdir_like_host(upper, "etc/apt")
    (upper / "etc/apt/sources.list").write_text("")
    (upper / "etc/hostname").write_text(f"{hostname}\n")


# --------------------------------------------------------------------------------------------------------
# Comparing upper dirs ("check mode changed nothing")
# --------------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    import hashlib  # only the test suite digests trees; keep `pct` start-up lean

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# overlayfs bookkeeping it writes on its own on *lookups* (where a dir came from, whether it holds copied-up
# entries): not a change made by anything running in the container, so digests ignore them. The opaque,
# redirect and metacopy markers do change what the container sees, and are kept.
_OVERLAY_BOOKKEEPING_XATTRS = frozenset({"trusted.overlay.origin", "trusted.overlay.impure"})


def _xattrs(path: Path) -> str:
    try:
        names = sorted(set(os.listxattr(path, follow_symlinks=False)) - _OVERLAY_BOOKKEEPING_XATTRS)
    except OSError:
        return ""
    values = []
    for name in names:
        with contextlib.suppress(OSError):
            values.append(f"{name}={os.getxattr(path, name, follow_symlinks=False).hex()}")
    return ",".join(values)


def tree_digest(root: Path, *, mtimes: bool = True) -> dict[str, str]:
    """Describe every entry under root: type, mode, owner, size, content hash, link target, whiteouts,
    xattrs (overlay opaque markers) and, by default, mtimes. Equal dicts = byte-for-byte equal trees;
    comparing two dicts in an assert shows exactly which paths differ."""
    entries: dict[str, str] = {}

    def describe(path: Path) -> str:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode)
        common = f"mode={mode:o} uid={info.st_uid} gid={info.st_gid}"
        if mtimes:
            common += f" mtime={info.st_mtime_ns}"
        xattrs = _xattrs(path)
        if xattrs:
            common += f" xattrs={xattrs}"
        if stat.S_ISLNK(info.st_mode):
            return f"symlink -> {os.readlink(path)} {common}"
        if stat.S_ISDIR(info.st_mode):
            return f"dir {common}"
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(0, 0):
            return f"whiteout {common}"
        if stat.S_ISREG(info.st_mode):
            return f"file size={info.st_size} sha256={_sha256(path)} {common}"
        return f"special type={stat.S_IFMT(info.st_mode):o} rdev={info.st_rdev} {common}"

    def walk(directory: Path) -> Iterator[Path]:
        for entry in sorted(os.scandir(directory), key=lambda item: item.name):
            path = Path(entry.path)
            yield path
            if entry.is_dir(follow_symlinks=False):
                yield from walk(path)

    if root.exists():
        entries["."] = describe(root)
        for path in walk(root):
            entries[str(path.relative_to(root))] = describe(path)
    return entries
