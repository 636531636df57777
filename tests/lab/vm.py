"""Test-bed Proxmox VMs: the containers' overlay mechanism under a VM's name, plus a guest agent.

The point of a test-bed VM is `qm`'s interface, not virtualisation: a VM here is a tests/lab/container.py
guest (an overlay of this machine's /, its own mount/pid/uts/ipc namespaces, same kernel) whose state lives
under ``<node_dir>/vm/<ID>/`` and whose config is ``<node_dir>/qemu-server/<ID>.conf``, in the format of
``/etc/pve/qemu-server/<ID>.conf`` (``agent: 1`` enables the guest agent channel, ``name:``, disks such as
``scsi0: local-lvm:vm-ID-disk-0,size=32G``).

What makes it a VM to fleetfix is how commands reach it: only through the guest agent, as `qm guest exec`
does. The agent is tests/lab/qga.py, installed in the guest as /usr/sbin/qemu-ga (in its upper dir, so it
is part of the guest's disk: snapshots keep it, a guest without it has no agent). Starting the VM starts
the agent inside it, when installed, with the listening end of ``<vm dir>/qga.sock`` as fd 3; `qm` (the
stand-in in qm.py) connects there, like PVE connects to /var/run/qemu-server/ID.qga. A VM whose config has
no ``agent:`` line, or whose guest has no agent, answers `qm guest exec` the way PVE does.

Standard library only: the `qm` stand-in imports this with the node's /usr/bin/python3.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from pathlib import Path

try:  # the test suite imports tests.lab.vm; the qm stand-in puts tests/lab itself on sys.path
    from tests.lab.container import Container, ContainerError, CtConfig, NodeState, seed_hermetic_upper
    from tests.lab.qga_client import agent_enabled, ping
except ImportError:
    from container import Container, ContainerError, CtConfig, NodeState, seed_hermetic_upper  # type: ignore
    from qga_client import agent_enabled, ping  # type: ignore

AGENT_PATH = "/usr/sbin/qemu-ga"  # where the qemu-guest-agent package puts it
AGENT_SOURCE = Path(__file__).resolve().with_name("qga.py")


class VirtualMachine(Container):
    state_subdir = "vm"
    conf_subdir = "qemu-server"

    def __repr__(self) -> str:
        return f"VirtualMachine({self.node.dir}, {self.ctid})"

    @property
    def vmid(self) -> int:
        return self.ctid

    @property
    def name(self) -> str:
        """PVE's name for it: `name:` from the config, else "VM <id>" (QemuServer::vmstatus)."""
        return self.config().main.get("name") or f"VM {self.ctid}"

    @property
    def hostname(self) -> str:
        return self.config().main.get("name") or f"vm{self.ctid}"

    # -- the guest agent ------------------------------------------------------------------------------
    @property
    def agent_socket(self) -> Path:
        return self.dir / "qga.sock"

    @property
    def agent_configured(self) -> bool:
        """The config has an `agent:` line (what `qm guest exec` checks first: defined, not enabled)."""
        return "agent" in self.config().main

    @property
    def agent_enabled(self) -> bool:
        """The agent channel exists: `agent: 1` or `agent: enabled=1,...` (PVE's parse_guest_agent)."""
        return agent_enabled(self.config().main.get("agent"))

    @property
    def agent_installed(self) -> bool:
        return (self.upper_dir / AGENT_PATH.lstrip("/")).is_file()

    def install_agent(self) -> None:
        """Put the agent on the guest's disk (as installing qemu-guest-agent would); a running VM starts
        it at once (as the package's postinst starts the service)."""
        self.write_file(AGENT_PATH, AGENT_SOURCE.read_bytes(), mode=0o755)
        if self.running:
            self.start_agent()

    def start_agent(self) -> None:
        """Start the agent inside the running VM, detached (its own session, re-parented to init)."""
        pid1 = self.pid1
        if pid1 is None:
            raise ContainerError(f"VM {self.ctid} is not running")
        with contextlib.suppress(FileNotFoundError):
            self.agent_socket.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.agent_socket))
            listener.listen(16)
            argv = self.nsenter_argv(["/usr/bin/python3", "-I", "-S", AGENT_PATH])
            _spawn_detached(argv, listener.fileno(), self.dir / "qga.log")
        finally:
            listener.close()  # only the agent holds it now: when it dies, connecting is refused

    def agent_running(self) -> bool:
        """What qm's guest-ping finds: something answers on the socket."""
        return ping(self.agent_socket)

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> int:
        pid1 = super().start(timeout)
        if self.agent_enabled and self.agent_installed:
            self.start_agent()
        return pid1

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)  # the agent is in the VM's PID namespace: it died with PID 1
        with contextlib.suppress(FileNotFoundError):
            self.agent_socket.unlink()


