"""Real QEMU VMs for the test bed: Debian's cloud kernel, a Debian 12 disk with Debian's qemu-guest-agent,
booted by QEMU (TCG) with the agent's socket where the bed's `qm` reaches it, as on a PVE node.

    image = ensure_vm_image()                       # built once per machine, cached
    machine = create_qemu_vm(node, 300, forwards=(repo.port,))
    machine.start()                                 # boots, returns once the agent answers guest-ping

What is real: the kernel (`linux-image-cloud-amd64`'s), the guest's own Debian userland (a debootstrap of
bookworm with python3, qemu-guest-agent, kmod, iproute2: tests/lab/template.py "bookworm-vm"), qemu-ga
itself speaking to QEMU over virtio-serial, and QEMU's socket chardev in front of it: the bed's `qm`
(qm.py, through qga_real.py) talks to it exactly as qemu-server does. What the bed adds:

- an initramfs of its own (qemuvm_init.c, static): the cloud kernel has virtio-pci and virtio-blk as
  modules; it loads them, mounts /dev/vda and runs the disk's /sbin/fleetfix-vm-init (below) as PID 1, in
  place of systemd. That init loads virtio_console (no udev here: it also makes the
  /dev/virtio-ports/NAME links qemu-ga looks for) and virtio_net, configures the one interface statically,
  and runs qemu-ga the way Debian's qemu-guest-agent.service does (Restart=always, RestartSec=0);
- the disk: the template as an ext4 image (`mkfs.ext4 -d`), shared read-only by every VM as the backing
  file of its own qcow2 overlay (vm/ID/disk.qcow2): a VM's writes are its own and survive a reboot;
- the network: QEMU's user-mode network with `restrict=on` (the guest reaches neither this machine nor
  anything beyond it) plus one `guestfwd` per forwarded port: GUEST_FORWARD_ADDRESS:PORT in the guest is
  relayed (qemuvm_relay.py, a `cmd:` relay, one process per connection) to 127.0.0.1:PORT here, the bed's
  apt repository. The guest has no name server (an empty /etc/resolv.conf).

KVM is not used: nested KVM hangs in early boot on the machines this bed runs on, so QEMU emulates the
CPU (`-accel tcg -cpu max`), and everything in the guest runs many times slower than in a container.
Measured costs are in docs/testbed.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # the test suite imports tests.lab.qemuvm; the qm stand-in puts tests/lab itself on sys.path
    from tests.lab import qga_real
    from tests.lab.container import ContainerError, CtConfig, NodeState
    from tests.lab.template import cache_dir, ensure_template
    from tests.lab.vm import VirtualMachine
except ImportError:
    import qga_real  # type: ignore[no-redef]
    from container import ContainerError, CtConfig, NodeState  # type: ignore[no-redef]
    from template import cache_dir, ensure_template  # type: ignore[no-redef]
    from vm import VirtualMachine  # type: ignore[no-redef]

LAB_DIR = Path(__file__).resolve().parent
QEMU = "/usr/bin/qemu-system-x86_64"
QEMU_IMG = "/usr/bin/qemu-img"
KERNEL_PACKAGE = "linux-image-cloud-amd64"
# Loaded by the initramfs, in this order (their dependencies first): what it takes to see /dev/vda.
INITRAMFS_MODULES = ("virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci", "virtio_blk")
GUEST_FORWARD_ADDRESS = "10.0.2.100"
MARKER = "qemu.json"  # vm/ID/qemu.json: this VM is a real QEMU guest
BOOT_TIMEOUT = 300.0  # generous: TCG on a busy machine is slow (measurements: docs/testbed.md)
DISK_SIZE = "3G"
# qemu-server names a disk's QEMU drive after its config key ("drive-scsi0"); QMP's snapshot commands
# address the disk by that name.
DRIVE_ID = "drive-scsi0"
FSFREEZE_TIMEOUT = 60.0
_SCHEMA = 1  # bump when what goes into the image changes

# PID 1 on the VM's disk. The kernel command line carries the VM's hostname (one disk image serves all).
GUEST_INIT = r"""#!/bin/sh
# The test bed's VM init (tests/lab/qemuvm.py): what systemd and udev would do, as far as a test needs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /dev/pts /dev/shm /run/lock
mount -t devpts -o ptmxmode=0666,mode=620,gid=5 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -o remount,rw /
for word in $(cat /proc/cmdline); do
    case $word in fleetfix.hostname=*) echo "${word#*=}" > /proc/sys/kernel/hostname ;; esac
