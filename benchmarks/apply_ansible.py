"""`fleetfix apply playbooks/cuda-toolkit.yaml` against Ansible doing the same work, on the same containers.

    python -m benchmarks.apply_ansible --nodes 4 --cts 5 [--json FILE] [--keep]

On one bed (tests/lab: one real sshd per node on 127.0.0.N, overlay containers behind the `pct` stand-in,
the apt repository stand-in of tests/lab/aptrepo.py on 127.0.0.1), every container made as the e2e tests'
problem case (torch 2.11.0+cu128, no nvcc, no NVIDIA repository), in this order:

1. fleetfix-1st: `fleetfix apply playbooks/cuda-toolkit.yaml --var cuda_repo_base=URL`: every container
   changes (keyring, apt-get update, the toolkit's packages); then nvcc is checked in every container;
2. fleetfix-2nd: the same command again: nothing to change;
3. the containers are made again from scratch, the same fresh state;
4. ansible-1st: `ansible-playbook cuda-toolkit.yml`, the equivalent playbook this module writes (below),
   over `community.proxmox.proxmox_pct_remote` (paramiko to the node, `/usr/sbin/pct exec CTID -- CMD`);
   nvcc is checked in every container again;
5. ansible-2nd: the same playbook again.

The equivalent playbook does what fleetfix's cuda-toolkit playbook does to these containers: the
cuda-keyring .deb from the repository (`ansible.builtin.apt: deb=`), the keyring's source entry pointing
at the repository (`ansible.builtin.copy`, fleetfix's "keyring source points at cuda_repo_base"), apt
update when either changed (fleetfix updates when apt does not know the toolkit yet), the same three
packages without recommends (`ansible.builtin.apt`), and `nvcc --version` reporting torch's CUDA
(fleetfix's verify). The CUDA version, package names and repository URL are the ones fleetfix's run
chose, read from its run record, so Ansible gathers no facts (`gather_facts: false`): fleetfix's probe
(torch's CUDA, the distro) is work Ansible is spared. Fleetfix's read-only guards (the repository's
Packages.gz holds the toolkit, dpkg not interrupted, no conflicting NVIDIA sources) have no counterpart.

Fair settings: forks = the targets fleetfix runs at once (min(forks, nodes) x min(channels, CTs per
node)); host keys checked against the same known_hosts; the same private key, paramiko 5.1.0 on both
sides (benchmarks/requirements-ansible.txt pins what fleetfix's lock has); `ansible_python_interpreter`
given (no interpreter discovery round trip); `pipelining = True` in ansible.cfg, which this connection
plugin ignores (it declares no pipelining support, so every module is written with `cat > FILE`, then
run); no fact caching, no mitogen.

Ansible's apt module needs python3-apt in the target (else it installs it from the distro's mirror, which
the bed has none of): every container gets python3-apt before either tool runs (the same fresh state for
both), from this machine's Debian archive (`apt-get download`, cached under benchmarks/.cache-ansible/).

Ansible itself comes from benchmarks/requirements-ansible.txt (ansible 12.3.0, which bundles
community.proxmox 1.4.0; 14.x needs Python >= 3.12), installed into benchmarks/.venv-ansible by this
module when that venv is missing (`--no-install` refuses instead).

Per run: wall, controller CPU (os.wait4 of the command: fleetfix's process; ansible-playbook and every
fork it reaped), peak RSS, the nodes' CPU (what their sshds reaped: `pct`, the containers' work), `pct
exec` calls (the stand-in's log), SSH connections and session channels (the sshd logs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.apply_floor import PLAYBOOK, _node_cpu_after, node_cpu, pct_execs
from benchmarks.fleet_probe import (
    ANSIBLE_VENV,
    DEFAULT_CHANNELS,
    DEFAULT_FORKS,
    Bed,
    _python_env,
    enable_usr_sbin_pct,
    measure_counted,
    start_fleet,
    write_cli_inventory,
    write_proxy_known_hosts,
)
from benchmarks.measure import compile_fleetfix

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "benchmarks"
REQUIREMENTS = BENCH_DIR / "requirements-ansible.txt"
DEB_CACHE = BENCH_DIR / ".cache-ansible" / "debs"
# What ansible.builtin.apt imports in the target (python3-apt and what it depends on in Debian 12).
TARGET_DEBS = ("python3-apt", "python-apt-common", "distro-info-data")


# -- Ansible and its target prerequisite -----------------------------------------------------------------


def ensure_ansible(venv: Path = ANSIBLE_VENV, *, install: bool = True) -> Path:
    """venv's ansible-playbook, installed from the hashed requirements when the venv lacks it."""
    playbook = venv / "bin" / "ansible-playbook"
    if playbook.exists():
        return playbook
    if not install:
        raise SystemExit(f"no Ansible at {venv} (run without --no-install, or see benchmarks/README.md)")
    _say(f"installing Ansible into {venv} from {REQUIREMENTS.name}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    "--require-hashes", "-r", str(REQUIREMENTS)], check=True)
    return playbook


def target_debs(cache: Path = DEB_CACHE) -> list[Path]:
    """python3-apt and its dependencies as .debs from this machine's Debian archive (the bed's containers
    are Debian 12, as this machine), downloaded once."""
    debs = [next(iter(sorted(cache.glob(f"{name}_*.deb"))), None) for name in TARGET_DEBS]
    if all(debs):
        return [deb for deb in debs if deb is not None]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *TARGET_DEBS], cwd=cache, check=True,
                   stdout=subprocess.DEVNULL)
    return target_debs(cache)


