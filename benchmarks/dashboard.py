"""The audit dashboard at fleet scale: a synthetic history of N targets x R runs, the HTML report rendered
from it, its size, and how long headless Chromium takes to open it and to filter it (issues 21 and 22).

    python -m benchmarks.dashboard --targets 200 --targets 10000 --runs 14 [--repeat 3] [--json FILE]

The fleet is made of the probe's recorded fixtures (tests/fixtures/probe) diagnosed by the real rules, so
findings, summaries and fix commands are what a real fleet shows: 100 guests per node (fewer for small
fleets), a driver and a GPU model per node, a few nodes on an old driver, and a few percent of targets
changing state every night (drift). Older runs are stored without facts (only the current run's feed the
version matrix), which keeps a 10,000 x 14 history at a few hundred MB of SQLite.

Timing in the browser comes from the page itself: a measuring script appended to a copy of the report
reads `performance.now()` (milliseconds since navigation started) once the dashboard's own script has
run and a layout has been forced ("open"), then types a filter into the search box and forces a layout
again ("filter": the first filter also builds the script's index of the targets, which opening the page
without a filter in its link does not), then picks a health. Chromium runs headless with the flags of
tests/e2e/chromium.py (no network: every host name fails to resolve). Its process wall time, start-up
included, is reported too.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetfix.audit import AuditStore, load_audit
from fleetfix.audit.model import TargetResult
from fleetfix.audit.report import html_report
from fleetfix.probe import Facts, Finding, NodeFacts, diagnose, parse_facts
from tests.e2e.chromium import FLAGS

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "probe"
# profile -> share of the fleet. "dpkg" is healthy with an interrupted dpkg; "down" is unreachable.
PROFILES = {
    "healthy": 0.46, "problem_case": 0.24, "toolkit_12_4": 0.12, "toolkit_13_vs_cu128": 0.04,
    "apt_trouble": 0.03, "debian13_sqv": 0.03, "dpkg": 0.03, "no_python": 0.01, "down": 0.04,
}
DRIVERS = ("570.124.06", "570.124.06", "570.124.06", "550.54.15", "575.51.03")
GPUS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S")
CHURN = 0.03  # share of targets whose state changes from one night to the next

CHROMIUM_FLAGS = [*FLAGS, "--window-size=1440,1000"]

MEASURE = """
<script>
(function () {
  function layout() { return document.body.getBoundingClientRect().height + document.body.offsetHeight; }
  layout();
  var opened = performance.now();
  var search = document.getElementById("filter");
  var t0 = performance.now();
  search.value = "%(query)s";
  search.dispatchEvent(new Event("input"));
  layout();
  var filtered = performance.now() - t0;
  var shownSearch = document.getElementById("shown").textContent;
  search.value = "";
  var health = document.getElementById("health-filter");
  t0 = performance.now();
  health.value = "error";
  health.dispatchEvent(new Event("change"));
  layout();
  var byHealth = performance.now() - t0;
  var out = document.createElement("pre");
  out.id = "bench-result";
  out.textContent = JSON.stringify({ open_ms: opened, filter_ms: filtered, health_ms: byHealth,
    shown_search: shownSearch, shown_health: document.getElementById("shown").textContent,
    elements: document.getElementsByTagName("*").length });
  document.body.appendChild(out);
}());
</script>
"""


def _fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


@dataclass(frozen=True)
class Node:
    name: str
    driver: str
    gpu: str


class Fleet:
    """Facts and findings per (profile, node), computed once: diagnosing 10,000 targets is not the point."""

    def __init__(self, targets: int, seed: int) -> None:
        self.random = random.Random(seed)
        per_node = 100 if targets >= 1000 else 20
        count = max(1, -(-targets // per_node))
        self.nodes = [Node(f"pve{i + 1}", self.random.choice(DRIVERS), self.random.choice(GPUS))
                      for i in range(count)]
        self.targets = [(f"pve{i // per_node + 1}/{100 + i % per_node}", self.nodes[i // per_node])
                        for i in range(targets)]
        self.state = {name: self._pick() for name, _ in self.targets}
        self._cache: dict[tuple[str, str], tuple[dict[str, Any], tuple[Finding, ...]]] = {}

    def _pick(self) -> str:
        return self.random.choices(list(PROFILES), weights=list(PROFILES.values()))[0]

    def night(self) -> None:
        """Some targets change: most get fixed, some break."""
        for name in self.state:
            if self.random.random() < CHURN:
                self.state[name] = "healthy" if self.random.random() < 0.6 else self._pick()

    def _facts(self, profile: str, node: Node) -> tuple[dict[str, Any], tuple[Finding, ...]]:
        key = (profile, node.name)
        if key not in self._cache:
            data = copy.deepcopy(_fixture("healthy" if profile == "dpkg" else profile))
            if profile == "dpkg":
                data["dpkg"].update(interrupted=True, pending_updates=3)
            gpu = data["gpu"]
            gpu.update(driver_version=node.driver, names=[node.gpu] * 2)
            gpu["driver_libs"] = [{"file": f"/usr/lib/x86_64-linux-gnu/libcuda.so.{node.driver}",
                                   "version": node.driver}]
            facts: Facts = parse_facts(json.dumps(data))
            host = NodeFacts(hostname=node.name, kernel_module_version=node.driver)
            findings = tuple(diagnose(facts, host))
            self._cache[key] = (facts.model_dump(mode="json"), findings)
        return self._cache[key]

    def results(self, *, with_facts: bool) -> Iterator[TargetResult]:
        for name, node in self.targets:
            profile = self.state[name]
            if profile == "down":
                yield TargetResult(name, node.name, None, "unreachable",
                                   error=f"{node.name}: connection refused")
                continue
            facts, findings = self._facts(profile, node)
            yield TargetResult(name, node.name, None, "ok", findings=findings,
                               facts=facts if with_facts else None,
                               node_facts={"hostname": node.name, "kernel_module_version": node.driver})


def build_history(db: Path, targets: int, runs: int, *, seed: int = 22) -> dict[str, float]:
    """Record `runs` nightly runs of a synthetic fleet; returns timings (seconds)."""
    fleet = Fleet(targets, seed)
    day = 86400.0
    start = time.time() - runs * day
    record = 0.0
    with AuditStore(db) as store:
        for night in range(runs):
            if night:
                fleet.night()
            t0 = time.perf_counter()
            started = start + night * day
            run_id = store.start_run({"inventory": "/etc/fleetfix/inventory.yaml", "targets": targets},
                                     started=started)
            for result in fleet.results(with_facts=night >= runs - 2):
                store.record_target(run_id, result)
            store.finish_run(run_id, finished=started + 60 + targets * 0.01)
            record = time.perf_counter() - t0
    return {"record_last_run_s": record}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("headless Chromium is not installed (apt-get install chromium)")


def measure_in_chromium(html: Path, work: Path, query: str) -> dict[str, Any]:
    page = html.read_text()
    instrumented = work / f"measure-{html.name}"
    instrumented.write_text(page.replace("</body>", MEASURE % {"query": query} + "</body>"))
    profile = Path(tempfile.mkdtemp(prefix="profile-", dir=work))
    t0 = time.perf_counter()
    dumped = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                             instrumented.as_uri()], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    found = re.search(r'<pre id="bench-result">(.*?)</pre>', dumped.stdout, re.S)
    if not found:
        raise RuntimeError(f"no measurement in the dumped DOM: {dumped.stderr[-1000:]}")
    data: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    data["chromium_wall_s"] = round(wall, 2)
    return data


def median_browser(html: Path, work: Path, query: str, repeat: int) -> dict[str, Any]:
    """Each browser number as the median of `repeat` fresh Chromium runs (a shared machine is noisy)."""
    samples = [measure_in_chromium(html, work, query) for _ in range(repeat)]
    merged = dict(samples[0])
    for key, value in samples[0].items():
        if isinstance(value, float | int) and not isinstance(value, bool) and key != "elements":
            merged[key] = statistics.median(sample[key] for sample in samples)
    return merged


def measure(targets: int, runs: int, work: Path, repeat: int = 3) -> dict[str, Any]:
    db = work / f"audit-{targets}.db"
    db.unlink(missing_ok=True)
    timings = build_history(db, targets, runs)
    with AuditStore(db) as store:
        last = store.resolve("last")
        t0 = time.perf_counter()
        trend = store.trend(last, limit=30)
        since = store.since(last)
        history_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = load_audit(store, last)
        load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    page = html_report(run)
    render_s = time.perf_counter() - t0
    html = work / f"report-{targets}.html"
    html.write_text(page)
    browser = median_browser(html, work, "pve7/", repeat)
    return {
        "targets": targets, "runs": runs, "browser_repeats": repeat, "html_bytes": len(page.encode()),
        "db_bytes": db.stat().st_size, "trend_points": len(trend), "since_pairs": len(since),
        "history_queries_s": round(history_s, 3), "load_audit_s": round(load_s, 2),
        "render_s": round(render_s, 2), **{k: round(v, 2) for k, v in timings.items()},
        **{k: round(v, 1) if isinstance(v, float) else v for k, v in browser.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, action="append", help="fleet size (repeatable)")
    parser.add_argument("--runs", type=int, default=14, help="nights of history")
    parser.add_argument("--repeat", type=int, default=3, help="Chromium runs per size (median kept)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", type=Path, help="keep the databases and reports in this directory")
    options = parser.parse_args()
    work = options.keep or Path(tempfile.mkdtemp(prefix="fleetfix-dashboard-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for targets in options.targets or [200, 10000]:
            result = measure(targets, options.runs, work, options.repeat)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        if options.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
