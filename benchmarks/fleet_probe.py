"""Fleet-scale probe benchmark: fleetfix against the OpenSSH ControlMaster floor and Ansible, in one run.

    python -m benchmarks.fleet_probe --nodes 20 --cts 10 --rtt-ms 20
    python -m benchmarks.fleet_probe --targets-scaling --rtt-ms 20

Starts a test-bed fleet (tests/lab: one sshd per node on 127.0.0.N, MaxSessions left at OpenSSH's default
10, M overlay containers per node behind the `pct` stand-in), one latency proxy process in front of every
node (benchmarks/latency_proxy.py: RTT/2 each way), then runs, one after the other over the same fleet:

- fleetfix: `fleetfix.probe.run.probe_targets` (what `fleetfix probe` runs) in a child process, dialling the
  proxy with the node's host key still checked (`SSHConnection(sock_factory=...)`), which also reports
  its probe phase apart from start-up;
- fleetfix-cli: the command itself, `fleetfix probe -i inventory.yaml --json`, the inventory naming the
  proxy ports (host keys recorded for the proxy endpoints, as for the peers);
- floor: the same probe script through OpenSSH, one ControlMaster per node and `xargs -P <channels>` per
  node running `pct exec CT -- /bin/sh -s < probe.sh`, plus the node-facts script once per node; host keys
  checked with HostKeyAlias against the lab's known_hosts;
- ansible-raw / ansible-setup (unless --no-ansible): ansible-playbook from a separate venv
  (benchmarks/.venv-ansible, see benchmarks/README.md) with `community.proxmox.proxmox_pct_remote`: the
  probe as a `raw` task (and node facts as `raw` on the nodes), then fact gathering (`setup`) alone;
- pyinfra (unless --no-pyinfra): the pyinfra CLI from its own venv (benchmarks/.venv-pyinfra) with the
  benchmark's `@pctssh/NODE:CTID` connector (benchmarks/pyinfra_pct: `pct exec CTID -- sh -c CMD` over
  pyinfra's SSH connector, as its `@dockerssh` does with `docker exec`), the probe as `server.shell`.

Each tool's wall time, controller CPU (os.wait4 rusage of its process tree), peak RSS and the TCP
connections / exec channels the sshds logged are reported, with the ratios from this same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.measure import Measured, SshCounts, SshdLogCounter, compile_fleetfix, measure
from fleetfix.probe import build_node_script, build_probe_script, parse_facts
from tests.lab.bed import Lab

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
ANSIBLE_VENV = BENCH_DIR / ".venv-ansible"
PYINFRA_VENV = BENCH_DIR / ".venv-pyinfra"
FIRST_CTID = 200
DEFAULT_FORKS = 32  # fleetfix's --forks default; also used for Ansible's forks
DEFAULT_CHANNELS = 8  # fleetfix's channels per node; the floor's xargs -P per node
REPEATED = ("fleetfix", "floor", "fleetfix-cli", "paramiko-ref")  # what --repeat runs more than once
SCALING_STEPS = ((1, 10), (10, 10), (50, 20))  # (nodes, containers per node): 10, 100, 1000 targets
# The lab's bed pins this too: OpenSSH 9's default sntrup761 kex costs ~100 ms of CPU per connection here,
# and paramiko (so fleetfix and Ansible's pct_remote) cannot use it: every tool gets the same key exchange.
KEX = "curve25519-sha256"


@dataclass
class NodeSpec:
    name: str
    address: str
    port: int  # the node's sshd
    proxy_port: int | None  # the latency proxy in front of it, on the same address
    ctids: list[int]


@dataclass
class ToolResult:
    tool: str
    targets: int
    ok: int
    wall_s: float
    cpu_s: float
    maxrss_kib: int
    peak_tree_rss_kib: int
    connections: int
    channels: int
    refused: int
    per_node: dict[str, SshCounts] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_ms_per_target(self) -> float:
        return 1000 * self.cpu_s / max(1, self.targets)

    @classmethod
    def from_measured(cls, tool: str, targets: int, ok: int, run: Measured,
                      counts: dict[str, SshCounts], **detail: Any) -> ToolResult:
        return cls(
            tool, targets, ok, run.wall_s, run.cpu_s, run.maxrss_kib, run.peak_tree_rss_kib,
            sum(c.connections for c in counts.values()), sum(c.channels for c in counts.values()),
            sum(c.refused for c in counts.values()), counts, dict(detail, returncode=run.returncode),
        )


@dataclass
class Bed:
    """The running bed: lab, proxy, and the files every tool reads."""

    lab: Lab
    nodes: list[NodeSpec]
    workdir: Path
    probe_script: Path
    node_script: Path
    proxy: subprocess.Popen[bytes] | None
    rtt_ms: float

    @property
    def targets(self) -> int:
        return sum(len(node.ctids) for node in self.nodes)

    def subset(self, nodes: int, cts: int) -> list[NodeSpec]:
        return [NodeSpec(n.name, n.address, n.port, n.proxy_port, n.ctids[:cts]) for n in self.nodes[:nodes]]

    def counter(self) -> SshdLogCounter:
        return SshdLogCounter({name: node.ssh for name, node in self.lab.nodes.items()})

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.terminate()
            try:
                self.proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait()
        self.lab.close()


# -- the bed ---------------------------------------------------------------------------------------------


def start_fleet(workdir: Path, nodes: int, cts: int, rtt_ms: float, *, log: bool = True,
                timestamps: Path | None = None) -> Bed:
    """timestamps: the proxy logs accept and first-client-byte times there (latency_proxy --timestamps)."""
    started = time.monotonic()
    lab = Lab(workdir / "lab", nodes=nodes)
    proxy: subprocess.Popen[bytes] | None = None
    try:
        for node in lab.nodes.values():
            for ctid in range(FIRST_CTID, FIRST_CTID + cts):
                lab.add_container(node, ctid)
        ports: dict[str, int] = {}
        if rtt_ms > 0:
            routes = [f"--route={node.address}:{node.port}" for node in lab.nodes.values()]
            if timestamps is not None:
                routes.append(f"--timestamps={timestamps}")
            proxy = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.latency_proxy", f"--delay-ms={rtt_ms / 2}", *routes],
                stdout=subprocess.PIPE, cwd=REPO, start_new_session=True,
            )
            assert proxy.stdout is not None
            line = proxy.stdout.readline()
            if not line:
                raise RuntimeError("the latency proxy did not start")
            ports = json.loads(line)
        specs = [
            NodeSpec(node.name, node.address, node.port, ports.get(f"{node.address}:{node.port}"),
                     list(range(FIRST_CTID, FIRST_CTID + cts)))
            for node in lab.nodes.values()
        ]
        probe_script = workdir / "probe.sh"
        probe_script.write_text(build_probe_script())
        node_script = workdir / "node.sh"
        node_script.write_text(build_node_script())
    except BaseException:
        if proxy is not None:
            proxy.kill()
        lab.close()
        raise
    if log:
        _say(f"fleet up: {nodes} nodes x {cts} CTs, RTT +{rtt_ms:g} ms, in {time.monotonic() - started:.1f}s")
    return Bed(lab, specs, workdir, probe_script, node_script, proxy, rtt_ms)


def measure_counted(fleet: Bed, nodes: Sequence[NodeSpec], argv: Sequence[str], **options: Any
                    ) -> tuple[Measured, dict[str, SshCounts]]:
    """measure(argv), and what the sshds of `nodes` logged meanwhile (connections, channels)."""
    counter = fleet.counter()
    counter.start()
    run = measure(argv, **options)
    names = {node.name for node in nodes}
    return run, {name: counts for name, counts in counter.per_node().items() if name in names}


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# -- fleetfix --------------------------------------------------------------------------------------------


def run_fleetfix(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS,
                 channels: int = DEFAULT_CHANNELS) -> ToolResult:
    spec_path = fleet.workdir / "fleetfix-spec.json"
    spec_path.write_text(json.dumps({
        "identity": str(fleet.lab.client_key), "known_hosts": str(fleet.lab.known_hosts),
        "forks": forks, "channels_per_node": channels, "nodes": [asdict(node) for node in nodes],
    }))
    argv = [sys.executable, "-m", "benchmarks.fleetfix_run", str(spec_path)]
    run, counts = measure_counted(fleet, nodes, argv, env=_python_env(), cwd=REPO)
    try:
        summary = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"fleetfix run failed (exit {run.returncode}): {run.stderr[-2000:]}") from None
    targets = sum(len(node.ctids) for node in nodes)
    return ToolResult.from_measured(
        "fleetfix", targets, summary["statuses"].get("ok", 0), run, counts,
        probe_wall_s=summary["probe_wall_s"], probe_cpu_s=summary["probe_cpu_s"],
        setup_cpu_s=summary["setup_cpu_s"], setup_wall_s=summary["setup_wall_s"],
        with_node_facts=summary["with_node_facts"],
        errors=summary["errors"],
    )


def write_ref_spec(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS,
                   channels: int = DEFAULT_CHANNELS) -> Path:
    """The paramiko reference's input (`python -m benchmarks.paramiko_ref SPEC`)."""
    spec_path = fleet.workdir / "paramiko-ref-spec.json"
    spec_path.write_text(json.dumps({
        "identity": str(fleet.lab.client_key), "known_hosts": str(fleet.lab.known_hosts),
        "forks": forks, "channels_per_node": channels, "nodes": [asdict(node) for node in nodes],
    }))
    return spec_path


