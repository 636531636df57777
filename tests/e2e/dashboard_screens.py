"""The screenshots of the audit dashboard in docs/images, made from the test bed.

    python3 -m tests.e2e.dashboard_screens docs/images [--keep DIR]     # as root, ~3 minutes

`scripts/lab.sh up` runs one node with three containers, too small a fleet to show a grid, a version
matrix or problem groups; this builds the same test bed (tests/lab: real sshd nodes, `pct`, overlay
containers, the signed NVIDIA-style apt repo on 127.0.0.1) with three nodes and 20 containers, and gives
them what a GPU fleet has: torch's CUDA runtime with or without a toolkit (12.8 or the older 12.4, installed
with apt from the repo), and a stand-in `nvidia-smi` plus /dev/nvidia* naming each node's driver and GPU
model. Then it audits four times with real `fleetfix audit` runs, changing containers in between
(fixed with `fleetfix apply`, a dpkg interrupted, a container stopped, a toolkit downgraded), so the trend,
the drift and the since-when have a history, writes the HTML report and screenshots each section at
desktop width in headless Chromium.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fleetfix.audit import AuditStore, load_audit
from fleetfix.audit.dashboard import build_dashboard, matrix_facts
from tests.e2e.chromium import SECTIONS, find_chromium, screenshot_section
from tests.e2e.scenarios import install_toolkit, problem_case
from tests.lab.aptrepo import AptRepo, build_repo, serve_repo
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.torch_stub import build_causal_conv1d_extension, install_causal_conv1d
from tests.unit.audit.audit_testkit import assert_versions_agree_with_problems

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Node:
    name: str
    driver: str
    gpu: str
    cap: str


NODES = (Node("pve1", "570.124.06", "NVIDIA H200", "9.0"),
         Node("pve2", "570.124.06", "NVIDIA H100 80GB HBM3", "9.0"),
         Node("pve3", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0"))
# (node, ctid, name, tags, state): "problem" torch cu128 without toolkit; "ok" with 12.8 and a built
# causal_conv1d; "old" builds with toolkit 12.4 (half of pve3, as the issue puts it).
PLAN = (
    ("pve1", 200, "train-a", "training", "problem"), ("pve1", 201, "train-b", "training", "problem"),
    ("pve1", 202, "train-c", "training", "ok"), ("pve1", 203, "train-d", "training", "ok"),
    ("pve1", 204, "infer-a", "inference", "ok"), ("pve1", 205, "infer-b", "inference", "problem"),
    ("pve1", 206, "notebook-1", "research", "old"), ("pve1", 207, "notebook-2", "research", "ok"),
    ("pve2", 300, "train-e", "training", "problem"), ("pve2", 301, "train-f", "training", "ok"),
    ("pve2", 302, "train-g", "training", "ok"), ("pve2", 303, "infer-c", "inference", "old"),
    ("pve2", 304, "infer-d", "inference", "ok"), ("pve2", 305, "eval-1", "research", "problem"),
    ("pve3", 400, "legacy-1", "training", "old"), ("pve3", 401, "legacy-2", "training", "old"),
    ("pve3", 402, "legacy-3", "training", "old"), ("pve3", 403, "legacy-4", "training", "ok"),
    ("pve3", 404, "legacy-5", "training", "ok"), ("pve3", 405, "batch-1", "inference", "problem"),
)


def fake_gpu(ct: Container, node: Node, gpus: int = 2) -> None:
    """What a container with the GPU passed through shows: /dev/nvidia*, the driver's userspace
    libraries and an nvidia-smi that answers for the node's driver and GPU model."""
    line = f"{node.driver}, {node.gpu}, {node.cap}"
    smi = "#!/bin/sh\n" + "".join(f"echo '{line}'\n" for _ in range(gpus))
    ct.write_file("/usr/bin/nvidia-smi", smi, mode=0o755)
    for lib in ("libcuda.so", "libnvidia-ml.so"):
        ct.write_file(f"/usr/lib/x86_64-linux-gnu/{lib}.{node.driver}", b"")
    ct.sh(": > /dev/nvidia0; : > /dev/nvidiactl; : > /dev/nvidia-uvm")


def set_up(ct: Container, node: Node, state: str, repo: AptRepo, stubs: Path) -> None:
    problem_case(ct)
    fake_gpu(ct, node)
    if state == "ok":
        install_causal_conv1d(ct, compiled=True, cache_dir=stubs)
        install_toolkit(ct, repo, "12.8")
    elif state == "old":
        install_causal_conv1d(ct, compiled=True, cache_dir=stubs)
        install_toolkit(ct, repo, "12.4")


