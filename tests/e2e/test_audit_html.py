"""The audit's HTML dashboard opens in a real browser: headless Chromium renders the file (file://, no
network), its inline JS runs (the filter from the URL hash fades grid cells, hides groups and counts), and
each section shows what the two recorded audit runs of the lab hold. A screenshot per section at desktop
width must not be blank. Without Chromium it skips, except under CI=true, where it fails (.ci/run installs
Debian's `chromium`)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from fleetfix.audit import AuditStore, load_audit
from fleetfix.audit.dashboard import Dashboard, build_dashboard, matrix_facts
from fleetfix.probe import Fix
from tests.conftest import in_ci
from tests.e2e.chromium import (
    DESKTOP,
    SECTIONS,
    Dom,
    dump_dom,
    find_chromium,
    png_colours,
    png_size,
    screenshot_section,
)
from tests.e2e.conftest import run_cli, write_inventory
from tests.e2e.scenarios import install_toolkit, problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.unit.audit.audit_testkit import assert_versions_agree_with_problems


def recorded_dashboard(db: Path) -> Dashboard:
    """The dashboard of the newest run in db, loaded as the HTML report loads it."""
    with AuditStore(db, readonly=True) as store:
        return build_dashboard(load_audit(store, store.runs(limit=1)[0].id, facts=matrix_facts))


def chromium() -> str:
    found = find_chromium()
    if found:
        return found
    message = "headless Chromium is not installed (apt-get install chromium)"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def test_html_dashboard_renders_in_headless_chromium(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    browser = chromium()
    broken, plain = make_ct(setup=problem_case), make_ct()
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(broken.ctid, {}), (plain.ctid, {})])
    db, html = tmp_path / "audit.db", tmp_path / "report.html"
    audit = ["audit", "-i", str(inventory), "--db", str(db)]
    first = run_cli(*audit, "--json")
    assert first.exit_code == 3, first.stdout + first.stderr
    broken.sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
    second = run_cli(*audit, "--json", "--html", str(html))
    assert second.exit_code == 3, second.stdout + second.stderr
    report = second.json()
    targets = {t["target"]: t for t in report["targets"]}
    broken_name = next(name for name in targets if name.endswith(f"/{broken.ctid}"))
    plain_name = next(name for name in targets if name != broken_name)
    assert targets[broken_name]["health"] == "error" and targets[plain_name]["health"] != "error"

    dom = Dom(dump_dom(browser, html.resolve().as_uri() + "#health=error"))
    assert set(SECTIONS) <= set(dom.sections)
    # At a glance: the counts, the trend of both runs (chart and its table), the codes as filter links.
    glance = dom.text("glance")
    assert re.search(r"\b2 targets\b", glance) and re.search(r"\b1 error\b", glance)
    runs = [str(first.json()["run"]["id"]), str(report["run"]["id"])]
    rows = re.findall(r"(\d+) \d{4}-\d\d-\d\d \d\d:\d\d (\d+) (\d+) (\d+) (\d+)", glance)
    assert [row[0] for row in rows] == runs and rows[-1][1] == "1" and rows[-1][4] == "2"
    assert len(dom.find("polyline", "glance")) == 3 and len(dom.find("circle", "glance")) == 6
    bars = {a["data-code"]: a["href"] for a in dom.find("a", "glance") if "data-code" in a}
    assert bars["CUDA_RUNTIME_WITHOUT_TOOLKIT"] == "#code=CUDA_RUNTIME_WITHOUT_TOOLKIT"
    # What changed: the interrupted dpkg is new on the broken CT; its toolkit problem is older.
    drift = dom.text("drift")
    assert "+ new error DPKG_INTERRUPTED" in drift and broken_name in drift
    assert re.search(r"CUDA_RUNTIME_WITHOUT_TOOLKIT 1 \d{4}-\d\d-\d\d \d\d:\d\d \(\d+ min\) same", drift)
    # The fleet: one node row, one cell per target linking to its group; the filter ran (health=error).
    cells = dom.find("a", "fleet", class_="c")
    assert sorted(c["title"] for c in cells) == sorted(targets)
    matched = {c["title"] for c in cells if "m" in c["class"].split()}
    assert matched == {broken_name} and "filtering" in dom.find("div", "fleet", id="grid")[0]["class"]
    assert "showing 1 of 2 targets" in dom.text("fleet")
    # Problems: one group per distinct set of findings; the filter hid the other group.
    groups = dom.find("details", "problems", class_="group")
    assert len(groups) == 2
    shown = [g for g in groups if "hidden" not in g]
    assert [g["data-health"] for g in shown] == ["error"]
    assert {"DPKG_INTERRUPTED", "CUDA_RUNTIME_WITHOUT_TOOLKIT"} <= set(shown[0]["data-codes"].split())
    assert {c["href"] for c in cells if c["title"] == broken_name} == {"#" + shown[0]["id"]}
    problems = dom.text("problems")
    assert broken_name in problems and "dpkg --configure -a" in problems
    # Fixes: the exact apply line, Fix.text()'s own quoting, for the affected targets, with a copy button.
    finding = next(f for f in targets[broken_name]["findings"] if f["code"] == "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    fix = Fix.model_validate(finding["fix"])
    command = (Fix(playbook=fix.playbook, vars=fix.vars, hint="").text()
               + f" -i {inventory} --limit name:{broken_name}")
    fixes = dom.text("fixes")
    assert command in fixes
    assert dom.find("button", "fixes", class_="copy") and not [b for b in dom.find("button") if "hidden" in b]
    # Versions: torch's CUDA 12.8 without a toolkit is the mismatch, as Problems says for every target.
    versions = dom.text("versions")
    assert re.search(r"12\.8 none \S+ .*✗ mismatch no nvcc for CUDA 12\.8", versions), versions
    assert_versions_agree_with_problems(recorded_dashboard(db))

    # A filter typed as a link: the code filter from a bar, the search box from q=.
    link = html.resolve().as_uri() + "#code=DPKG_INTERRUPTED&q=" + quote(plain_name)
    by_code = Dom(dump_dom(browser, link))
    assert "showing 0 of 2 targets" in by_code.text("fleet")

    for section in SECTIONS:
        png = tmp_path / f"{section}.png"
        width, height = screenshot_section(browser, html, section, png)
        assert png_size(png) == (width, height) == (DESKTOP, height) and height > 100
        assert png_colours(png) > 50, f"the {section} screenshot looks blank"
        if os.environ.get("FLEETFIX_KEEP_SCREENSHOTS"):  # for a person to look at
            shutil.copyfile(png, Path(os.environ["FLEETFIX_KEEP_SCREENSHOTS"]) / png.name)


def test_dashboard_renders_everything_without_javascript(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    """With scripts off, the essentials are there: every section, every group and command, no filter bar
    (it needs the script), no copy buttons. A second container's toolkit lost its nvcc (the package still
    installed): Versions calls it no match, as Problems does."""
    browser = chromium()
    broken, deleted = make_ct(setup=problem_case), make_ct(setup=problem_case)
    install_toolkit(deleted, apt_repo, "12.8")
    deleted.sh("rm /usr/local/cuda-12.8/bin/nvcc && dpkg-query -W cuda-nvcc-12-8 >/dev/null")
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(broken.ctid, {}), (deleted.ctid, {})])
    html, db = tmp_path / "report.html", tmp_path / "a.db"
    audit = run_cli("audit", "-i", str(inventory), "--db", str(db), "--html", str(html))
    assert audit.exit_code == 3
    assert_versions_agree_with_problems(recorded_dashboard(db))
    page = html.read_text()
    nojs = tmp_path / "nojs.html"
    nojs.write_text(page.replace("<script>", '<script type="text/plain">', 1))  # never runs
    dom = Dom(dump_dom(browser, nojs.as_uri()))
    assert "showing" not in dom.text("fleet") and "filtering" not in dom.find("div", id="grid")[0]["class"]
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" in dom.text("problems")
    assert "fleetfix apply playbooks/cuda-toolkit.yaml" in dom.text("fixes")
    assert all("hidden" in b for b in dom.find("button", "fixes"))
    assert "nojs-hide" in dom.find("form", "fleet")[0]["class"]
    versions = dom.text("versions")
    assert re.search(r"12\.8 12\.8 \(no nvcc\) \S+ .*✗ mismatch no nvcc for CUDA 12\.8", versions), versions
    assert "toolkit matches" not in versions


def test_the_dashboard_says_the_policy_changed_and_what_it_alone_changed(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    """policy.example.yaml one night, the built-in policy the next, nothing changed on the container: the
    page says the policy changed and lists its findings apart from the target's (none)."""
    browser = chromium()
    broken = make_ct(setup=problem_case)
    inventory = write_inventory(tmp_path / "inventory.yaml", lab, [(broken.ctid, {})])
    html, db = tmp_path / "report.html", tmp_path / "a.db"
    audit = ["audit", "-i", str(inventory), "--db", str(db)]
    assert run_cli(*audit, "--policy", "policy.example.yaml").exit_code == 3
    assert run_cli(*audit, "--html", str(html)).exit_code == 3
    assert_versions_agree_with_problems(recorded_dashboard(db))
    drift = Dom(dump_dom(browser, html.resolve().as_uri())).text("drift")
    assert "No change on the targets since run 1." in drift, drift
    assert re.search(r"policy changed: policy\.example\.yaml \(sha256 [0-9a-f]{12}…\) → built-in default "
                     r"\(sha256 [0-9a-f]{12}…\) ?\. By the policy alone, not counted above: 1 new, "
                     r"0 resolved, 0 changed finding\(s\)\.", drift), drift
    assert re.search(r"\+ new info GPU_NOT_VISIBLE .* 1 \S+/" + str(broken.ctid), drift), drift