def run_paramiko_ref(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS,
                     channels: int = DEFAULT_CHANNELS) -> ToolResult:
    """The minimal paramiko reference (benchmarks/paramiko_ref.py): the same remote work, nothing else."""
    spec_path = write_ref_spec(fleet, nodes, forks=forks, channels=channels)
    argv = [sys.executable, "-m", "benchmarks.paramiko_ref", str(spec_path)]
    run, counts = measure_counted(fleet, nodes, argv, env=_python_env(), cwd=REPO)
    try:
        summary = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(
            f"paramiko reference failed (exit {run.returncode}): {run.stderr[-2000:]}") from None
    return ToolResult.from_measured("paramiko-ref", summary["targets"], summary["ok"], run, counts)


def write_cli_inventory(fleet: Bed, nodes: Sequence[NodeSpec], rundir: Path) -> Path:
    """rundir/inventory.yaml for `fleetfix probe -i inventory.yaml`, run in rundir: the nodes at their proxy
    ports, the lab's host keys recorded for those endpoints (known_hosts beside it). Returns rundir."""
    rundir.mkdir(exist_ok=True)
    write_proxy_known_hosts(fleet, nodes, rundir / "known_hosts")
    inventory = {
        "defaults": {"identity_file": str(fleet.lab.client_key), "known_hosts": str(rundir / "known_hosts")},
        "nodes": [{"name": n.name, "address": n.address, "port": n.proxy_port or n.port,
                   "containers": [{"ctid": ctid} for ctid in n.ctids]} for n in nodes],
    }
    (rundir / "inventory.yaml").write_text(json.dumps(inventory, indent=1))  # JSON is YAML
    return rundir