def write_inventory(path: Path, lab: Lab, repo: AptRepo) -> Path:
    lines = ["defaults:", f"  identity_file: {lab.client_key}", f"  known_hosts: {lab.known_hosts}",
             "  vars:", f"    cuda_repo_base: {repo.base_url}", "nodes:"]
    for node in NODES:
        lab_node = lab.node(node.name)
        lines += [f"  - name: {node.name}", f"    address: {lab_node.address}", f"    port: {lab_node.port}",
                  "    containers:"]
        lines += [f"      - {{ctid: {ctid}, name: {name}, tags: [{tag}]}}"
                  for where, ctid, name, tag, _ in PLAN if where == node.name]
    path.write_text("\n".join(lines) + "\n")
    return path


def fleetfix(*args: str) -> int:
    done = subprocess.run([sys.executable, "-m", "fleetfix", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    print(f"fleetfix {' '.join(args[:3])} ... -> exit {done.returncode}", flush=True)
    return done.returncode


def make_screens(out: Path, work: Path) -> None:
    if find_chromium() is None:
        raise SystemExit("headless Chromium is not installed (apt-get install chromium)")
    repo = serve_repo(build_repo(work / "aptrepo"))
    lab = Lab(work / "bed", nodes=[node.name for node in NODES])
    try:
        nodes = {node.name: node for node in NODES}
        cts: dict[str, Container] = {}
        for where, ctid, name, tag, _ in PLAN:
            cts[name] = lab.add_container(where, ctid, name=name, tags=(tag,))
        stubs = work / "stub-cache"
        build_causal_conv1d_extension(stubs)  # compiled once, before the containers share it
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(set_up, cts[name], nodes[where], state, repo, stubs)
                           for where, _, name, _, state in PLAN]:
                future.result()
        inventory = write_inventory(work / "inventory.yaml", lab, repo)
        db = work / "audit.db"
        audit = ["audit", "-i", str(inventory), "--db", str(db)]
        changes: list[Callable[[], object]] = [
            # night 1 -> 2: the training team fixes two boxes with the playbook; someone's upgrade dies
            lambda: fleetfix("apply", "playbooks/cuda-toolkit.yaml", "-i", str(inventory),
                             "--limit", "name:train-a,name:train-e"),
            lambda: cts["train-c"].sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' "
                                      "> /var/lib/dpkg/updates/0001"),
            # night 2 -> 3: a container goes down, another gets the toolkit
            lambda: cts["batch-1"].stop(),
            lambda: fleetfix("apply", "playbooks/cuda-toolkit.yaml", "-i", str(inventory),
                             "--limit", "name:train-b"),
            # night 3 -> 4: an inference box is rebuilt with the old toolkit, dpkg is repaired
            lambda: install_toolkit(cts["infer-d"], repo, "12.4"),
            lambda: cts["infer-d"].sh("apt-get -qq remove -y cuda-nvcc-12-8 cuda-cudart-dev-12-8 >/dev/null"),
            lambda: cts["train-c"].sh("rm -f /var/lib/dpkg/updates/0001"),
        ]
        fleetfix(*audit)
        for night in ((0, 1), (2, 3), (4, 5, 6)):
            for index in night:
                changes[index]()
            fleetfix(*audit)
    finally:
        lab.close()
        repo.stop()
    views_agree(db)
    shoot(db, out, work)


def views_agree(db: Path) -> None:
    """The newest run's Versions view says of every target what its Problems say."""
    with AuditStore(db, readonly=True) as store:
        run = load_audit(store, store.runs(limit=1)[0].id, facts=matrix_facts)
    assert_versions_agree_with_problems(build_dashboard(run))
    print("Versions and Problems agree on every target", flush=True)


def shoot(db: Path, out: Path, work: Path) -> None:
    """The report of the newest run in db, and a screenshot of each of its sections."""
    browser = find_chromium()
    if browser is None:
        raise SystemExit("headless Chromium is not installed (apt-get install chromium)")
    html = work / "report.html"
    fleetfix("audit", "show", "last", "--db", str(db), "--html", str(html))
    out.mkdir(parents=True, exist_ok=True)
    for section in SECTIONS:
        png = out / f"dashboard-{section}.png"
        size = screenshot_section(browser, html, section, png)
        print(f"{png}: {size[0]}x{size[1]}, {png.stat().st_size // 1024} KiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where the PNGs go (docs/images)")
    parser.add_argument("--keep", type=Path, help="work directory to keep (database, report, inventory)")
    parser.add_argument("--from-db", type=Path, help="only re-shoot the newest run of this kept database")
    options = parser.parse_args()
    work = options.keep or Path(tempfile.mkdtemp(prefix="fleetfix-screens-"))
    try:
        if options.from_db:
            shoot(options.from_db, options.out, work)
        else:
            make_screens(options.out, work)
    finally:
        if options.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
