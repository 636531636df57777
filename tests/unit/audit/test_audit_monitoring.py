"""What deploy/ ships for Prometheus and Grafana, tied to the exporter: the alerting rules, their promtool
tests and the dashboard name only metrics and labels that a textfile written by the real exporter has (a
rename in one breaks this test), the dashboard has a panel for every metric the textfile exports, every
alert is tested firing and quiet, and promtool checks the rules, runs their tests and parses every
dashboard query.

promtool comes with Debian's `prometheus` package (.ci/run installs it); without it the promtool test is
skipped, except in CI, where it fails."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from report_golden import recorded_audit

from fleetfix.audit.report import prometheus_report
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "prometheus" / "fleetfix-alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "fleetfix-alerts.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "fleetfix-audit.json"

# The only other series the files may name: node_exporter's textfile collector's own, with their labels
# (node_exporter's collector/textfile.go: mtimeDesc and the scrape-error gauge).
NODE_EXPORTER = {"node_textfile_mtime_seconds": {"file"}, "node_textfile_scrape_error": set()}
# What Prometheus adds to every scraped series.
SCRAPE_LABELS = {"instance", "job"}

# A metric name and its selector, if any (a label value holding `}` is not used in these files).
SELECTOR = re.compile(r"\b((?:fleetfix|node)_[a-zA-Z0-9_]+)\b(?:\s*\{([^}]*)\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Labels a template uses: an annotation's {{ $labels.x }}, a legend's {{x}}.
TEMPLATE_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)|\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
# In prose (descriptions, annotations) only fleetfix's own names are taken for metrics: "node_exporter" is
# a program.
PROSE_METRIC = re.compile(r"\bfleetfix_[a-zA-Z0-9_]+")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Metric name -> its label names, in the textfile the exporter writes for a recorded audit (every
    family, per-target ones included), parsed back by prometheus_client."""
    parser = pytest.importorskip("prometheus_client.parser")
    text = prometheus_report(recorded_audit(tmp_path_factory.mktemp("monitoring"), facts=False))
    metrics: dict[str, set[str]] = {}
    for family in parser.text_string_to_metric_families(text):
        labels = metrics.setdefault(family.name, set())
        for sample in family.samples:
            assert sample.name == family.name, "a gauge's samples carry the family's name"
            labels.update(sample.labels)
    assert len(metrics) >= 13 and all(name.startswith("fleetfix_audit_") for name in metrics)
    return metrics


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, target) for every query of every panel."""
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['id']} ({panel['title']})", target


def queries() -> Iterator[tuple[str, str, list[str]]]:
    """(where, PromQL, the templates that render its series: annotations or a legend) of every query the
    rules, their tests and the dashboard hold."""
    for rule in rules():
        yield f"rule {rule['alert']}", rule["expr"], list(rule.get("annotations", {}).values())
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for series in case["input_series"]:
            yield f"test series of {case['name']!r}", series["series"], []
    board = dashboard()
    for where, target in panel_queries(board):
        yield where, target["expr"], [target.get("legendFormat", "")]
    for variable in board["templating"]["list"]:
        yield f"variable {variable['name']}", variable["definition"], []
        yield f"variable {variable['name']}", variable["query"]["query"], []


def known_labels(metric: str, exported: dict[str, set[str]]) -> set[str] | None:
    labels = exported.get(metric, NODE_EXPORTER.get(metric))
    return None if labels is None else labels | SCRAPE_LABELS


def test_rules_their_tests_and_the_dashboard_name_only_what_the_exporter_writes(
        exported: dict[str, set[str]]) -> None:
    """A metric or label renamed in the exporter (or mistyped in deploy/) fails here, not at 3 a.m."""
    problems = []
    for where, expr, templates in queries():
        found = SELECTOR.findall(expr)
        assert found, f"{where}: no metric in {expr!r}"
        available: set[str] = set(SCRAPE_LABELS)
        for metric, selector in found:
            labels = known_labels(metric, exported)
            if labels is None:
                problems.append(f"{where}: {metric} is not exported")
                continue
            available |= labels
            problems += [f"{where}: {metric} has no label {name!r}"
                         for name in MATCHER.findall(selector) if name not in labels]
        for grouping in GROUPING.findall(expr):
            problems += [f"{where}: grouped by {name!r}, which none of its metrics has"
                         for name in (part.strip() for part in grouping.split(",")) if name not in available]
        for template in templates:
            for names in TEMPLATE_LABEL.findall(template):
                problems += [f"{where}: template uses label {name!r}, which none of its metrics has"
                             for name in names if name and name not in available]
    prose = [str(value) for rule in rules() for value in rule.get("annotations", {}).values()]
    prose += [panel["description"] + " " + panel["title"] for panel in dashboard()["panels"]]
    problems += [f"prose names {name}, which is not exported"
                 for text in prose for name in PROSE_METRIC.findall(text) if name not in exported]
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_every_exported_metric_from_its_datasource_input(
        exported: dict[str, set[str]]) -> None:
    board = dashboard()
    shown = {metric for _, target in panel_queries(board) for metric, _ in SELECTOR.findall(target["expr"])}
    assert set(exported) - shown == set(), "an exported metric without a panel"
    # Importable anywhere: the Prometheus datasource is the import's input, never a site's uid.
    assert [entry["name"] for entry in board["__inputs"]] == ["DS_PROMETHEUS"]
    refs = [panel["datasource"] for panel in board["panels"]]
    refs += [target["datasource"] for _, target in panel_queries(board)]
    refs += [variable["datasource"] for variable in board["templating"]["list"]]
    assert all(ref == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for ref in refs)
    assert board["schemaVersion"] == 42 and board["uid"] == "fleetfix-audit"
    # Every panel has its own id and its own place on the 24-column grid.
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], int] = {}
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {panel['id']} overlap"
                cells[(x, y)] = panel["id"]


def test_every_alert_says_what_to_do_and_is_tested_firing_and_quiet() -> None:
    tested: dict[str, set[bool]] = {}
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, name
        assert "fleetfix probe" in rule["annotations"]["runbook"], name
        assert tested.get(name) == {True, False}, f"{name}: tested firing and quiet: {tested.get(name)}"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool not found (apt-get install prometheus)"
        if in_ci():
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_rules_runs_their_tests_and_parses_the_dashboard(tmp_path: Path) -> None:
    tool = promtool()
    # Each dashboard query as a recording rule, so that promtool parses it too ($instance as "All"
    # selected makes it: the variable's allValue).
    recorded = [{"record": f"fleetfix:dashboard_query:{number}",
                 "expr": target["expr"].replace("$instance", ".*")}
                for number, (_, target) in enumerate(panel_queries(dashboard()))]
    queries_file = tmp_path / "dashboard-queries.yaml"
    queries_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    checked = run(tool, "check", "rules", str(RULES), str(queries_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("SUCCESS") == 2, checked.stdout
    tested = run(tool, "test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