def run_fleetfix_cli(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS) -> ToolResult:
    """The real command, end to end: `fleetfix probe -i inventory.yaml --json` (interpreter start-up, the
    CLI's imports, inventory loading and the output included). The inventory names each node's proxy
    port; the host keys are the lab's, recorded for the proxy endpoints, as for the peers."""
    rundir = write_cli_inventory(fleet, nodes, fleet.workdir / "fleetfix-cli")
    argv = [sys.executable, "-m", "fleetfix", "probe", "-i", "inventory.yaml", "--json", f"--forks={forks}"]
    run, counts = measure_counted(fleet, nodes, argv, env=_python_env(), cwd=rundir)
    try:
        reports = json.loads(run.stdout)["targets"]
    except (ValueError, KeyError):
        raise RuntimeError(f"fleetfix probe failed (exit {run.returncode}): {run.stderr[-2000:]}") from None
    errors = sorted({r["error"] for r in reports if r.get("error")})[:5]
    return ToolResult.from_measured("fleetfix-cli", len(reports), sum(r["status"] == "ok" for r in reports),
                                    run, counts, errors=errors)


# -- the floor: OpenSSH ControlMaster + xargs -P ---------------------------------------------------------


def _openssh_options(fleet: Bed, node: NodeSpec) -> list[str]:
    return [
        "-F", "/dev/null", "-i", str(fleet.lab.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={fleet.lab.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlias=[{node.address}]:{node.port}",
        "-o", f"KexAlgorithms={KEX}", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
        "-p", str(node.proxy_port or node.port),
    ]


def write_floor_driver(fleet: Bed, nodes: Sequence[NodeSpec], channels: int, rundir: Path) -> Path:
    """A bash script doing exactly the fleetfix probe's remote work with OpenSSH: one ControlMaster per node
    (kept in the foreground of a background job, so its CPU is counted in this script's rusage), then per
    node `xargs -P channels` over [node facts, CT...], each a mux client running the script on stdin."""
    for folder in ("ctl", "out", "jobs"):
        (rundir / folder).mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    job = rundir / "job.sh"
    lines = ["#!/bin/sh", "# job.sh NODE ITEM: ITEM is a CTID, or 'node' for the node-facts script",
             "case $1 in"]
    for node in nodes:
        ssh = shlex.join(["ssh", *_openssh_options(fleet, node), "-o", "ControlMaster=no",
                          "-o", f"ControlPath={rundir}/ctl/{node.name}", f"root@{node.address}"])
        lines.append(f'  {q(node.name)}) remote() {{ {ssh} "$@"; }} ;;')
    lines += [
        "esac",
        'out="out/$1-$2"',
        'if [ "$2" = node ]; then',
        f'  remote /bin/sh -s < {q(str(fleet.node_script))} > "$out.out" 2> "$out.err"',
        "else",
        f'  remote pct exec "$2" -- /bin/sh -s < {q(str(fleet.probe_script))} > "$out.out" 2> "$out.err"',
        "fi",
        'echo $? > "$out.rc"',
        "",
    ]
    job.write_text("\n".join(lines))
    job.chmod(0o755)

    driver = ["#!/bin/bash", "set -u", f"cd {q(str(rundir))}", "# 1. one ControlMaster per node"]
    for node in nodes:
        (rundir / "jobs" / node.name).write_text(
            "".join(f"{node.name} {item}\n" for item in ["node", *map(str, node.ctids)])
        )
        master = ["ssh", *_openssh_options(fleet, node), "-o", "ControlMaster=yes", "-o",
                  f"ControlPath={rundir}/ctl/{node.name}", "-N", f"root@{node.address}"]
        driver.append(f"{shlex.join(master)} < /dev/null &")
    names = " ".join(q(node.name) for node in nodes)
    driver += [
        "# the control socket appears once the master has authenticated",
        f"for n in {names}; do",
        "  tries=0",
        '  while [ ! -S "ctl/$n" ]; do',
        '    tries=$((tries + 1)); [ $tries -gt 2000 ] && { echo "master $n did not start" >&2; exit 2; }',
        "    sleep 0.005",
        "  done",
        "done",
        "# 2. the probe: per node, at most `channels` sessions at once (the node's MaxSessions is 10)",
        "workers=()",
        f'for n in {names}; do xargs -P {channels} -L 1 ./job.sh < "jobs/$n" & workers+=($!); done',
        'wait "${workers[@]}"',
        "# 3. close the masters and wait for them",
    ]
    for node in nodes:
        driver.append(
            f"ssh -o ControlPath={q(f'{rundir}/ctl/{node.name}')} -O exit root@{node.address} 2>/dev/null"
        )
    driver += ["wait", ""]
    path = rundir / "floor.sh"
    path.write_text("\n".join(driver))
    path.chmod(0o755)
    return path


def run_floor(fleet: Bed, nodes: Sequence[NodeSpec], *, channels: int = DEFAULT_CHANNELS) -> ToolResult:
    rundir = fleet.workdir / "floor"
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir()
    driver = write_floor_driver(fleet, nodes, channels, rundir)
    run, counts = measure_counted(fleet, nodes, ["/bin/bash", str(driver)], cwd=rundir)
    ok, errors = 0, set()
    for node in nodes:
        for ctid in node.ctids:
            base = rundir / "out" / f"{node.name}-{ctid}"
            rc = (base.with_suffix(".rc")).read_text().strip() if base.with_suffix(".rc").exists() else "?"
            if rc == "0" and _parses(base.with_suffix(".out")):
                ok += 1
            else:
                errors.add(f"rc={rc} {_tail(base.with_suffix('.err'))}")
    return ToolResult.from_measured("floor", sum(len(n.ctids) for n in nodes), ok, run, counts,
                                    errors=sorted(errors)[:5], stderr=run.stderr[-500:])


def _parses(path: Path) -> bool:
    try:
        parse_facts(path.read_text())
    except Exception:  # any failure to parse means the probe did not really run
        return False
    return True


def _tail(path: Path) -> str:
    return path.read_text(errors="replace").strip()[-200:] if path.exists() else ""


# -- Ansible with community.proxmox.proxmox_pct_remote ---------------------------------------------------

ANSIBLE_CFG = """\
[defaults]
inventory = inventory.ini
forks = {forks}
host_key_checking = True
interpreter_python = auto_silent
gathering = explicit
retry_files_enabled = False
deprecation_warnings = False
nocows = 1

[paramiko_connection]
record_host_keys = False
"""

RAW_PLAYBOOK = """\
- name: node facts (once per node, plain SSH)
  hosts: nodes
  gather_facts: false
  connection: ansible.builtin.paramiko_ssh
  vars_files: [scripts.yml]
  tasks:
    - name: node facts
      ansible.builtin.raw: "{{ node_script }}"
      changed_when: false

- name: probe every container (pct exec through proxmox_pct_remote)
  hosts: containers
  gather_facts: false
  vars_files: [scripts.yml]
  tasks:
    - name: probe
      ansible.builtin.raw: "{{ probe_script }}"
      changed_when: false
"""

SETUP_PLAYBOOK = """\
- name: fact gathering in every container
  hosts: containers
  gather_facts: true
  tasks: []
"""

_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def ansible_available(venv: Path = ANSIBLE_VENV) -> bool:
    return (venv / "bin" / "ansible-playbook").exists()


def enable_usr_sbin_pct(fleet: Bed) -> None:
    """proxmox_pct_remote runs `/usr/sbin/pct` (its path on real PVE); the lab installs the stand-in in the
    node's private /usr/local/sbin. Inside each node's mount namespace only, overlay /usr/local/sbin on top
    of /usr/sbin so /usr/sbin/pct exists there; this machine's /usr/sbin is untouched."""
    for node in fleet.lab.nodes.values():
        process = node.ssh.process
        assert process is not None
        namespace = f"/proc/{process.pid}/ns/mnt"
        probe = subprocess.run(["nsenter", f"--mount={namespace}", "test", "-x", "/usr/sbin/pct"])
        if probe.returncode == 0:
            continue
        subprocess.run(
            ["nsenter", f"--mount={namespace}", "mount", "-t", "overlay", "overlay", "-o",
             "lowerdir=/usr/local/sbin:/usr/sbin", "/usr/sbin"],
            check=True,
        )


def write_proxy_known_hosts(fleet: Bed, nodes: Sequence[NodeSpec], path: Path) -> None:
    """paramiko (under Ansible and pyinfra) checks host keys for [address]:port as dialled, i.e. the proxy's
    port: the lab's keys, recorded for the proxy endpoints, so a wrong key still fails the connection."""
    host_keys = {node.address: node.ssh.host_key_line for node in fleet.lab.nodes.values()}
    lines = [f"[{n.address}]:{n.proxy_port or n.port} {host_keys[n.address]}\n" for n in nodes]
    path.write_text("".join(lines))


def write_ansible_project(fleet: Bed, nodes: Sequence[NodeSpec], forks: int, rundir: Path) -> None:
    home = rundir / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    write_proxy_known_hosts(fleet, nodes, home / ".ssh" / "known_hosts")
    (rundir / "ansible.cfg").write_text(ANSIBLE_CFG.format(forks=forks))
    inventory = ["[nodes]"]
    inventory += [f"{n.name} ansible_host={n.address} ansible_port={n.proxy_port or n.port}" for n in nodes]
    inventory.append("\n[containers]")
    inventory += [
        f"{n.name}-{ctid} ansible_host={n.address} ansible_port={n.proxy_port or n.port} proxmox_vmid={ctid}"
        for n in nodes for ctid in n.ctids
    ]
    inventory += [
        "\n[containers:vars]", "ansible_connection=community.proxmox.proxmox_pct_remote",
        "\n[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={fleet.lab.client_key}",
    ]
    (rundir / "inventory.ini").write_text("\n".join(inventory))

    def unsafe_block(name: str, text: str) -> str:  # !unsafe: the scripts are never templated by Jinja
        return f"{name}: !unsafe |\n" + "".join(f"  {line}\n" for line in text.splitlines())

    (rundir / "scripts.yml").write_text(
        unsafe_block("probe_script", fleet.probe_script.read_text())
        + unsafe_block("node_script", fleet.node_script.read_text())
    )
    (rundir / "raw.yml").write_text(RAW_PLAYBOOK)
    (rundir / "setup.yml").write_text(SETUP_PLAYBOOK)


def run_ansible(fleet: Bed, nodes: Sequence[NodeSpec], variant: str, *, forks: int = DEFAULT_FORKS,
                venv: Path = ANSIBLE_VENV) -> ToolResult:
    rundir = fleet.workdir / "ansible"
    if not (rundir / "ansible.cfg").exists():
        rundir.mkdir(exist_ok=True)
        write_ansible_project(fleet, nodes, forks, rundir)
        enable_usr_sbin_pct(fleet)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "ANSIBLE_"))}
    env.update({
        "HOME": str(rundir / "home"), "ANSIBLE_CONFIG": str(rundir / "ansible.cfg"),
        "ANSIBLE_HOME": str(rundir / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(rundir / ".ansible" / "tmp"),
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "NO_COLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    })
    argv = [str(venv / "bin" / "ansible-playbook"), f"{variant}.yml"]
    run, counts = measure_counted(fleet, nodes, argv, env=env, cwd=rundir)
    containers = {f"{n.name}-{ctid}" for n in nodes for ctid in n.ctids}
    ok = sum(
        1 for host, _, unreachable, failed in _RECAP.findall(run.stdout)
        if host in containers and unreachable == "0" and failed == "0"
    )
    failures = [line for line in run.stdout.splitlines() if line.startswith(("fatal:", "failed:"))]
    return ToolResult.from_measured(f"ansible-{variant}", len(containers), ok, run, counts,
                                    errors=[line[:300] for line in failures[:3]], stderr=run.stderr[-500:])


# -- pyinfra ---------------------------------------------------------------------------------------------

PYINFRA_DEPLOY = """\
from pyinfra import host
from pyinfra.operations import server

script = {node_script!r} if "nodes" in host.groups else {probe_script!r}
with open(script) as handle:
    server.shell(name="probe", commands=[handle.read()])
"""
_PYINFRA_DONE = re.compile(r"^\s*\[(\S+)\]\s+(Success|Error|No changes)", re.MULTILINE)


def pyinfra_available(venv: Path = PYINFRA_VENV) -> bool:
    return (venv / "bin" / "pyinfra").exists()


def write_pyinfra_project(fleet: Bed, nodes: Sequence[NodeSpec], rundir: Path) -> None:
    (rundir / "home").mkdir(parents=True, exist_ok=True)
    write_proxy_known_hosts(fleet, nodes, rundir / "known_hosts")
    # Retries: ~11 connections per node arrive at once, past sshd's MaxStartups (10:30:100), which then
    # drops some unauthenticated ones, as a real node would; pyinfra's own knob for that is this.
    ssh = {"ssh_user": "root", "ssh_key": str(fleet.lab.client_key), "ssh_look_for_keys": False,
           "ssh_allow_agent": False, "ssh_known_hosts_file": str(rundir / "known_hosts"),
           "ssh_strict_host_key_checking": "yes", "ssh_connect_retries": 2}
    node_hosts = [(n.address, {**ssh, "ssh_port": n.proxy_port or n.port}) for n in nodes]
    container_hosts = [(f"@pctssh/{n.address}:{ctid}", {**ssh, "ssh_port": n.proxy_port or n.port})
                       for n in nodes for ctid in n.ctids]
    (rundir / "inventory.py").write_text(f"nodes = {node_hosts!r}\ncontainers = {container_hosts!r}\n")
    (rundir / "deploy.py").write_text(PYINFRA_DEPLOY.format(
        node_script=str(fleet.node_script), probe_script=str(fleet.probe_script)))


def run_pyinfra(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS,
                venv: Path = PYINFRA_VENV) -> ToolResult:
    rundir = fleet.workdir / "pyinfra"
    if not (rundir / "deploy.py").exists():
        rundir.mkdir(exist_ok=True)
        write_pyinfra_project(fleet, nodes, rundir)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "PYINFRA_"))}
    env.update({"HOME": str(rundir / "home"), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                "NO_COLOR": "1"})
    argv = [str(venv / "bin" / "pyinfra"), "inventory.py", "deploy.py", "-y", "--parallel", str(forks)]
    run, counts = measure_counted(fleet, nodes, argv, env=env, cwd=rundir)
    containers = {f"@pctssh/{n.address}:{ctid}" for n in nodes for ctid in n.ctids}
    output = run.stdout + run.stderr
    done = dict(_PYINFRA_DONE.findall(output))
    failed = sorted(host for host in containers if done.get(host) not in ("Success", "No changes"))
    errors = []
    for host in failed[:3]:
        said = [line.strip() for line in output.splitlines() if f"[{host}]" in line]
        errors.append(f"{host}: {' / '.join(said[-2:]) or 'no result'}")
    return ToolResult.from_measured("pyinfra", len(containers), len(containers) - len(failed), run, counts,
                                    errors=errors, stderr=run.stderr[-500:])