done
modprobe virtio_console
modprobe virtio_net
# udev's job: /dev/virtio-ports/<port name> -> /dev/vportNpM (qemu-ga opens org.qemu.guest_agent.0).
mkdir -p /dev/virtio-ports
for port in /sys/class/virtio-ports/*; do
    [ -r "$port/name" ] && name=$(cat "$port/name") && [ -n "$name" ] &&
        ln -sf "../${port##*/}" "/dev/virtio-ports/$name"
done
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2
echo "fleetfix-vm: init done" > /dev/console
# qemu-guest-agent.service: ExecStart=-/usr/sbin/qemu-ga, Restart=always, RestartSec=0.
( while :; do /usr/sbin/qemu-ga; sleep 0.1; done ) </dev/null >/dev/console 2>&1 &
trap 'exit 0' TERM
while :; do sleep 2147483647 & wait; done
"""


class QemuError(ContainerError):
    """A VM could not be built, booted or reached (the message names which, with QEMU's own words)."""


@dataclass(frozen=True)
class VmImage:
    directory: Path
    kernel: Path
    initrd: Path
    disk: Path
    kernel_version: str
    build_seconds: float | None
    from_cache: bool


def unavailable_reason() -> str | None:
    """Why real QEMU VMs cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "real QEMU VMs need root"
    missing = [tool for tool in (QEMU, QEMU_IMG) if not os.access(tool, os.X_OK)]
    missing += [tool for tool in ("gcc", "mkfs.ext4", "apt-get", "dpkg-deb", "debootstrap")
                if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK)]
    if missing:
        return (f"real QEMU VMs need {', '.join(missing)} "
                "(apt-get install qemu-system-x86 qemu-utils gcc libc6-dev e2fsprogs debootstrap)")
    if not Path("/usr/lib/x86_64-linux-gnu/libc.a").is_file():
        return "real QEMU VMs need libc6-dev (the initramfs init is linked statically)"
    return None


# --------------------------------------------------------------------------------------------------------
# The image: kernel, initramfs, disk (built once per machine)
# --------------------------------------------------------------------------------------------------------
def _run(argv: list[str], *, timeout: float = 600, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise QemuError(f"{argv[0]}: {error}") from error
    if done.returncode != 0:
        raise QemuError(f"{' '.join(argv[:3])} ... failed (exit {done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


def _kernel_package() -> str:
    """The versioned package behind the cloud-kernel metapackage (apt-cache, this machine's lists)."""
    text = _run(["apt-cache", "depends", KERNEL_PACKAGE])
    match = re.search(r"Depends:\s*(linux-image-\S+-cloud-amd64)", text)
    if not match:
        raise QemuError(f"apt-cache knows no {KERNEL_PACKAGE} (run apt-get update)")
    return match.group(1)


def _module_depends(path: Path) -> list[str]:
    """The `depends=` entry of a module's .modinfo section (what modinfo -F depends prints)."""
    match = re.search(rb"\x00depends=([^\x00]*)\x00", path.read_bytes())
    return [name for name in (match.group(1).decode().split(",") if match else []) if name]


def _modules_in_load_order(modules_dir: Path, wanted: tuple[str, ...]) -> list[Path]:
    files = {path.name.removesuffix(".ko"): path for path in modules_dir.rglob("*.ko")}
    ordered: list[Path] = []

    def visit(name: str) -> None:
        path = files.get(name) or files.get(name.replace("_", "-"))
        if path is None:
            return  # built into the kernel
        if path in ordered:
            return
        for dependency in _module_depends(path):
            visit(dependency)
        ordered.append(path)

    for name in wanted:
        visit(name)
    return ordered


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """An initramfs archive (cpio "newc"): (name, mode, data) each; directories have mode 0o040755."""
    out = bytearray()

    def add(name: str, mode: int, data: bytes, ino: int) -> None:
        encoded = name.encode() + b"\x00"
        header = "070701" + "".join(f"{value:08x}" for value in (
            ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0))
        out.extend(header.encode() + encoded)
        out.extend(b"\x00" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\x00" * (-len(out) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        add(name, mode, data, ino)
    add("TRAILER!!!", 0, b"", len(entries) + 1)
    return bytes(out)


def _image_key() -> str:
    blob = json.dumps([_SCHEMA, GUEST_INIT, (LAB_DIR / "qemuvm_init.c").read_text(), INITRAMFS_MODULES,
                       DISK_SIZE])
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _build_image(staging: Path) -> str:
    template = ensure_template("bookworm-vm").rootfs
    package = _kernel_package()
    downloads = staging / "downloads"
    downloads.mkdir()
    _run(["apt-get", "download", "-q", package], cwd=downloads, timeout=900)
    [deb] = downloads.glob("*.deb")
    unpacked = staging / "kernel-package"
    _run(["dpkg-deb", "-x", str(deb), str(unpacked)])
    [kernel] = (unpacked / "boot").glob("vmlinuz-*")
    version = kernel.name.removeprefix("vmlinuz-")
    shutil.copy2(kernel, staging / "vmlinuz")
    modules_dir = unpacked / "lib/modules" / version

    init = staging / "init"
    _run(["gcc", "-static", "-Os", "-o", str(init), str(LAB_DIR / "qemuvm_init.c")])
    entries: list[tuple[str, int, bytes]] = [("init", 0o100755, init.read_bytes()), ("lib", 0o040755, b""),
                                               ("lib/modules", 0o040755, b"")]
    listed = []
    for module in _modules_in_load_order(modules_dir, INITRAMFS_MODULES):
        entries.append((f"lib/modules/{module.name}", 0o100644, module.read_bytes()))
        listed.append(f"/lib/modules/{module.name}")
    entries.append(("modules.list", 0o100644, ("\n".join(listed) + "\n").encode()))
    (staging / "initrd.img").write_bytes(_cpio_newc(entries))

    # The disk: the template (hard links: mkfs only reads them) plus the kernel's modules and the init.
    root = staging / "root"
    _run(["cp", "-al", "--", str(template), str(root)])
    for replaced in ("etc/resolv.conf", "etc/hostname", "sbin/fleetfix-vm-init"):
        (root / replaced).unlink(missing_ok=True)  # never write through a link into the template
    (root / "etc/resolv.conf").write_text("# no name server: the test bed's VMs reach only forwarded ports\n")
    (root / "etc/hostname").write_text("localhost\n")
    guest_init = root / "sbin/fleetfix-vm-init"
    guest_init.write_text(GUEST_INIT)
    guest_init.chmod(0o755)
    shutil.copytree(modules_dir, root / "lib/modules" / version)
    _run(["chroot", str(root), "depmod", version])  # the guest's own kmod
    disk = staging / "disk.raw"
    _run(["mkfs.ext4", "-q", "-F", "-L", "fleetfix-vm", "-d", str(root), str(disk), DISK_SIZE])
    shutil.rmtree(root)
    shutil.rmtree(unpacked)
    shutil.rmtree(downloads)
    init.unlink()
    return version


def ensure_vm_image(directory: Path | None = None) -> VmImage:
    """The VM image (kernel, initramfs, disk), building it when this machine has none yet."""
    base = directory or cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    target = base / f"vm-bookworm-{_image_key()}"
    with open(base / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per machine, however many sessions ask
        from_cache = (target / "image.json").is_file()
        if not from_cache:
            started = time.monotonic()
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=base))
            try:
                version = _build_image(staging)
                meta = {"kernel_version": version, "build_seconds": round(time.monotonic() - started, 1)}
                (staging / "image.json").write_text(json.dumps(meta))
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    meta = json.loads((target / "image.json").read_text())
    return VmImage(target, target / "vmlinuz", target / "initrd.img", target / "disk.raw",
                   meta["kernel_version"], meta.get("build_seconds"), from_cache)


# --------------------------------------------------------------------------------------------------------
# The VM
# --------------------------------------------------------------------------------------------------------
def is_real(node_dir: str | os.PathLike[str], vmid: int) -> bool:
    return os.path.isfile(os.path.join(os.fspath(node_dir), "vm", str(vmid), MARKER))


class QemuVM(VirtualMachine):
    """A test-bed VM run by QEMU; commands reach it only through its real guest agent."""

    def __repr__(self) -> str:
        return f"QemuVM({self.node.dir}, {self.ctid})"

    @property
    def settings(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.dir / MARKER).read_text())
        return loaded

    @property
    def disk(self) -> Path:
        return self.dir / "disk.qcow2"

    @property
    def qmp_socket(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def agent_installed(self) -> bool:
        return True  # Debian's qemu-guest-agent is on the image's disk

    def agent_running(self) -> bool:
        return qga_real.ping(str(self.agent_socket))

    def qemu_argv(self, *, loadvm: str | None = None) -> list[str]:
        """QEMU's command line; loadvm: start from that internal snapshot's RAM state (`-loadvm`)."""
        settings = self.settings
        image = Path(str(settings["image"]))
        forwards = [int(port) for port in settings.get("forwards", [])]
        relay = LAB_DIR / "qemuvm_relay.py"
        netdev = "user,id=net0,restrict=on" + "".join(
            f",guestfwd=tcp:{GUEST_FORWARD_ADDRESS}:{port}-cmd:/usr/bin/python3 -I -S {relay} {port}"
            for port in forwards)
        extra = [argument for disk in settings.get("disks", [])
                 for argument in ("-drive", f"file={disk},if=virtio,format=raw,readonly=on")]
        return [
            QEMU, "-name", f"vm{self.vmid}", "-accel", "tcg", "-cpu", "max", "-smp", "1",
            "-m", str(settings.get("memory", 1024)), "-nodefaults", "-no-user-config", "-display", "none",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
            "-append", f"console=ttyS0 panic=-1 quiet fleetfix.hostname={self.hostname}",
            "-serial", f"file:{self.console_log}",
            "-drive", f"file={self.disk},if=virtio,format=qcow2,cache=unsafe,id={DRIVE_ID}", *extra,
            "-device", "virtio-serial-pci",
            "-chardev", f"socket,id=qga0,path={self.agent_socket},server=on,wait=off",
            "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0",
            "-qmp", f"unix:{self.qmp_socket},server=on,wait=off",
            "-pidfile", str(self.dir / "qemu.pid"), "-daemonize",
            *(["-loadvm", loadvm] if loadvm is not None else []),
        ]

    def start(self, timeout: float = BOOT_TIMEOUT, *, loadvm: str | None = None) -> int:
        """Boot the VM and wait until its agent answers; returns QEMU's PID. (Real `qm start` returns once
        QEMU runs; the bed waits for the agent so that a test never races the boot.) loadvm: resume the
        RAM state of that snapshot (taken with vmstate) instead of booting."""
        if self.running:
            raise ContainerError(f"VM {self.vmid} already running")
        for stale in (self.agent_socket, self.qmp_socket, self.dir / "qemu.pid", self.console_log):
            stale.unlink(missing_ok=True)
        _run(self.qemu_argv(loadvm=loadvm), timeout=120)  # -daemonize: returns once QEMU is set up
        pid = int((self.dir / "qemu.pid").read_text().strip())
        stat_text = Path(f"/proc/{pid}/stat").read_text()
        start_time = int(stat_text[stat_text.rindex(")") + 2:].split()[19])
        state = {"pid1": pid, "pid1_start": start_time, "launcher": pid, "launcher_start": start_time}
        (self.dir / "run.json").write_text(json.dumps(state))
        self.wait_for_agent(timeout)
        return pid

    def wait_for_agent(self, timeout: float = BOOT_TIMEOUT) -> float:
        """Seconds until the agent answered guest-ping; QemuError (with the console's tail) if it never
        did."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not self.running:
                raise QemuError(f"VM {self.vmid}: QEMU exited while booting: {self.console_tail()}")
            if qga_real.ping(str(self.agent_socket), timeout=3):
                return time.monotonic() - started
            time.sleep(1)
        raise QemuError(f"VM {self.vmid}: no guest agent after {timeout:.0f}s: {self.console_tail()}")

    def console_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.console_log.read_text(errors="replace")[-1500:].strip()
        return "(no console output)"

    def qmp(self, execute: str, arguments: dict[str, object] | None = None, timeout: float = 10) -> object:
        """One QEMU monitor command (capabilities negotiated first); its `return` value."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.qmp_socket))
            stream = sock.makefile("rwb")
            stream.readline()  # the greeting
            messages = ({"execute": "qmp_capabilities"}, {"execute": execute, "arguments": arguments or {}})
            for message in messages:
                stream.write(json.dumps(message).encode() + b"\n")
                stream.flush()
                while True:
                    answer = json.loads(stream.readline())
                    if "event" not in answer:
                        break
            if "error" in answer:
                raise QemuError(f"VM {self.vmid}: QMP {execute}: {answer['error']}")
            return answer.get("return")

    def stop(self, timeout: float = 30.0) -> None:
        """Power off at once (`qm stop`): QEMU ends on SIGTERM; SIGKILL if it lingers."""
        state = self._run_state()
        pid = self.pid1
        if pid is not None and state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.pid1 is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.pid1 is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while self.pid1 is not None:
                    time.sleep(0.05)
        for leftover in (self.dir / "run.json", self.agent_socket, self.qmp_socket):
            leftover.unlink(missing_ok=True)

    # -- commands through the agent (test set-up; what fleetfix uses is the node's `qm`) --------------
    def exec(self, command: list[str], *, input: bytes = b"", check: bool = False, timeout: float = 600.0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        import base64

        variables = env or {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "LANG": "C.UTF-8"}
        argv = ["env", "-i", *(f"{key}={value}" for key, value in variables.items()), *command]
        arguments: dict[str, object] = {"path": "/usr/bin/env", "arg": argv[1:], "capture-output": True}
        if input:
            arguments["input-data"] = base64.b64encode(input).decode()
        started = self._agent("guest-exec", arguments)
        pid = started["pid"]
        deadline = time.monotonic() + timeout
        while True:
            status = self._agent("guest-exec-status", {"pid": pid})
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                raise QemuError(f"VM {self.vmid}: {command[:3]} still running after {timeout:.0f}s")
            time.sleep(0.2)
        out = base64.b64decode(str(status.get("out-data", "")))
        err = base64.b64decode(str(status.get("err-data", "")))
        code = status.get("exitcode")
        returncode = code if isinstance(code, int) else -int(str(status.get("signal", 0)))
        result = subprocess.CompletedProcess(command, returncode, out, err)
        if check and returncode != 0:
            problem = err.decode(errors="replace").strip()[-800:]
            raise QemuError(f"VM {self.vmid}: {command[:3]} exit {returncode}: {problem}")
        return result

    def _agent(self, execute: str, arguments: dict[str, object]) -> dict[str, object]:
        answer = qga_real.command(str(self.agent_socket), execute, arguments, timeout=60)
        result = answer.get("return")
        if not isinstance(result, dict):
            raise QemuError(f"VM {self.vmid}: {execute}: {answer.get('error')}")
        return result

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        payload = data.encode() if isinstance(data, str) else data
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        self.exec(["/bin/sh", "-c", script, "sh", path, format(mode, "o")], input=payload, check=True)

    def copy_upper_to(self, destination: Path) -> None:
        raise QemuError(f"VM {self.vmid}: a real VM's snapshots are qcow2 snapshots (snapshot_disk), "
                        "not copies of an upper dir")

    def restore_upper_from(self, source: Path) -> None:
        raise QemuError(f"VM {self.vmid}: a real VM's snapshots are qcow2 snapshots (rollback_disk), "
                        "not copies of an upper dir")

    # -- snapshots: internal qcow2 snapshots, as qemu-server takes them on a `dir` storage -------------
    # qemu-server (read at e6352be): PVE::QemuServer::qemu_volume_snapshot asks do_snapshots_type; for a
    # qcow2 volume that is "internal" while the VM runs (QMP blockdev-snapshot-internal-sync on the drive
    # "drive-<key>") and "storage" while it is stopped (pve-storage's Plugin: qemu-img snapshot -c). Before
    # a disk-only snapshot of a running VM with the agent enabled it freezes the guest's file systems
    # (QemuConfig.pm __snapshot_check_freeze_needed / __snapshot_freeze: guest-fsfreeze-freeze, thawed
    # afterwards; a failed freeze is a warning). Rollback is always offline: vm_stop, then
    # volume_snapshot_rollback (qemu-img snapshot -a). Deletion mirrors creation
    # (blockdev-snapshot-delete-internal-sync while running, qemu-img snapshot -d while stopped).
    #
    # With RAM state (`--vmstate 1`) PVE's own QEMU saves the RAM into a separate state volume
    # (savevm-start/savevm-end, PVE patches) and rollback starts the VM with `-loadstate FILE`. Stock QEMU
    # has neither: here HMP `savevm NAME` writes the RAM state into the qcow2's internal snapshot (together
    # with the disk's) and the rollback starts QEMU with `-loadvm NAME`. What the guest sees is the same:
    # it resumes where the snapshot was taken, its RAM (tmpfs, processes) included.
    def snapshot_disk(self, name: str, *, vmstate: bool = False) -> list[str]:
        """Take snapshot `name` of the disk (and, running with vmstate, the RAM); PVE's warnings, if any."""
        warnings: list[str] = []
        if not self.running:
            _run([QEMU_IMG, "snapshot", "-c", name, str(self.disk)])
            return warnings
        if vmstate:
            said = self.qmp("human-monitor-command", {"command-line": f"savevm {name}"}, timeout=600)
            if isinstance(said, str) and said.strip():  # HMP reports its errors as text
                raise QemuError(f"VM {self.vmid}: savevm {name}: {said.strip()}")
            return warnings
        frozen = False
        try:
            answer = qga_real.command(str(self.agent_socket), "guest-fsfreeze-freeze",
                                      timeout=FSFREEZE_TIMEOUT)
            frozen = "return" in answer
            if not frozen:
                warnings.append(f"guest-fsfreeze-freeze: {answer.get('error')}")
        except qga_real.AgentError as error:
            warnings.append(f"guest-fsfreeze-freeze: {error}")
        try:
            self.qmp("blockdev-snapshot-internal-sync", {"device": DRIVE_ID, "name": name}, timeout=300)
        finally:
            if frozen:
                try:
                    qga_real.command(str(self.agent_socket), "guest-fsfreeze-thaw", timeout=FSFREEZE_TIMEOUT)
                except qga_real.AgentError as error:
                    warnings.append(f"guest-fsfreeze-thaw problems - {error}")
        return warnings

    def rollback_disk(self, name: str) -> None:
        """The disk back to snapshot `name` (the VM must be stopped, as qemu-server stops it first)."""
        if self.running:
            raise QemuError(f"VM {self.vmid} is running")
        _run([QEMU_IMG, "snapshot", "-a", name, str(self.disk)])

    def delete_disk_snapshot(self, name: str) -> None:
        if self.running:
            self.qmp("blockdev-snapshot-delete-internal-sync", {"device": DRIVE_ID, "name": name},
                     timeout=300)
        else:
            _run([QEMU_IMG, "snapshot", "-d", name, str(self.disk)])

    def disk_snapshots(self) -> dict[str, int]:
        """The qcow2's internal snapshots: name -> size of its RAM state in bytes (0: disk only). Read
        with `qemu-img info -U`, which works while QEMU holds the image."""
        info = json.loads(_run([QEMU_IMG, "info", "-U", "--output=json", str(self.disk)]))
        return {str(entry["name"]): int(entry.get("vm-state-size", 0)) for entry in info.get("snapshots", [])}

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.conf_path.unlink(missing_ok=True)


def create_qemu_vm(
    node: NodeState, vmid: int, *, name: str | None = None, forwards: tuple[int, ...] = (),
    memory: int = 1024, image: VmImage | None = None, disks: tuple[Path, ...] = (),
) -> QemuVM:
    """A stopped real VM: its config (agent enabled), a qcow2 disk over the shared image, and the ports of
    this machine's loopback its guest may reach (each at GUEST_FORWARD_ADDRESS:PORT). disks: raw images
    attached read-only after its own (/dev/vdb, ...: ensure_tools_disk())."""
    owner = node.id_owner(vmid)
    if owner is not None:
        raise ContainerError(f"unable to create VM {vmid} - {owner} {vmid} already exists on node "
                             f"'{node.name}'")
    image = image or ensure_vm_image()
    machine = QemuVM(node, vmid)
    shutil.rmtree(machine.dir, ignore_errors=True)
    machine.dir.mkdir(parents=True)
    _run([QEMU_IMG, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image.disk), str(machine.disk)])
    name = name or f"vm{vmid}"
    (machine.dir / MARKER).write_text(json.dumps({"image": str(image.directory), "forwards": list(forwards),
                                                  "memory": memory, "disks": [str(d) for d in disks]}))
    main = {"agent": "1", "boot": "order=scsi0", "cores": "1", "memory": str(memory), "name": name,
            "ostype": "l26", "scsi0": f"local:{vmid}/vm-{vmid}-disk-0.qcow2,size={DISK_SIZE}",
            "scsihw": "virtio-scsi-single"}
    machine.save_config(CtConfig(main, {}))
    return machine


# --------------------------------------------------------------------------------------------------------
# The tools disk: this machine's toolchain and real torch, for extension builds inside a VM
# --------------------------------------------------------------------------------------------------------
# The cloud kernel has no 9p, and virtiofs needs virtiofsd; a second virtio disk needs nothing: an ext4
# image (mkfs.ext4 -d) of this machine's /usr (Debian 12, as the guest: gcc/g++ 12, python3.11's headers,
# /usr/local/cuda-13.0's real nvcc), less /usr/share and /usr/lib/jvm, plus the real torch venv. The guest
# lays it over its own /usr and /opt/fleetfix-torch-VERSION with overlayfs, the upper dirs on its own disk,
# so pip can install into the venv and the disk image stays read-only and shared.
TOOLS_TORCH_VENV = Path("/opt/fleetfix-torch-2.14.1")
TOOLS_NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
TOOLS_SIZE = "14G"
_TOOLS_SCHEMA = 1
_TOOLS_MOUNT = f"""set -e
mkdir -p /mnt/fleetfix-tools /var/lib/fleetfix-tools/usr /var/lib/fleetfix-tools/usr.work \\
    /var/lib/fleetfix-tools/venv /var/lib/fleetfix-tools/venv.work {TOOLS_TORCH_VENV}
mount -o ro /dev/vdb /mnt/fleetfix-tools
modprobe overlay
mount -t overlay overlay -o lowerdir=/mnt/fleetfix-tools/usr:/usr,upperdir=/var/lib/fleetfix-tools/usr,\\
workdir=/var/lib/fleetfix-tools/usr.work /usr
mount -t overlay overlay -o lowerdir=/mnt/fleetfix-tools{TOOLS_TORCH_VENV},\\
upperdir=/var/lib/fleetfix-tools/venv,workdir=/var/lib/fleetfix-tools/venv.work {TOOLS_TORCH_VENV}
"""


def tools_mount_script() -> str:
    """The guest's script that lays the tools disk (/dev/vdb) over its /usr and the torch venv. It also
    adds this machine's /etc/alternatives links that the guest lacks (c++ and cc point through them: what
    update-alternatives does when the compilers are installed)."""
    links = []
    for link in sorted(Path("/etc/alternatives").iterdir()):
        target = os.readlink(link) if link.is_symlink() else ""
        safe = re.fullmatch(r"[A-Za-z0-9._+-]+", link.name)
        if safe and re.fullmatch(r"/usr/s?bin/[A-Za-z0-9._+-]+", target):
            name = f"/etc/alternatives/{link.name}"
            links.append(f"[ -e {name} ] || ln -s {target} {name}")
    return _TOOLS_MOUNT + "\n".join(links) + "\n"


def tools_unavailable_reason() -> str | None:
    """Why the tools disk cannot be built here, or None."""
    for needed in (TOOLS_TORCH_VENV / "bin" / "python", TOOLS_NVCC):
        if not needed.exists():
            return f"{needed} is missing (the tools disk carries this machine's real torch and nvcc 13.0)"
    return None


def _tools_key() -> str:
    parts: list[object] = [_TOOLS_SCHEMA, TOOLS_SIZE]
    for marker in (TOOLS_TORCH_VENV / "pyvenv.cfg", TOOLS_NVCC.parent.parent / "version.json",
                   Path("/usr/bin/x86_64-linux-gnu-g++-12")):
        parts.append(marker.stat().st_size if marker.exists() else None)
        parts.append(int(marker.stat().st_mtime) if marker.exists() else None)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:10]


def ensure_tools_disk(directory: Path | None = None) -> Path:
    """The tools disk image (built once per machine and key, ~5 min: ~9 GB written)."""
    base = directory or cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    target = base / f"vm-tools-{_tools_key()}"
    with open(base / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "tools.raw").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=base))
            try:
                root = staging / "root"
                (root / TOOLS_TORCH_VENV.parent.relative_to("/")).mkdir(parents=True)
                # Hard links: mkfs.ext4 -d only reads them.
                _run(["cp", "-al", "--", "/usr", str(root / "usr")], timeout=1800)
                for dropped in ("share", "lib/jvm"):
                    shutil.rmtree(root / "usr" / dropped, ignore_errors=True)
                venv = root / TOOLS_TORCH_VENV.relative_to("/")
                _run(["cp", "-al", "--", str(TOOLS_TORCH_VENV), str(venv)], timeout=1800)
                image = staging / "tools.raw"
                _run(["mkfs.ext4", "-q", "-F", "-L", "fleetfix-tools", "-d", str(root), str(image),
                      TOOLS_SIZE], timeout=3600)
                shutil.rmtree(root)
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target / "tools.raw"