def fresh(fleet: Bed, debs: Sequence[Path], *, remake: bool) -> None:
    """Every container as the problem case plus python3-apt: the state both tools start from."""
    from tests.e2e.scenarios import problem_case

    for node in fleet.nodes:
        for ctid in node.ctids:
            if remake:
                fleet.lab.remove_container(node.name, ctid)
                fleet.lab.add_container(node.name, ctid, setup=problem_case)
            else:
                problem_case(fleet.lab.nodes[node.name].container(ctid))
            ct = fleet.lab.nodes[node.name].container(ctid)
            for deb in debs:
                ct.write_file(f"/root/{deb.name}", deb.read_bytes())
            ct.sh("cd /root && dpkg -i " + " ".join(deb.name for deb in debs) + " >/dev/null && rm -f *.deb")


# -- the equivalent playbook -----------------------------------------------------------------------------

ANSIBLE_CFG = """\
[defaults]
inventory = inventory.ini
forks = {forks}
host_key_checking = True
gathering = explicit
retry_files_enabled = False
deprecation_warnings = False
nocows = 1

[connection]
# proxmox_pct_remote declares no pipelining support: Ansible ignores this for it (kept to show it was on)
pipelining = True

[paramiko_connection]
record_host_keys = False
look_for_keys = False
"""

CUDA_PLAYBOOK = """\
- name: CUDA toolkit matching torch's CUDA (fleetfix's playbooks/cuda-toolkit.yaml, the same work)
  hosts: containers
  gather_facts: false
  vars_files: [vars.yml]
  tasks:
    - name: cuda-keyring installed
      ansible.builtin.apt:
        deb: "{{ cuda_repo_url }}/cuda-keyring_{{ keyring_version }}_all.deb"
        lock_timeout: "{{ apt_lock_timeout }}"
      register: keyring

    - name: keyring source points at the repository
      ansible.builtin.copy:
        dest: "{{ keyring_list }}"
        content: "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {{ cuda_repo_url }}/ /\\n"
      register: source

    - name: apt index has the toolkit
      ansible.builtin.apt:
        update_cache: true
        lock_timeout: "{{ apt_lock_timeout }}"
      when: keyring is changed or source is changed

    - name: toolkit packages installed
      ansible.builtin.apt:
        name: "{{ cuda_packages }}"
        state: present
        install_recommends: false
        lock_timeout: "{{ apt_lock_timeout }}"

    - name: nvcc matches torch
      ansible.builtin.command: "/usr/local/cuda-{{ cuda_xy }}/bin/nvcc --version"
      register: nvcc
      changed_when: false
      failed_when: nvcc.rc != 0 or ('release ' ~ cuda_xy ~ ',') not in nvcc.stdout
"""