# -- reporting -------------------------------------------------------------------------------------------


def render(results: Sequence[ToolResult], *, nodes: int, cts: int, rtt_ms: float) -> str:
    header = (f"{'tool':<15}{'ok/targets':>11}{'wall s':>9}{'CPU s':>8}{'CPU/CT ms':>11}"
              f"{'RSS MiB':>9}{'tree MiB':>10}{'TCP conns':>11}{'channels':>10}{'refused':>9}")
    lines = [f"{nodes} nodes x {cts} CTs = {nodes * cts} targets, +{rtt_ms:g} ms RTT", header]
    for r in results:
        lines.append(
            f"{r.tool:<15}{f'{r.ok}/{r.targets}':>11}{r.wall_s:>9.2f}{r.cpu_s:>8.2f}"
            f"{r.cpu_ms_per_target:>11.1f}{r.maxrss_kib / 1024:>9.1f}{r.peak_tree_rss_kib / 1024:>10.1f}"
            f"{r.connections:>11}{r.channels:>10}{r.refused:>9}"
        )
    by_tool = {r.tool: r for r in results}
    fleetfix = by_tool.get("fleetfix")
    if fleetfix is not None:
        lines.append(f"fleetfix probe phase: {fleetfix.detail['probe_wall_s']:.2f}s wall, "
                     f"{1000 * fleetfix.detail['probe_cpu_s'] / max(1, fleetfix.targets):.1f} ms CPU/CT "
                     f"(start-up and imports: {fleetfix.detail['setup_cpu_s']:.2f}s CPU)")
        for other in results:
            if other is fleetfix:
                continue
            if other.tool in ("floor", "paramiko-ref"):
                for ours in filter(None, (fleetfix, by_tool.get("fleetfix-cli"))):
                    lines.append(f"{ours.tool} / {other.tool}: wall {ours.wall_s / other.wall_s:.2f}x, "
                                 f"CPU {ours.cpu_s / max(other.cpu_s, 1e-9):.2f}x")
            else:
                lines.append(f"{other.tool} / fleetfix: wall {other.wall_s / fleetfix.wall_s:.2f}x, "
                             f"CPU {other.cpu_s / max(fleetfix.cpu_s, 1e-9):.2f}x")
    for r in results:
        walls = r.detail.get("all_walls_s", [])
        if len(walls) > 1:
            cpus = r.detail["all_cpu_s"]
            lines.append(f"{r.tool}: median of {len(walls)} runs; wall {walls} s, CPU {cpus} s")
    for r in results:
        if r.ok != r.targets:
            lines.append(f"!! {r.tool}: {r.targets - r.ok} target(s) failed: {r.detail.get('errors')}")
    return "\n".join(lines)


