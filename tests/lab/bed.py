"""The test bed in one object: a client key, N Proxmox-like nodes (sshd + `pct`/`qm`/`pvesh` stand-ins) and
their overlay containers and VMs, all torn down by `Lab.close()`.

    with Lab(tmp_path, nodes=2) as lab:
        ct = lab.add_container("pve1", 200, name="gpu-a")
        lab.ssh("pve1", ["pct", "exec", "200", "--", "cat", "/etc/os-release"])
        vm = lab.add_vm("pve1", 300, name="gpu-vm")
        lab.ssh("pve1", ["qm", "guest", "exec", "300", "--", "cat", "/etc/os-release"])

Nodes listen on distinct loopback addresses (127.0.0.2, 127.0.0.3, ...) with their own host keys, recorded in
`lab.known_hosts` in OpenSSH's `[addr]:port` form. Each node's state (containers, configs, the pct call log)
lives under `<root>/nodes/<name>/pve`; its sshd files under `<root>/nodes/<name>/sshd`.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeVar

from tests.lab import vm as vmlib
from tests.lab.container import NODE_DIR_ENV, Container, NodeState
from tests.lab.sshd import SshNode, keygen, start_node
from tests.lab.vm import VirtualMachine

LAB_DIR = Path(__file__).resolve().parent
NODE_PYTHON = "/usr/bin/python3"  # the node's own Debian python, not whatever runs pytest

ContainerSetup = Callable[[Container], object] | str


class _Guest(Protocol):
    @property
    def running(self) -> bool: ...
    def start(self) -> object: ...
    def stop(self) -> object: ...
    def sh(self, command: str) -> object: ...
    def destroy(self) -> object: ...


Guest = TypeVar("Guest", bound=_Guest)


def _brought_up(guest: Guest, *, running: bool, setup: Callable[[Guest], object] | str | None) -> Guest:
    """guest started for its setup (a shell line, or a function of it), left running or stopped as asked;
    destroyed if any of that fails, so a test never inherits half a guest."""
    try:
        if running or setup is not None:
            guest.start()
        if isinstance(setup, str):
            guest.sh(setup)
        elif setup is not None:
            setup(guest)
        if not running and guest.running:
            guest.stop()
    except BaseException:
        guest.destroy()
        raise
    return guest


@dataclass
class LabNode:
    ssh: SshNode
    state: NodeState

    @property
    def name(self) -> str:
        return self.ssh.name

    @property
    def address(self) -> str:
        return self.ssh.address

    @property
    def port(self) -> int:
        return self.ssh.port

    def container(self, ctid: int) -> Container:
        return self.state.container(ctid)

    def pct_calls(self) -> list[list[str]]:
        """Every `pct` invocation on this node so far (argv without the program name)."""
        return self.state.pct_calls()

    def pct_exec_count(self) -> int:
        return sum(1 for argv in self.pct_calls() if argv[:1] == ["exec"])

    def vm(self, vmid: int) -> VirtualMachine:
        return vmlib.vm(self.state, vmid)

    def qm_calls(self) -> list[list[str]]:
        """Every `qm` invocation on this node so far (argv without the program name)."""
        log = self.state.dir / "qm.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]


def _install_wrapper(sbin_dir: Path, command: str, script: Path, node_dir: Path) -> None:
    wrapper = sbin_dir / command
    python = f"{NODE_PYTHON} -I -S"  # no PYTHON* variables, user site or .pth files: fast, same everywhere
    fast_exec = ""
    if command == "pct":  # the call every probe and task pays for: its own lean module (pct_exec.py)
        lean = shlex.quote(str(script.with_name("pct_exec.py")))
        fast_exec = f'case "${{1:-}}" in exec) shift; exec {python} {lean} "$@" ;; esac\n'
    wrapper.write_text(
        "#!/bin/sh\n"
        # Like PVE's own tools, root only: a login that is not root needs sudo (issue 18). The wording is
        # the stand-in's, not PVE's.
        f'[ "$(id -u)" = 0 ] || {{ echo "{command}: permission denied: root only" >&2; exit 1; }}\n'
        f"export {NODE_DIR_ENV}={shlex.quote(str(node_dir))}\n"
        f"{fast_exec}"
        f'exec {python} {shlex.quote(str(script))} "$@"\n'
    )
    wrapper.chmod(0o755)


class Lab:
    def __init__(self, root: Path, *, nodes: int | Sequence[str] = 1) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.client_key = root / "client_ed25519"
        self.client_public_key = keygen(self.client_key, "fleetfix-lab-client")
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("")
        self.nodes: dict[str, LabNode] = {}
        names = [f"pve{index + 1}" for index in range(nodes)] if isinstance(nodes, int) else list(nodes)
        try:
            for name in names:
                self.add_node(name)
        except BaseException:
            self.close()
            raise

    # -- nodes ---------------------------------------------------------------------------------------
    def add_node(self, name: str, *, address: str | None = None) -> LabNode:
        if name in self.nodes:
            raise ValueError(f"node {name} already exists")
        address = address or f"127.0.0.{len(self.nodes) + 2}"
        node_root = self.root / "nodes" / name
        state = NodeState.create(node_root / "pve", name)
        ssh = start_node(
            node_root / "sshd", name=name, address=address, authorized_keys=[self.client_public_key]
        )
        node = LabNode(ssh, state)
        self.nodes[name] = node
        for command in ("pct", "qm", "pvesh"):
            _install_wrapper(ssh.sbin_dir, command, LAB_DIR / f"{command}.py", state.dir)
        with self.known_hosts.open("a") as handle:
            handle.write(ssh.known_hosts_line + "\n")
        return node

    def node(self, name: str | LabNode | None = None) -> LabNode:
        if isinstance(name, LabNode):
            return name
        if name is None:
            return next(iter(self.nodes.values()))
        return self.nodes[name]

    # -- containers ----------------------------------------------------------------------------------
    def add_container(
        self,
        node: str | LabNode | None = None,
        ctid: int = 200,
        *,
        name: str | None = None,
        running: bool = True,
        tags: Iterable[str] = (),
        setup: ContainerSetup | None = None,
        config: dict[str, str] | None = None,
        template: Path | tuple[Path, ...] | None = None,
        share: tuple[str, ...] = (),
        real_lxc: bool = False,
    ) -> Container:
        """Create (and by default start) CT ctid on node. setup: a callable(ct) or a sh script run inside
        the running container before it is handed over (a stopped CT is started for it, then stopped).
        template: a root filesystem (tests/lab/template.py) instead of an overlay of this machine's /, or a
        stack of layers over one, top first (tests/lab/realtorch.py's torch layer over the Debian 13 tree).
        share: host paths the container sees although they are hidden by default (the real-torch venv).
        real_lxc: run it with real LXC (the node's `pct exec` is then lxc-attach: tests/lab/lxcreal.py)."""
        state = self.node(node).state
        ct = state.create_container(ctid, hostname=name, tags=tuple(tags), extra_config=config,
                                    template=template, share=share, real_lxc=real_lxc)
        return _brought_up(ct, running=running, setup=setup)

    def remove_container(self, node: str | LabNode | None, ctid: int) -> None:
        self.node(node).container(ctid).destroy()

    # -- VMs -----------------------------------------------------------------------------------------
    def add_vm(
        self,
        node: str | LabNode | None = None,
        vmid: int = 300,
        *,
        name: str | None = None,
        running: bool = True,
        tags: Iterable[str] = (),
        agent: bool = True,
        agent_installed: bool = True,
        setup: ContainerSetup | None = None,
        config: dict[str, str] | None = None,
    ) -> VirtualMachine:
        """Create (and by default start) VM vmid on node: `agent: 1` in its config unless agent=False, the
        guest agent installed in it unless agent_installed=False. setup: as for add_container (it runs
        through nsenter, not the agent, so it works on an agent-less VM too)."""
        state = self.node(node).state
        machine = vmlib.create_vm(state, vmid, name=name, tags=tuple(tags), agent=agent,
                                  agent_installed=agent_installed, extra_config=config)
        return _brought_up(machine, running=running, setup=setup)

    def add_qemu_vm(
        self,
        node: str | LabNode | None = None,
        vmid: int = 300,
        *,
        name: str | None = None,
        forwards: tuple[int, ...] = (),
        running: bool = True,
        setup: ContainerSetup | None = None,
    ) -> VirtualMachine:
        """A real QEMU VM (tests/lab/qemuvm.py) with Debian's qemu-guest-agent: booted (slow under TCG, see
        docs/testbed.md) unless running=False. forwards: ports of this machine's loopback (the bed's apt
        repository) its guest reaches at qemuvm.GUEST_FORWARD_ADDRESS. setup runs through the agent."""
        from tests.lab.qemuvm import create_qemu_vm

        machine = create_qemu_vm(self.node(node).state, vmid, name=name, forwards=forwards)
        return _brought_up(machine, running=running, setup=setup)

    # -- talking to nodes with plain OpenSSH ---------------------------------------------------------
    def ssh_argv(self, node: str | LabNode | None, command: str | Sequence[str]) -> list[str]:
        """OpenSSH client argv; a sequence command is shell-quoted once for the remote shell."""
        target = self.node(node)
        remote = command if isinstance(command, str) else shlex.join(command)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.client_key),
            "-p",
            str(target.port),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            # OpenSSH 9's default sntrup761 key exchange costs ~100 ms per connection on this kind of
            # machine; the bed only needs a real SSH session, not post-quantum crypto.
            "-o",
            "KexAlgorithms=curve25519-sha256",
            f"root@{target.address}",
            remote,
        ]

    def ssh(
        self,
        node: str | LabNode | None,
        command: str | Sequence[str],
        *,
        input: bytes = b"",
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self.ssh_argv(node, command), input=input, capture_output=True, timeout=timeout)

    # -- teardown ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every container (also ones started through `pct start`), every sshd, remove the state."""
        problems: list[str] = []
        for node in self.nodes.values():
            for ct in [*node.state.containers(), *vmlib.vms(node.state)]:
                try:
                    ct.stop()
                except Exception as error:  # keep tearing down the rest
                    problems.append(f"{node.name}/{ct.ctid}: {error}")
            try:
                node.ssh.stop()
            except Exception as error:
                problems.append(f"{node.name} sshd: {error}")
        self.nodes.clear()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root)
        if problems:
            print("test bed teardown problems: " + "; ".join(problems), file=sys.stderr)

    def __enter__(self) -> Lab:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