def test_the_site_filter_of_a_page_of_two_sites_runs_in_chromium() -> None:
    """The golden page of two sites (tests/unit/audit/report_golden.py), opened with a site in its link:
    the other site's grid rows, groups, fixes, drift, trend and row of the sites table step aside; the
    same page without JavaScript shows both."""
    browser = chromium()
    page = Path(__file__).resolve().parents[1] / "unit" / "audit" / "golden" / "report-sites.html"
    every = Dom(page.read_text())
    assert {r["data-site"] for r in every.find("div", "fleet", class_="row")} == {"east", "west"}
    dom = Dom(dump_dom(browser, page.as_uri() + "#site=west&health=error"))
    rows = dom.find("div", "fleet", class_="row")
    assert {r["data-site"] for r in rows if "hidden" not in r} == {"west"}
    assert all("hidden" in r for r in rows if r["data-site"] == "east")
    groups = [g for g in dom.find("details", "problems", class_="group") if "hidden" not in g]
    assert groups and {(g["data-site"], g["data-health"]) for g in groups} == {("west", "error")}
    fixes = [f for f in dom.find("div", "fixes", class_="fix") if "hidden" not in f]
    assert fixes and {f["data-site"] for f in fixes} == {"west"}
    blocks = [values for _, values, _ in dom.elements if "site-block" in values.get("class", "").split()]
    assert {(values["data-site"], "hidden" in values) for values in blocks} == {
        ("east", True), ("west", False)}
    # West's error targets, as its row of the sites table counts them, of both sites' targets.
    west = re.search(r'data-site="west">.*?<td class="num">(\d+)</td><td class="num h-error">(\d+)</td>',
                     page.read_text())
    east = re.search(r'data-site="east">.*?<td class="num">(\d+)</td><td class="num h-error">(\d+)</td>',
                     page.read_text())
    assert west and east
    total = int(west.group(1)) + int(east.group(1))
    assert f"showing {west.group(2)} of {total} targets" in dom.text("fleet")