def _say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def run_tool(fleet: Bed, tool: str, *, forks: int, channels: int) -> ToolResult:
    load_before = os.getloadavg()[0]
    if tool == "fleetfix":
        result = run_fleetfix(fleet, fleet.nodes, forks=forks, channels=channels)
    elif tool == "fleetfix-cli":
        result = run_fleetfix_cli(fleet, fleet.nodes, forks=forks)
    elif tool == "floor":
        result = run_floor(fleet, fleet.nodes, channels=channels)
    elif tool == "paramiko-ref":
        result = run_paramiko_ref(fleet, fleet.nodes, forks=forks, channels=channels)
    elif tool.startswith("ansible-"):
        result = run_ansible(fleet, fleet.nodes, tool.removeprefix("ansible-"), forks=forks)
    elif tool == "pyinfra":
        result = run_pyinfra(fleet, fleet.nodes, forks=forks)
    else:
        raise ValueError(f"unknown tool {tool}")
    # The machine may be shared: the 1-minute load average around each run says how much it was.
    result.detail["loadavg_before_after"] = [load_before, os.getloadavg()[0]]
    _say(f"{tool}: {result.ok}/{result.targets} ok in {result.wall_s:.2f}s, CPU {result.cpu_s:.2f}s")
    return result


def compare(fleet: Bed, *, tools: Sequence[str], forks: int, channels: int, repeat: int = 1
            ) -> list[ToolResult]:
    """Each tool once; with repeat > 1, fleetfix (library and CLI) and the floor `repeat` times, interleaved
    (so a burst of load elsewhere on the machine hits each), keeping each one's median-wall run. The peers
    run once. Each round starts one tool further on: what a run leaves winding down on the bed (the floor's
    ControlMasters and sessions) does not always land on the same tool."""
    runs: dict[str, list[ToolResult]] = {tool: [] for tool in tools}
    for round_index in range(repeat):
        shift = round_index % len(tools)
        for tool in [*tools[shift:], *tools[:shift]]:
            if round_index > 0 and tool not in REPEATED:
                continue
            _say(f"running {tool} (round {round_index + 1}) ...")
            runs[tool].append(run_tool(fleet, tool, forks=forks, channels=channels))
    results = []
    for tool in tools:
        ordered = sorted(runs[tool], key=lambda r: r.wall_s)
        chosen = ordered[len(ordered) // 2]
        chosen.detail["all_walls_s"] = [round(r.wall_s, 3) for r in runs[tool]]
        chosen.detail["all_cpu_s"] = [round(r.cpu_s, 3) for r in runs[tool]]
        results.append(chosen)
    return results


def targets_scaling(fleet: Bed, *, forks: int, channels: int) -> list[dict[str, Any]]:
    rows = []
    for nodes, cts in SCALING_STEPS:
        subset = fleet.subset(nodes, cts)
        _say(f"fleetfix on {nodes} x {cts} ...")
        result = run_fleetfix(fleet, subset, forks=forks, channels=channels)
        rows.append({"nodes": nodes, "cts": cts, **_summary(result)})
    return rows


def _summary(result: ToolResult) -> dict[str, Any]:
    data = asdict(result)
    data["per_node"] = {name: asdict(c) for name, c in result.per_node.items()}
    data["cpu_ms_per_target"] = result.cpu_ms_per_target
    return data


def render_scaling(rows: Sequence[dict[str, Any]], rtt_ms: float) -> str:
    lines = [f"fleetfix alone, +{rtt_ms:g} ms RTT",
             f"{'targets':>8}{'nodes':>7}{'ok':>6}{'wall s':>9}{'probe s':>9}{'CPU/CT ms':>11}{'RSS MiB':>9}"
             f"{'TCP conns':>11}{'channels':>10}{'refused':>9}"]
    for row in rows:
        lines.append(
            f"{row['targets']:>8}{row['nodes']:>7}{row['ok']:>6}{row['wall_s']:>9.2f}"
            f"{row['detail']['probe_wall_s']:>9.2f}{row['cpu_ms_per_target']:>11.2f}"
            f"{row['maxrss_kib'] / 1024:>9.1f}{row['connections']:>11}{row['channels']:>10}"
            f"{row['refused']:>9}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet_probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--cts", type=int, default=10, help="containers per node")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="added round-trip time (0: no proxy)")
    parser.add_argument("--forks", type=int, default=DEFAULT_FORKS, help="fleetfix --forks and Ansible forks")
    parser.add_argument("--channels", type=int, default=DEFAULT_CHANNELS, help="exec channels per node")
    parser.add_argument("--no-ansible", action="store_true", help="leave Ansible out")
    parser.add_argument("--no-pyinfra", action="store_true", help="leave pyinfra out")
    parser.add_argument("--targets-scaling", action="store_true",
                        help="fleetfix alone at 10, 100 and 1000 targets (50 nodes x 20 CTs)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run fleetfix and the floor this many times, interleaved; report the median")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (tool outputs)")
    args = parser.parse_args(argv)
    compile_fleetfix()

    workdir = Path(tempfile.mkdtemp(prefix="fleetfix-bench-"))
    try:
        if args.targets_scaling:
            max_nodes = max(n for n, _ in SCALING_STEPS)
            max_cts = max(c for _, c in SCALING_STEPS)
            fleet = start_fleet(workdir, max_nodes, max_cts, args.rtt_ms)
            try:
                rows = targets_scaling(fleet, forks=args.forks, channels=args.channels)
            finally:
                fleet.close()
            print(render_scaling(rows, args.rtt_ms))
            payload: dict[str, Any] = {"mode": "targets-scaling", "rtt_ms": args.rtt_ms, "rows": rows}
        else:
            tools = ["fleetfix", "floor", "fleetfix-cli", "paramiko-ref"]
            if not args.no_ansible:
                if ansible_available():
                    tools += ["ansible-raw", "ansible-setup"]
                else:
                    _say(f"no Ansible venv at {ANSIBLE_VENV}: skipping Ansible (see benchmarks/README.md)")
            if not args.no_pyinfra:
                if pyinfra_available():
                    tools.append("pyinfra")
                else:
                    _say(f"no pyinfra venv at {PYINFRA_VENV}: skipping pyinfra (see benchmarks/README.md)")
            fleet = start_fleet(workdir, args.nodes, args.cts, args.rtt_ms)
            try:
                results = compare(fleet, tools=tools, forks=args.forks, channels=args.channels,
                                  repeat=args.repeat)
            finally:
                fleet.close()
            print(render(results, nodes=args.nodes, cts=args.cts, rtt_ms=args.rtt_ms))
            payload = {"mode": "compare", "nodes": args.nodes, "cts": args.cts, "rtt_ms": args.rtt_ms,
                       "forks": args.forks, "channels": args.channels, "cpus": os.cpu_count(),
                       "repeat": args.repeat,
                       "results": [_summary(r) for r in results]}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=2, default=str))
    finally:
        if args.keep:
            _say(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
