"""The local lab behind `scripts/lab.sh`: the test bed, kept running in the background for a person to try
every command of the README and docs/quickstart.md against.

    python3 -m tests.lab.cli up [--no-healthy] [--real-torch] [--vm K]   # start (daemonised), write inventory
    python3 -m tests.lab.cli status              # is it running, and where
    python3 -m tests.lab.cli env                 # `export LAB_INVENTORY=... REPO_BASE=...` lines, for eval
    python3 -m tests.lab.cli down                # stop everything it started, remove its state

What runs: one Proxmox-like node "pve1" (OpenSSH sshd on 127.0.0.2, with the `pct`/`qm`/`pvesh` stand-ins),
three LXC-like containers and one VM on it, and a signed NVIDIA-style apt repository on 127.0.0.1 (see
docs/testbed.md):

    CT 200 train-a   the problem case: torch 2.11.0+cu128, fla, no causal_conv1d, no nvcc, no NVIDIA repo
    CT 201 train-b   the same
    CT 202 infer-a   healthy: the matching toolkit and a built causal_conv1d (left out with --no-healthy)
    CT 203 train-cu130  with --real-torch: the real torch 2.14.1 (CUDA 13.0 build) in a venv, no toolkit;
                     the repo then also carries the real nvcc 13.0, so extensions really compile there
    VM 300 gpu-vm    the problem case in a VM, reached only through its guest agent (`qm guest exec`):
                     a real QEMU guest (tests/lab/qemuvm.py: its own kernel under TCG, Debian's
                     qemu-guest-agent) where QEMU can run here, else the stand-in VM (tests/lab/vm.py);
                     --vm real|stand-in chooses. The real one reaches the repo through QEMU's user network
                     (GUEST_FORWARD_ADDRESS), so its inventory entry carries its own cuda_repo_base.

--real-torch needs this machine's /usr/local/cuda-13.0 (packaged into the repo's cuda-*-13-0 debs) and
builds two caches the e2e tests share: the torch venv (/opt/fleetfix-torch-2.14.1, ~1 min from the local
package index) and the repo (/opt/fleetfix-test-cache/aptrepo, a few minutes the first time).

Everything lives under the lab directory ($FLEETFIX_LAB_DIR, default /var/lib/fleetfix-lab): the
inventory, the client key, known_hosts, the node and container state, `lab.pid` and `lab.json`. The
`serve` process owns it all; `down` sends it SIGTERM and it tears down what it started. If it died hard,
`down` still stops the containers, the VM (QEMU too) and sshd by the PIDs recorded in the state, then
removes the directory. Containers and sshd keep their mounts in private mount namespaces, so stopping
them leaves no mount behind.

`build_lab` is also what tests/e2e/test_docs_tutorial.py uses, so the docs are checked against this lab.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.lab import qemuvm
from tests.lab import vm as vmlib
from tests.lab.aptrepo import REAL_CUDA_13_0, AptRepo, build_repo, serve_repo
from tests.lab.bed import Lab
from tests.lab.container import Container, NodeState
from tests.lab.realtorch import cache_root, ensure_real_torch, venv_path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LAB_DIR = Path("/var/lib/fleetfix-lab")
LAB_DIR_ENV = "FLEETFIX_LAB_DIR"
START_TIMEOUT = 180.0  # seconds `up` waits for the lab (a first start builds the repo: a few seconds)
REAL_TORCH_START_TIMEOUT = 1800.0  # a first --real-torch start also builds the torch venv and the 13.0 debs
# A real VM boots under TCG (slow on a busy machine: qemuvm.BOOT_TIMEOUT) and a first start builds its image.
REAL_VM_START_TIMEOUT = 900.0
STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class LabContainer:
    ctid: int
    name: str
    tags: tuple[str, ...]
    scenario: str  # "problem" | "healthy" | "real-torch"
    python: str | None = None  # the inventory's `python` var, when not the container's python3


PROBLEM_CONTAINERS = (
    LabContainer(200, "train-a", ("training",), "problem"),
    LabContainer(201, "train-b", ("training",), "problem"),
)
HEALTHY_CONTAINER = LabContainer(202, "infer-a", ("inference",), "healthy")
REAL_TORCH_CONTAINER = LabContainer(
    203, "train-cu130", ("real-torch",), "real-torch", python=str(venv_path() / "bin" / "python")
)


# The lab's VM: which kind runs it, and the words `up` and `status` use for each.
VM_REAL = "real"
VM_STAND_IN = "stand-in"
VM_KINDS = {
    VM_REAL: "real QEMU VM: its own kernel under TCG, Debian's qemu-guest-agent",
    VM_STAND_IN: "stand-in VM: a namespace guest behind the bed's guest-agent stand-in",
}


@dataclass(frozen=True)
class LabVm:
    vmid: int
    name: str
    tags: tuple[str, ...]
    kind: str  # VM_REAL | VM_STAND_IN


LAB_VM_ID, LAB_VM_NAME, LAB_VM_TAGS = 300, "gpu-vm", ("vm",)


def vm_kind(requested: str = "auto") -> str:
    """The kind of VM the lab gets: the real one where QEMU can run here, unless a kind is asked for."""
    if requested != "auto":
        return requested
    return VM_REAL if qemuvm.unavailable_reason() is None else VM_STAND_IN


# A small CUDA extension of our own (one .cu kernel) that compiles in about a minute on 2 cores; the
# real-torch container gets its source at TINY_EXTENSION_IN_CT.
TINY_EXTENSION_SOURCE = REPO_ROOT / "tests" / "fixtures" / "extensions" / "fleetfix-tiny-ext"
TINY_EXTENSION_IN_CT = "/root/src/fleetfix-tiny-ext"


@dataclass
class LabInfo:
    """What `up` prints and `status` reads back (lab.json)."""

    pid: int
    lab_dir: str
    inventory: str
    repo_base: str
    node_address: str
    node_port: int
    containers: list[str]
    vms: list[str] = field(default_factory=list)

    def exports(self) -> str:
        return f"export LAB_INVENTORY={self.inventory}\nexport REPO_BASE={self.repo_base}\n"


# --- building the lab (shared with the docs test) ------------------------------------------------------
@dataclass
class RunningLab:
    lab: Lab
    repo: AptRepo
    inventory: Path
    containers: tuple[LabContainer, ...]
    vms: tuple[LabVm, ...] = ()

    def close(self) -> None:
        try:
            self.lab.close()
        finally:
            self.repo.stop()


def lab_containers(healthy: bool, real_torch: bool = False) -> tuple[LabContainer, ...]:
    return (PROBLEM_CONTAINERS + ((HEALTHY_CONTAINER,) if healthy else ())
            + ((REAL_TORCH_CONTAINER,) if real_torch else ()))


def prerequisite_problems(healthy: bool, real_torch: bool = False, vm: str | None = None) -> list[str]:
    """What this machine lacks for the lab, each with the package that provides it."""
    problems = [] if os.geteuid() == 0 else ["run as root (sshd on loopback, namespaces, overlay mounts)"]
    tools = {
        "/usr/sbin/sshd": "openssh-server", "ssh-keygen": "openssh-client", "unshare": "util-linux",
        "nsenter": "util-linux", "dpkg-scanpackages": "dpkg-dev", "apt-ftparchive": "apt-utils",
        "gpg": "gnupg", "dpkg-deb": "dpkg", "/usr/bin/python3": "python3",
    }
    if healthy:
        tools["cc"] = "gcc (or pass --no-healthy)"
    for tool, package in tools.items():
        found = os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool) is not None
        if not found:
            problems.append(f"{tool} is missing: apt-get install {package}")
    if real_torch and not (REAL_CUDA_13_0 / "bin" / "nvcc").is_file():
        problems.append(f"{REAL_CUDA_13_0}/bin/nvcc is missing: --real-torch packages that CUDA 13.0")
    if vm == VM_REAL:
        reason = qemuvm.unavailable_reason()
        if reason is not None:
            problems.append(f"{reason} (or pass --vm stand-in)")
    return problems


def add_tiny_extension_source(ct: Container) -> None:
    """The real-torch container's extension to build: our one-kernel fixture, at TINY_EXTENSION_IN_CT."""
    for source in sorted(TINY_EXTENSION_SOURCE.rglob("*")):
        if source.is_file() and "__pycache__" not in source.parts and "build" not in source.parts:
            ct.write_file(f"{TINY_EXTENSION_IN_CT}/{source.relative_to(TINY_EXTENSION_SOURCE)}",
                          source.read_bytes())