def playbook_vars(fleetfix_vars: dict[str, Any]) -> dict[str, Any]:
    """The values fleetfix's run rendered (its record's vars for one target) that the playbook needs."""
    url = str(fleetfix_vars["cuda_repo_url"]).rstrip("/")
    distro, arch = url.split("/")[-2:]
    return {"cuda_repo_url": url, "cuda_xy": str(fleetfix_vars["cuda_xy"]),
            "cuda_packages": [str(p) for p in fleetfix_vars["cuda_packages"]],
            "keyring_version": str(fleetfix_vars["keyring_version"]),
            "apt_lock_timeout": int(fleetfix_vars["apt_lock_timeout"]),
            "keyring_list": f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list"}


def write_ansible_project(fleet: Bed, rundir: Path, forks: int, values: dict[str, Any]) -> Path:
    home = rundir / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    write_proxy_known_hosts(fleet, fleet.nodes, home / ".ssh" / "known_hosts")
    (rundir / "ansible.cfg").write_text(ANSIBLE_CFG.format(forks=forks))
    inventory = ["[containers]"]
    inventory += [f"{n.name}-{ctid} ansible_host={n.address} ansible_port={n.proxy_port or n.port} "
                  f"proxmox_vmid={ctid}" for n in fleet.nodes for ctid in n.ctids]
    inventory += ["", "[containers:vars]", "ansible_connection=community.proxmox.proxmox_pct_remote",
                  "ansible_user=root", f"ansible_ssh_private_key_file={fleet.lab.client_key}",
                  "ansible_python_interpreter=/usr/bin/python3", ""]
    (rundir / "inventory.ini").write_text("\n".join(inventory))
    (rundir / "vars.yml").write_text(json.dumps(values, indent=1) + "\n")  # JSON is YAML
    (rundir / "cuda-toolkit.yml").write_text(CUDA_PLAYBOOK)
    return rundir


def ansible_env(rundir: Path, venv: Path = ANSIBLE_VENV) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "ANSIBLE_"))}
    env.update({
        "HOME": str(rundir / "home"), "ANSIBLE_CONFIG": str(rundir / "ansible.cfg"),
        "ANSIBLE_HOME": str(rundir / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(rundir / ".ansible" / "tmp"),
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "NO_COLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    })
    return env


# -- the runs --------------------------------------------------------------------------------------------


@dataclass
class Row:
    run: str
    targets: int
    ok: int  # targets that ended without a failure
    changed: int  # targets where something changed
    returncode: int
    wall_s: float
    cpu_s: float  # the controller's: the command and every process it reaped
    maxrss_kib: int
    peak_tree_rss_kib: int
    node_cpu_s: float
    pct_execs: int
    connections: int
    channels: int
    load_before_after: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_ms_per_target(self) -> float:
        return 1000 * self.cpu_s / max(1, self.targets)


def _measured_row(fleet: Bed, name: str, argv: Sequence[str], env: dict[str, str], rundir: Path,
                  parse: Any) -> Row:
    load, execs, node_before = os.getloadavg()[0], pct_execs(fleet), node_cpu(fleet)
    run, counts = measure_counted(fleet, fleet.nodes, argv, env=env, cwd=rundir, timeout=3600)
    targets, ok, changed, detail = parse(run)
    return Row(name, targets, ok, changed, run.returncode, run.wall_s, run.cpu_s, run.maxrss_kib,
               run.peak_tree_rss_kib, _node_cpu_after(fleet, node_before), pct_execs(fleet) - execs,
               sum(c.connections for c in counts.values()), sum(c.channels for c in counts.values()),
               [load, os.getloadavg()[0]], detail)


def run_fleetfix(fleet: Bed, name: str, rundir: Path, repo_url: str, forks: int) -> Row:
    argv = [sys.executable, "-m", "fleetfix", "apply", PLAYBOOK, "-i", "inventory.yaml",
            "--var", f"cuda_repo_base={repo_url}", "--state-dir", str(rundir / f"state-{name}"), "--json",
            f"--forks={forks}"]

    def parse(run: Any) -> tuple[int, int, int, dict[str, Any]]:
        try:
            targets = json.loads(run.stdout)["targets"]
        except (ValueError, KeyError):
            raise RuntimeError(f"{name}: exit {run.returncode}: {run.stderr[-2000:]}") from None
        statuses = [str(t.get("status")) for t in targets]
        ok = sum(1 for s in statuses if s in ("ok", "changed"))
        return len(targets), ok, statuses.count("changed"), {"statuses": sorted(set(statuses))}

    return _measured_row(fleet, name, argv, {**_python_env(), "NO_COLOR": "1"}, rundir, parse)


_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def parse_recap(stdout: str, hosts: set[str]) -> tuple[int, int, dict[str, Any]]:
    """(hosts ok, hosts changed, detail) from ansible-playbook's PLAY RECAP."""
    recap = {host: (int(ok), int(changed), int(unreachable), int(failed))
             for host, ok, changed, unreachable, failed in _RECAP.findall(stdout) if host in hosts}
    ok = sum(1 for _, _, unreachable, failed in recap.values() if unreachable == 0 and failed == 0)
    changed = sum(1 for _, c, unreachable, failed in recap.values() if c and not (unreachable or failed))
    failures = [line[:300] for line in stdout.splitlines() if line.startswith(("fatal:", "failed:"))]
    return ok, changed, {"recap_hosts": len(recap), "tasks_changed": sum(v[1] for v in recap.values()),
                         "errors": failures[:3]}


def run_ansible(fleet: Bed, name: str, rundir: Path, playbook: Path) -> Row:
    hosts = {f"{n.name}-{ctid}" for n in fleet.nodes for ctid in n.ctids}

    def parse(run: Any) -> tuple[int, int, int, dict[str, Any]]:
        ok, changed, detail = parse_recap(run.stdout, hosts)
        if detail["errors"] or ok < len(hosts):
            detail["stdout_tail"] = run.stdout[-1500:]
            detail["stderr_tail"] = run.stderr[-1500:]
        return len(hosts), ok, changed, detail

    return _measured_row(fleet, name, [str(playbook), "cuda-toolkit.yml"], ansible_env(rundir), rundir, parse)


def recorded_vars(state_dir: Path) -> dict[str, Any]:
    """The vars fleetfix rendered for the first target of the one run under state_dir (every target of
    this bed renders the same: one distro, one torch)."""
    from fleetfix.playbook.records import list_runs, load_run

    [summary] = list_runs(state_dir)
    detail = load_run(state_dir, summary.run_id)
    for record in detail.targets.values():
        if record.vars:
            return record.vars
    raise RuntimeError(f"no rendered vars in the run under {state_dir}")


def recorded_scripts(state_dir: Path) -> dict[str, int]:
    """How many scripts the one run under state_dir ran (each its own `pct exec`), and how many of them
    were a retry (attempt > 1)."""
    from fleetfix.playbook.records import list_runs, load_run

    [summary] = list_runs(state_dir)
    scripts = [script for record in load_run(state_dir, summary.run_id).targets.values()
               for step in record.steps for script in step.scripts]
    return {"scripts": len(scripts), "retried_scripts": sum(1 for s in scripts if s.attempt > 1)}


def check_nvcc(fleet: Bed, cuda_xy: str) -> list[str]:
    """The containers where /usr/local/cuda-X.Y/bin/nvcc does not report release X.Y (empty: all do)."""
    missing = []
    for node in fleet.nodes:
        for ctid in node.ctids:
            ct = fleet.lab.nodes[node.name].container(ctid)
            done = ct.sh(f"/usr/local/cuda-{cuda_xy}/bin/nvcc --version", check=False)
            if done.returncode != 0 or f"release {cuda_xy},".encode() not in done.stdout:
                missing.append(f"{node.name}/{ctid}")
    return missing


def ansible_pct_commands(fleet: Bed, since: dict[str, int]) -> list[str]:
    """The shapes of the `pct` command lines Ansible sent (ids and temp paths masked), most frequent
    first: what the stand-in had to serve."""
    shapes: dict[str, int] = {}
    for node in fleet.nodes:
        calls = fleet.lab.nodes[node.name].pct_calls()[since[node.name]:]
        for argv in calls:
            text = re.sub(r"\b\d{3,}\b", "N", " ".join(argv))
            text = re.sub(r"ansible-tmp-[\w.-]+", "ansible-tmp-X", text)
            text = re.sub(r"AnsiballZ_\w+\.py", "AnsiballZ_M.py", text)
            shapes[text] = shapes.get(text, 0) + 1
    return [f"{count}x {shape[:200]}" for shape, count in sorted(shapes.items(), key=lambda kv: -kv[1])[:8]]


def compare(fleet: Bed, repo_url: str, debs: Sequence[Path], playbook: Path, *, forks: int = DEFAULT_FORKS,
            channels: int = DEFAULT_CHANNELS, ansible_forks: int | None = None
            ) -> tuple[list[Row], dict[str, Any]]:
    """The four runs (see the module's docstring); the containers are fresh before each tool's first."""
    rundir = write_cli_inventory(fleet, fleet.nodes, fleet.workdir / "fleetfix")
    (rundir / "playbooks").mkdir(exist_ok=True)
    shutil.copy(REPO / PLAYBOOK, rundir / PLAYBOOK)
    rows = [run_fleetfix(fleet, "fleetfix-1st", rundir, repo_url, forks)]
    values = playbook_vars(recorded_vars(rundir / "state-fleetfix-1st"))
    rows[-1].detail["nvcc_missing"] = check_nvcc(fleet, values["cuda_xy"])
    rows.append(run_fleetfix(fleet, "fleetfix-2nd", rundir, repo_url, forks))
    for row in rows:
        row.detail.update(recorded_scripts(rundir / f"state-{row.run}"))

    fresh(fleet, debs, remake=True)
    per_node = max(len(node.ctids) for node in fleet.nodes)
    at_once = ansible_forks or min(forks, len(fleet.nodes)) * min(channels, per_node)
    adir = write_ansible_project(fleet, fleet.workdir / "ansible", at_once, values)
    enable_usr_sbin_pct(fleet)
    since = {node.name: len(fleet.lab.nodes[node.name].pct_calls()) for node in fleet.nodes}
    rows.append(run_ansible(fleet, "ansible-1st", adir, playbook))
    rows[-1].detail["nvcc_missing"] = check_nvcc(fleet, values["cuda_xy"])
    rows[-1].detail["pct_commands"] = ansible_pct_commands(fleet, since)
    rows.append(run_ansible(fleet, "ansible-2nd", adir, playbook))
    settings = {"ansible_forks": at_once, "fleetfix_forks": forks, "fleetfix_channels": channels,
                "vars": values, "ansible_cfg": ANSIBLE_CFG.format(forks=at_once), "playbook": CUDA_PLAYBOOK,
                "ansible_version": _ansible_version(playbook)}
    return rows, settings


def _ansible_version(playbook: Path) -> str:
    done = subprocess.run([str(playbook), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else ""


def problems(rows: Sequence[Row]) -> list[str]:
    """What says a tool did not do the work: a failed exit, a target not ok, nvcc missing after a first
    run, something changed on a second run."""
    found = []
    for row in rows:
        if row.returncode != 0 or row.ok != row.targets:
            found.append(f"{row.run}: exit {row.returncode}, {row.ok}/{row.targets} ok")
        if row.detail.get("nvcc_missing"):
            found.append(f"{row.run}: no nvcc in {row.detail['nvcc_missing'][:5]}")
        if row.run.endswith("-1st") and row.changed != row.targets:
            found.append(f"{row.run}: {row.changed}/{row.targets} changed")
        if row.run.endswith("-2nd") and row.changed:
            found.append(f"{row.run}: {row.changed} changed on the second run")
    return found


def render(rows: Sequence[Row], *, nodes: int, cts: int, settings: dict[str, Any]) -> str:
    lines = [f"fleetfix apply against Ansible: {nodes} nodes x {cts} CTs, {os.cpu_count()} CPUs, "
             f"fleetfix forks {settings['fleetfix_forks']} / channels {settings['fleetfix_channels']}, "
             f"Ansible forks {settings['ansible_forks']} ({settings['ansible_version']})",
             f"{'run':<14}{'ok':>8}{'changed':>8}{'wall s':>9}{'ctl CPU s':>11}{'CPU/target ms':>15}"
             f"{'node CPU s':>12}{'RSS MiB':>9}{'tree MiB':>9}{'pct execs':>10}{'SSH conn':>9}{'SSH ch':>8}"
             f"{'load':>12}"]
    for row in rows:
        load = "/".join(f"{v:.1f}" for v in row.load_before_after)
        lines.append(f"{row.run:<14}{f'{row.ok}/{row.targets}':>8}{row.changed:>8}{row.wall_s:>9.2f}"
                     f"{row.cpu_s:>11.2f}{row.cpu_ms_per_target:>15.1f}{row.node_cpu_s:>12.2f}"
                     f"{row.maxrss_kib / 1024:>9.1f}{row.peak_tree_rss_kib / 1024:>9.1f}{row.pct_execs:>10}"
                     f"{row.connections:>9}{row.channels:>8}{load:>12}")
    by = {row.run: row for row in rows}
    for run in ("1st", "2nd"):
        a, f = by[f"ansible-{run}"], by[f"fleetfix-{run}"]
        lines.append(f"ansible / fleetfix, {run} run: wall {a.wall_s / f.wall_s:.2f}x, "
                     f"controller CPU {a.cpu_s / max(f.cpu_s, 1e-3):.2f}x")
    return "\n".join(lines)


def run_bed(work: Path, nodes: int, cts: int, *, playbook: Path, forks: int = DEFAULT_FORKS,
            channels: int = DEFAULT_CHANNELS, ansible_forks: int | None = None,
            repo_url: str | None = None) -> tuple[list[Row], dict[str, Any]]:
    """repo_url: an apt repository stand-in already served (the e2e tests' session one), else one is
    built and served for this run."""
    from tests.lab.aptrepo import build_repo, serve_repo

    debs = target_debs()
    repo = serve_repo(build_repo(work / "aptrepo")) if repo_url is None else None
    fleet = start_fleet(work / "bed", nodes, cts, 0.0)
    try:
        fresh(fleet, debs, remake=False)
        url = repo.base_url if repo is not None else repo_url
        assert url is not None
        return compare(fleet, url, debs, playbook, forks=forks, channels=channels,
                       ansible_forks=ansible_forks)
    finally:
        fleet.close()
        if repo is not None:
            repo.stop()


def _say(text: str) -> None:
    print(f"[apply_ansible] {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cts", type=int, default=5)
    parser.add_argument("--forks", type=int, default=DEFAULT_FORKS, help="fleetfix --forks (nodes at once)")
    parser.add_argument("--channels", type=int, default=DEFAULT_CHANNELS,
                        help="fleetfix's channels per node (its default): sets Ansible's forks")
    parser.add_argument("--ansible-forks", type=int, help="default: the targets fleetfix runs at once")
    parser.add_argument("--no-install", action="store_true", help="refuse instead of installing Ansible")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args(argv)
    playbook = ensure_ansible(install=not options.no_install)
    compile_fleetfix()
    work = Path(tempfile.mkdtemp(prefix="fleetfix-apply-ansible-"))
    try:
        rows, settings = run_bed(work, options.nodes, options.cts, playbook=playbook, forks=options.forks,
                                 channels=options.channels, ansible_forks=options.ansible_forks)
    finally:
        if options.keep:
            _say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(render(rows, nodes=options.nodes, cts=options.cts, settings=settings))
    found = problems(rows)
    for line in found:
        print(f"PROBLEM: {line}")
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps({
            "nodes": options.nodes, "cts": options.cts, "cpus": os.cpu_count(), "settings": settings,
            "rows": [asdict(row) for row in rows], "problems": found}, indent=2) + "\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
