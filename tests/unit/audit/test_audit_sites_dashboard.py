"""One HTML dashboard over several sites: `audit show last --html` without --site renders the newest run of
every site, each with its own drift and trend, and a site filter; --site keeps the one-site page. Each
test runs on both backends (the `history` fixture)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from audit_testkit import assert_versions_agree_with_problems, finding
from click.testing import CliRunner

from fleetfix.audit import AuditStore, TargetResult, load_audit
from fleetfix.audit.dashboard import build_dashboard, build_sites_dashboard
from fleetfix.audit.report import html_report
from fleetfix.cli import main


def _result(target: str, *codes: str) -> TargetResult:
    # Probed, with a torch without CUDA: each target has its row in Versions.
    return TargetResult(target=target, node=target.split("/")[0], ctid=None, status="ok",
                        findings=tuple(finding(code) for code in codes),
                        facts={"pythons": [{"torch": {"cuda": None}}]})


def _run(store: AuditStore, started: float, inventory: str, *results: TargetResult) -> int:
    run_id = store.start_run({"inventory": inventory}, started=started)
    store.record_targets(run_id, results)
    store.finish_run(run_id, finished=started + 1)
    return run_id


def _two_sites(history: str | Path) -> dict[str, int]:
    """East: pve1/200 gains DPKG_INTERRUPTED on night 2. West: the same target name (another machine)
    has DISK_LOW both nights and pve2/300 loses DPKG_INTERRUPTED; west's night 2 runs last of all."""
    with AuditStore(history, site="east", controller="ctl-e") as east, \
            AuditStore(history, site="west", controller="ctl-w") as west:
        _run(east, 100.0, "east.yaml", _result("pve1/200"), _result("pve1/201"))
        _run(west, 110.0, "west.yaml", _result("pve1/200", "DISK_LOW"),
             _result("pve2/300", "DPKG_INTERRUPTED"))
        e2 = _run(east, 200.0, "east.yaml", _result("pve1/200", "DPKG_INTERRUPTED"), _result("pve1/201"))
        w2 = _run(west, 210.0, "west.yaml", _result("pve1/200", "DISK_LOW"), _result("pve2/300"))
    return {"east": e2, "west": w2}


def test_one_page_shows_every_sites_newest_run_with_its_own_drift(history: str | Path) -> None:
    newest = _two_sites(history)
    with AuditStore(history, readonly=True) as store:
        assert store.newest_per_site() == [newest["east"], newest["west"]]
        runs = [load_audit(store, run_id) for run_id in store.newest_per_site()]
    dash = build_sites_dashboard(runs)
    east, west = dash.sites
    assert (east.site, east.controller, east.run, west.site, west.controller, west.run) == (
        "east", "ctl-e", newest["east"], "west", "ctl-w", newest["west"])
    # each site's drift is against its own previous run
    assert [(i.kind, i.code, [n for n, _ in i.targets]) for i in east.drift.items] == [
        ("new", "DPKG_INTERRUPTED", ["pve1/200"])]
    assert [(i.kind, i.code, [n for n, _ in i.targets]) for i in west.drift.items] == [
        ("resolved", "DPKG_INTERRUPTED", ["pve2/300"])]
    assert [p.code for p in west.drift.still_open] == ["DISK_LOW"] and east.drift.still_open == ()
    # its own trend: its own two runs
    assert [p.run for p in east.trend.rows] == [newest["east"] - 2, newest["east"]]
    # both sites' targets, each in its own site's groups, grid rows and fixes
    assert dash.glance.total == 4
    assert sorted((g.site, t.name) for g in dash.groups for t in g.targets) == [
        ("east", "pve1/200"), ("east", "pve1/201"), ("west", "pve1/200"), ("west", "pve2/300")]
    assert len({g.id for g in dash.groups}) == len(dash.groups)
    assert [(r.site, r.node) for r in dash.grid] == [("east", "pve1"), ("west", "pve1"), ("west", "pve2")]
    assert {(f.site, f.codes) for f in dash.fixes} == {
        ("east", ("DPKG_INTERRUPTED",)), ("west", ("DISK_LOW",))}
    assert all(f"-i {f.site}.yaml" in (f.command or f"-i {f.site}.yaml") for f in dash.fixes)
    assert_versions_agree_with_problems(dash)

    page = html_report(dataclasses.replace(runs[-1], sites=tuple(runs)))
    options = re.search(r'<select id="site-filter">(.*?)</select>', page)
    assert options is not None
    assert re.findall(r'<option value="([^"]*)">', options.group(1)) == ["", "east", "west"]
    assert page.count('class="row" data-node="pve1"') == 2
    assert 'data-site="east"' in page and 'data-site="west"' in page
    drift_east = page[page.index('id="drift-s1"'):page.index('id="drift-s2"')]
    drift_west = page[page.index('id="drift-s2"'):page.index('<section id="fleet"')]
    assert "DPKG_INTERRUPTED" in drift_east and "+ new" in drift_east and "resolved</td>" not in drift_east
    assert "\N{MINUS SIGN} resolved" in drift_west and "+ new" not in drift_west and "DISK_LOW" in drift_west
    assert len(re.findall(r' id="([^"]+)"', page)) == len(set(re.findall(r' id="([^"]+)"', page)))


def test_the_cli_renders_all_sites_without_site_and_one_with_it(history: str | Path, tmp_path: Path) -> None:
    newest = _two_sites(history)

    def show(*args: str) -> str:
        out = tmp_path / "page.html"
        result = CliRunner().invoke(main, ["audit", "show", "last", "--db", str(history), "--html", str(out),
                                           *args])
        assert result.exit_code in (0, 3), result.output
        return out.read_text()

    both = show()
    assert '<select id="site-filter">' in both and "2 sites" in both
    for run_id in newest.values():
        assert f'<td class="num">{run_id}</td>' in both
    east = show("--site", "east")
    assert "site-filter" not in east and f"run {newest['east']} at site east" in east
    with AuditStore(history, readonly=True) as store:
        assert east == html_report(load_audit(store, newest["east"], facts=True))


def test_a_history_of_one_site_renders_as_before(history: str | Path, tmp_path: Path) -> None:
    with AuditStore(history) as store:
        _run(store, 100.0, "inv.yaml", _result("pve1/200"))
        run_id = _run(store, 200.0, "inv.yaml", _result("pve1/200", "DISK_LOW"))
    out = tmp_path / "page.html"
    result = CliRunner().invoke(main, ["audit", "show", "last", "--db", str(history), "--html", str(out)])
    assert result.exit_code in (0, 3), result.output
    with AuditStore(history, readonly=True) as store:
        run = load_audit(store, run_id, facts=True)
    assert out.read_text() == html_report(run) and "site-filter" not in out.read_text()
    assert build_dashboard(run).sites == ()