def guest_repo_base(repo: AptRepo) -> str:
    """The repository's URL as a real VM reaches it: QEMU's guestfwd relay, not this machine's loopback."""
    return repo.base_url.replace(f"//{repo.host}:", f"//{qemuvm.GUEST_FORWARD_ADDRESS}:", 1)


def tiny_extension_sdist(folder: Path) -> Path:
    """The fixture as the sdist a controller would hold (folder/fleetfix_tiny_ext-0.1.0.tar.gz, PEP 625
    naming, a PKG-INFO like setuptools writes), for `extension_sources`."""
    top = "fleetfix_tiny_ext-0.1.0"
    path = folder / f"{top}.tar.gz"
    pkg_info = b"Metadata-Version: 2.1\nName: fleetfix-tiny-ext\nVersion: 0.1.0\n"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        info.size = len(pkg_info)
        archive.addfile(info, io.BytesIO(pkg_info))
        for source in sorted(TINY_EXTENSION_SOURCE.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts and "build" not in source.parts:
                archive.add(source, f"{top}/{source.relative_to(TINY_EXTENSION_SOURCE)}", recursive=False)
    return path


def write_inventory(path: Path, lab: Lab, repo: AptRepo, containers: Sequence[LabContainer],
                    vms: Sequence[LabVm] = ()) -> Path:
    """The lab's inventory; key and known_hosts paths are relative to it (the inventory's folder)."""
    node = lab.node("pve1")
    lines = [
        "# Written by `scripts/lab.sh up`: the local lab (docs/quickstart.md). "
        "Removed by `scripts/lab.sh down`.",
        "defaults:",
        f"  identity_file: {lab.client_key.relative_to(path.parent)}     # the lab's client key",
        f"  known_hosts: {lab.known_hosts.relative_to(path.parent)}     # the lab node's host key",
        "  vars:",
        "    # The lab's NVIDIA-style mirror; on a real fleet leave this out (NVIDIA's own repo is the",
        "    # default) or name your site's mirror of https://developer.download.nvidia.com/compute/cuda/repos.",
        f"    cuda_repo_base: {repo.base_url}",
        "nodes:",
        f"  - name: {node.name}",
        f"    address: {node.address}",
        f"    port: {node.port}",
        "    containers:",
    ]
    for ct in containers:
        extra = f", vars: {{python: {ct.python}}}" if ct.python else ""
        lines.append(f"      - {{ctid: {ct.ctid}, name: {ct.name}, tags: [{', '.join(ct.tags)}]{extra}}}")
    if vms:
        lines.append("    vms:")
    for machine in vms:
        extra = ""
        if machine.kind == VM_REAL:
            lines.append(f"      # {VM_KINDS[VM_REAL]}; it reaches the mirror through QEMU's user network")
            extra = f", vars: {{cuda_repo_base: {guest_repo_base(repo)}}}"
        else:
            lines.append(f"      # {VM_KINDS[VM_STAND_IN]}")
        lines.append(f"      - {{vmid: {machine.vmid}, name: {machine.name}, "
                     f"tags: [{', '.join(machine.tags)}]{extra}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def build_lab(root: Path, *, healthy: bool = True, real_torch: bool = False,
              vm: str | None = VM_STAND_IN) -> RunningLab:
    """Start node, repo, containers and VM under root; write root/inventory.yaml. The caller closes it.
    real_torch: also the train-cu130 container, and a repo with the real nvcc 13.0 (both cached in /opt).
    vm: VM_REAL (a QEMU guest: booting it takes a while), VM_STAND_IN, or None for no VM."""
    # Imported here: scenarios lives with the e2e tests; only the lab needs it.
    from tests.e2e.scenarios import healthy as make_healthy
    from tests.e2e.scenarios import problem_case

    root.mkdir(parents=True, exist_ok=True)
    if real_torch:
        ensure_real_torch()
    repo_dir = cache_root() / "aptrepo" if real_torch else root / "aptrepo"
    repo = serve_repo(build_repo(repo_dir, real_13_0=real_torch))
    try:
        lab = Lab(root / "bed", nodes=["pve1"])
    except BaseException:
        repo.stop()
        raise
    vms = (LabVm(LAB_VM_ID, LAB_VM_NAME, LAB_VM_TAGS, vm),) if vm else ()
    running = RunningLab(lab, repo, root / "inventory.yaml", lab_containers(healthy, real_torch), vms)
    setups = {
        "problem": problem_case,
        "healthy": lambda c: make_healthy(c, repo, root / "stub-cache"),
        "real-torch": add_tiny_extension_source,
    }
    try:
        for ct in running.containers:
            setup = setups[ct.scenario]
            share = (str(venv_path()),) if ct.scenario == "real-torch" else ()
            lab.add_container("pve1", ct.ctid, name=ct.name, tags=ct.tags, setup=setup, share=share)
        for machine in running.vms:
            if machine.kind == VM_REAL:
                lab.add_qemu_vm("pve1", machine.vmid, name=machine.name, forwards=(repo.port,),
                                setup=problem_case)
            else:
                lab.add_vm("pve1", machine.vmid, name=machine.name, tags=machine.tags, setup=problem_case)
        write_inventory(running.inventory, lab, repo, running.containers, running.vms)
    except BaseException:
        running.close()
        raise
    return running


# --- the background process ----------------------------------------------------------------------------
def lab_dir() -> Path:
    return Path(os.environ.get(LAB_DIR_ENV) or DEFAULT_LAB_DIR)


def _paths(root: Path) -> dict[str, Path]:
    return {"pid": root / "lab.pid", "info": root / "lab.json", "log": root / "lab.log"}


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.rename(path)


def _is_lab_process(pid: int, root: Path) -> bool:
    """pid is alive and is our `serve` for root (not a recycled PID)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"tests.lab.cli" in argv and b"serve" in argv and str(root).encode() in argv


def serve(root: Path, *, healthy: bool, real_torch: bool = False, vm: str = VM_STAND_IN) -> int:
    """Foreground: build the lab, publish lab.json, idle until SIGTERM/SIGINT/SIGHUP, then tear down."""
    paths = _paths(root)
    _atomic_write(paths["pid"], f"{os.getpid()}\n")
    stop_requested = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)
    running = build_lab(root, healthy=healthy, real_torch=real_torch, vm=vm)
    try:
        node = running.lab.node("pve1")
        info = LabInfo(
            pid=os.getpid(), lab_dir=str(root), inventory=str(running.inventory),
            repo_base=running.repo.base_url, node_address=node.address, node_port=node.port,
            containers=[f"{ct.ctid} {ct.name} ({ct.scenario})" for ct in running.containers],
            vms=[f"{vm.vmid} {vm.name} (problem; {VM_KINDS[vm.kind]})" for vm in running.vms],
        )
        _atomic_write(paths["info"], json.dumps(asdict(info), indent=2) + "\n")
        print(f"lab ready: {info.inventory}", flush=True)
        while not stop_requested:
            time.sleep(0.2)
    finally:
        print("lab stopping", flush=True)
        running.close()  # removes root/bed; the rest of root is removed by `down`
    return 0


def _read_info(root: Path) -> LabInfo | None:
    try:
        return LabInfo(**json.loads(_paths(root)["info"].read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _read_pid(root: Path) -> int | None:
    try:
        return int(_paths(root)["pid"].read_text().strip())
    except (OSError, ValueError):
        return None


def _port_open(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


def describe(info: LabInfo) -> str:
    containers = "".join(f"    CT {line}\n" for line in info.containers)
    containers += "".join(f"    VM {line}\n" for line in info.vms)
    return (
        f"fleetfix lab running (pid {info.pid}), state in {info.lab_dir}\n"
        f"  node pve1: ssh root@{info.node_address} -p {info.node_port}\n"
        f"{containers}"
        f"  inventory:      {info.inventory}\n"
        f"  cuda_repo_base: {info.repo_base}   (already set in the inventory's vars)\n"
        "\nUse it from this shell:\n"
        f"  {info.exports().replace(chr(10), chr(10) + '  ').rstrip()}\n"
        "  fleetfix probe -i $LAB_INVENTORY\n"
        "Stop it: scripts/lab.sh down\n"
    )


def up(root: Path, *, healthy: bool, real_torch: bool = False, vm: str = "auto") -> int:
    pid = _read_pid(root)
    if pid is not None and _is_lab_process(pid, root):
        info = _read_info(root)
        print(describe(info) if info else f"the lab is starting (pid {pid}); try `status` shortly")
        return 0
    if root.exists() and any(root.iterdir()):
        # A previous lab that died without `down`: clean it up before reusing the directory.
        _teardown_leftovers(root)
    problems = prerequisite_problems(healthy, real_torch, vm)
    if problems:
        print("the lab cannot start here:\n" + "".join(f"  - {p}\n" for p in problems), file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    paths = _paths(root)
    argv = [sys.executable, "-m", "tests.lab.cli", "serve", "--dir", str(root)]
    if not healthy:
        argv.append("--no-healthy")
    if real_torch:
        argv.append("--real-torch")
        print("starting the lab with --real-torch: the first start builds the torch venv and the CUDA 13.0 "
              "debs (minutes)", flush=True)
    kind = vm_kind(vm)
    argv += ["--vm", kind]
    if kind == VM_REAL:
        print(f"starting the lab with a {VM_KINDS[VM_REAL]} (VM 300 boots in a minute or so; a first start "
              "also builds its image, minutes; `--vm stand-in` starts at once)", flush=True)
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    with paths["log"].open("ab") as log:
        # Its own session: it outlives this shell and ignores the terminal's Ctrl-C.
        process = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )
    timeout = max(REAL_TORCH_START_TIMEOUT if real_torch else START_TIMEOUT,
                  REAL_VM_START_TIMEOUT if kind == VM_REAL else 0.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _read_info(root)
        if info is not None and info.pid == process.pid:
            print(describe(info), end="")
            return 0
        if process.poll() is not None:
            print(f"the lab failed to start (exit {process.returncode}); its log, {paths['log']}:",
                  file=sys.stderr)
            print(_tail(paths["log"]), file=sys.stderr)
            _teardown_leftovers(root)
            return 1
        time.sleep(0.2)
    print(f"the lab did not come up within {timeout:.0f}s; see {paths['log']}", file=sys.stderr)
    return 1


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def status(root: Path) -> int:
    pid = _read_pid(root)
    info = _read_info(root)
    if pid is None or not _is_lab_process(pid, root):
        print(f"no lab running (state dir {root}{'' if root.exists() else ': absent'})")
        return 3
    if info is None:
        print(f"the lab is starting (pid {pid})")
        return 0
    print(describe(info), end="")
    reachable = _port_open(info.node_address, info.node_port)
    repo_host, repo_port = info.repo_base.split("//", 1)[1].split("/", 1)[0].split(":")
    repo_up = _port_open(repo_host, int(repo_port))
    agents = {machine.vmid: machine.agent_running() for machine in _lab_vms(root)}
    vm_checks = "".join(f", VM {vmid} guest agent {'up' if up else 'DOWN'}" for vmid, up in agents.items())
    checks = f"sshd {'up' if reachable else 'DOWN'}, apt repo {'up' if repo_up else 'DOWN'}{vm_checks}"
    print(f"  checks: {checks}")
    return 0 if reachable and repo_up and all(agents.values()) else 1


def env_lines(root: Path) -> int:
    info = _read_info(root)
    if info is None or not _is_lab_process(info.pid, root):
        print("no lab running: start it with `scripts/lab.sh up`", file=sys.stderr)
        return 3
    print(info.exports(), end="")
    return 0


def down(root: Path) -> int:
    pid = _read_pid(root)
    if pid is not None and _is_lab_process(pid, root):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _is_lab_process(pid, root) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_lab_process(pid, root):
            print(f"the lab (pid {pid}) did not stop in {STOP_TIMEOUT:.0f}s; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    existed = root.exists()
    _teardown_leftovers(root)
    print("lab stopped and removed" if existed else f"no lab state at {root}; nothing to do")
    return 0


def _node_dirs(root: Path) -> Iterator[Path]:
    nodes = root / "bed" / "nodes"
    if nodes.is_dir():
        yield from sorted(p for p in nodes.iterdir() if p.is_dir())


def _lab_vms(root: Path) -> list[vmlib.VirtualMachine]:
    return [machine for node_dir in _node_dirs(root) if (node_dir / "pve").is_dir()
            for machine in vmlib.vms(NodeState(node_dir / "pve"))]


def _teardown_leftovers(root: Path) -> None:
    """Stop whatever a dead `serve` left (containers by their recorded PID 1, a VM's QEMU by its recorded
    PID, sshd by its pid file), unmount anything under root still mounted here, and remove root."""
    for node_dir in _node_dirs(root):
        if (node_dir / "pve").is_dir():
            state = NodeState(node_dir / "pve")
            for ct in [*state.containers(), *vmlib.vms(state)]:
                with contextlib.suppress(Exception):
                    ct.stop()
        sshd_pid_file = node_dir / "sshd" / "sshd.pid"
        with contextlib.suppress(OSError, ValueError):
            sshd_pid = int(sshd_pid_file.read_text().strip())
            cmdline = Path(f"/proc/{sshd_pid}/cmdline").read_bytes()
            if b"sshd" in cmdline and str(node_dir).encode() in cmdline:
                os.killpg(sshd_pid, signal.SIGTERM)
    for mount_point in _mounts_under(root):
        subprocess.run(["umount", "--lazy", mount_point], check=False)
    shutil.rmtree(root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    """Mount points below root in this mount namespace, deepest first (normally none)."""
    prefix = str(root.resolve()) + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mount_point = line.split()[4]
            if mount_point.startswith(prefix):
                found.append(mount_point)
    return sorted(found, key=len, reverse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/lab.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "env", "serve"])
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"lab directory (default: ${LAB_DIR_ENV}, else {DEFAULT_LAB_DIR})")
    parser.add_argument("--no-healthy", action="store_true", help="only the two problem containers")
    parser.add_argument("--real-torch", action="store_true",
                        help="also CT 203 train-cu130: real torch (CUDA 13.0), real nvcc 13.0 in the repo")
    parser.add_argument("--vm", choices=["auto", VM_REAL, VM_STAND_IN], default="auto",
                        help="VM 300's kind: a real QEMU guest, the stand-in, or (auto) the real one where "
                             "QEMU can run here")
    args = parser.parse_args(argv)
    root = (args.dir or lab_dir()).absolute()
    healthy = not args.no_healthy
    if args.command == "up":
        return up(root, healthy=healthy, real_torch=args.real_torch, vm=args.vm)
    if args.command == "down":
        return down(root)
    if args.command == "status":
        return status(root)
    if args.command == "env":
        return env_lines(root)
    return serve(root, healthy=healthy, real_torch=args.real_torch, vm=vm_kind(args.vm))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `scripts/lab.sh status | head`: the reader left; not an error of the lab
        sys.exit(0)