def _spawn_detached(argv: list[str], listen_fd: int, log_path: Path) -> None:
    """Run argv in a session of its own, not our child, with listen_fd as its fd 3."""
    middle = os.fork()
    if middle == 0:  # pragma: no cover - the child
        try:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                if listen_fd == 3:  # dup2 onto itself would keep close-on-exec
                    os.set_inheritable(3, True)
                else:
                    os.dup2(listen_fd, 3)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.closerange(4, 1024)
                os.execv(argv[0], argv)
        finally:
            os._exit(0)
    os.waitpid(middle, 0)


# --------------------------------------------------------------------------------------------------------
# The node's VMs (NodeState knows containers; these add its VMs, sharing one id space with them)
# --------------------------------------------------------------------------------------------------------
def vmids(node: NodeState) -> list[int]:
    folder = node.dir / "qemu-server"
    return sorted(int(path.stem) for path in folder.glob("*.conf") if path.stem.isdigit())


def vm(node: NodeState, vmid: int) -> VirtualMachine:
    """The node's VM vmid: a real QEMU guest (tests/lab/qemuvm.py) when it was made one, else the stand-in."""
    if (node.dir / "vm" / str(vmid) / "qemu.json").is_file():
        try:  # imported here: qemuvm imports this module
            from tests.lab.qemuvm import QemuVM
        except ImportError:
            from qemuvm import QemuVM  # type: ignore[no-redef]
        return QemuVM(node, vmid)
    return VirtualMachine(node, vmid)


def vms(node: NodeState) -> list[VirtualMachine]:
    return [vm(node, vmid) for vmid in vmids(node)]


def create_vm(
    node: NodeState,
    vmid: int,
    *,
    name: str | None = None,
    tags: tuple[str, ...] = (),
    agent: bool = True,
    agent_installed: bool = True,
    extra_config: dict[str, str] | None = None,
) -> VirtualMachine:
    """A stopped VM: config (with `agent: 1` unless agent=False) and a hermetic disk, the agent installed
    in it unless agent_installed=False. An empty value in extra_config drops that key (`name: ""`: a VM
    without a name)."""
    machine = VirtualMachine(node, vmid)
    owner = node.id_owner(vmid)
    if owner is not None:
        raise ContainerError(f"unable to create VM {vmid} - {owner} {vmid} already exists on node "
                             f"'{node.name}'")
    name = name or f"vm{vmid}"
    shutil.rmtree(machine.dir, ignore_errors=True)
    machine.dir.mkdir(parents=True)
    seed_hermetic_upper(machine.upper_dir, name)
    main = {
        "boot": "order=scsi0",
        "cores": "2",
        "memory": "4096",
        "name": name,
        "ostype": "l26",
        "scsi0": f"local-lvm:vm-{vmid}-disk-0,size=32G",
        "scsihw": "virtio-scsi-single",
    }
    if agent:
        main["agent"] = "1"
    if tags:
        main["tags"] = ";".join(tags)
    main.update(extra_config or {})
    machine.save_config(CtConfig({key: value for key, value in sorted(main.items()) if value}, {}))
    if agent_installed:
        machine.install_agent()
    return machine
