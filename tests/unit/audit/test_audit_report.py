"""Reports: JSON, HTML (escaped, self-contained), JUnit (parsed back), Prometheus (parsed, strict)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from audit_testkit import FakeWorld, edited, finding, interrupt_dpkg, make_target

from fleetfix.audit import (
    DEFAULT_POLICY,
    AuditRun,
    AuditStore,
    Policy,
    TargetResult,
    load_audit,
    run_audit,
)
from fleetfix.audit.drift import FindingChange
from fleetfix.audit.model import ALL_CODES as CODES  # the probe's codes and the audit's own
from fleetfix.audit.report import (
    html_report,
    json_report,
    junit_report,
    prometheus_report,
    text_report,
    write_atomic,
)


@pytest.fixture
def audit(tmp_path: Path) -> AuditRun:
    """Run 2 of a fleet: one healthy, one newly broken, the problem case, one stopped CT."""
    world = FakeWorld({200: "healthy", 201: "healthy", 202: "problem_case", 203: "stopped"})
    targets = [make_target("pve1", n) for n in (200, 201, 202, 203)]
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        world.cts[201] = edited("healthy", interrupt_dpkg)
        return run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)


def test_json_report_has_drift_summary_and_targets(audit: AuditRun) -> None:
    data = json.loads(json.dumps(json_report(audit)))
    assert list(data)[:2] == ["run", "drift"]
    assert [c["code"] for c in data["drift"]["new_findings"]] == ["DPKG_INTERRUPTED"]
    assert data["summary"]["error"] == 2 and data["summary"]["unreachable"] == 1
    assert data["exit_code"] == 4
    assert {t["target"]: t["health"] for t in data["targets"]}["pve1/200"] == "healthy"


def test_html_is_escaped_and_self_contained(audit: AuditRun, tmp_path: Path) -> None:
    hostile = TargetResult("pve9/<b>x</b>", "pve9", 9, "failed", error="<script>alert(1)</script>")
    evil = TargetResult("pve9/2", "pve9", 2, "ok", findings=(
        finding("DISK_LOW", "warning", path='/"><img src=x onerror=alert(1)>'),))
    forged = TargetResult("pve9/3\x1b[2K\u202e", "pve9", 3, "unreachable", error="refused\r\nok: all healthy")
    run = AuditRun(type(audit.run)(audit.info, (*audit.targets, hostile, evil, forged)), audit.drift)
    page = html_report(run)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page and "<img src=x" not in page
    # Control and bidi characters from a target are shown as escapes, never written raw.
    assert not {"\x1b", "\u202e", "\r"} & set(page)
    assert "pve9/3\\x1b[2K\\u202e" in page and "refused\\r\\nok: all healthy" in page
    # No external assets: nothing loads anything, links are in-page anchors, one inline script.
    tags = html_tags(page)
    assert not [t for t in tags if t[0] in ("link", "img", "iframe", "object", "embed", "base")]
    assert not [t for t in tags if "src" in t[1]]
    assert {href[:1] for href in re.findall(r'href="([^"]*)"', page)} == {"#"}
    assert [t[0] for t in tags].count("script") == 1
    assert not re.search(r"@import|url\(|fetch\(|XMLHttpRequest|\bimport\(", page)
    # The sections, in the order a person reads them, drift before the details.
    order = [page.index(f'<section id="{name}"') for name in
             ("glance", "drift", "fleet", "problems", "fixes", "versions")]
    assert order == sorted(order)
    assert re.search(r'k-new">\+ new</td>\s*<td><span class="badge h-error">error</span> '
                     r'<span class="mono">DPKG_INTERRUPTED</span>', page)
    assert "fleetfix apply playbooks/cuda-toolkit.yaml" in page
    assert '&#34;pending_updates&#34;: 3' in page or '"pending_updates": 3' in page


def html_tags(page: str) -> list[tuple[str, list[str]]]:
    tags: list[tuple[str, list[str]]] = []

    class Collector(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            tags.append((tag, [name for name, _ in attrs]))

    Collector().feed(page)
    return tags


def test_junit_has_a_testcase_per_target_and_check(audit: AuditRun) -> None:
    root = ET.fromstring(junit_report(audit).split("\n", 1)[1])
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert list(suites) == ["pve1/200", "pve1/201", "pve1/202", "pve1/203"]
    for suite in suites.values():
        names = [case.get("name") for case in suite.iter("testcase")]
        assert names == ["reachable", *CODES]
        assert int(suite.get("tests", "")) == len(names)
        assert int(suite.get("failures", "")) == len(suite.findall("testcase/failure"))
    broken = suites["pve1/201"].find("testcase[@name='DPKG_INTERRUPTED']/failure")
    assert broken is not None and "dpkg --configure -a" in (broken.text or "")
    assert suites["pve1/200"].find("testcase/failure") is None
    warning = suites["pve1/202"].find("testcase[@name='EXTENSION_MISSING']")
    assert warning is not None and warning.find("failure") is None and warning.find("system-out") is not None
    stopped = suites["pve1/203"]
    assert stopped.find("testcase[@name='reachable']/error") is not None
    assert len(stopped.findall("testcase/skipped")) == len(CODES)
    assert int(root.get("failures", "")) == sum(int(s.get("failures", "")) for s in suites.values())


def test_a_code_the_policy_ignores_follows_one_rule_in_every_format(tmp_path: Path) -> None:
    """Ignored is not a finding (no health, exit code or metric) and every report names it as ignored:
    the terminal on the target's line and in an "N ignored" total, JSON in `ignored`, HTML as "Ignored by
    policy", JUnit as a skipped testcase."""
    world = FakeWorld({200: "problem_case", 201: "healthy"})
    targets = [make_target("pve1", n) for n in (200, 201)]
    policy = Policy(severity={"EXTENSION_MISSING": "ignore"})
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run = run_audit(fleet, targets, policy=policy, store=store)
    [result, _] = run.targets
    assert result.ignored == ("EXTENSION_MISSING",)
    assert "EXTENSION_MISSING" not in [f.code for f in result.findings]

    text = text_report(run, verbose=True)
    [line] = [line for line in text.splitlines() if line.startswith("pve1/200 ")]
    assert line.endswith("; ignored: EXTENSION_MISSING"), line
    assert text.rstrip().endswith("; 1 ignored by policy")
    assert "EXTENSION_MISSING:" not in text  # not listed as a finding, with its fix

    data = json.loads(json.dumps(json_report(run)))
    assert data["targets"][0]["ignored"] == ["EXTENSION_MISSING"]
    assert "EXTENSION_MISSING" not in [f["code"] for f in data["targets"][0]["findings"]]

    assert re.search(r"Ignored by policy: [^<]*EXTENSION_MISSING", html_report(run))

    root = ET.fromstring(junit_report(run).split("\n", 1)[1])
    case = root.find("testsuite[@name='pve1/200']/testcase[@name='EXTENSION_MISSING']")
    assert case is not None and [child.tag for child in case] == ["skipped"]
    assert case[0].get("message") == "ignored by policy"

    assert 'fleetfix_audit_findings{code="EXTENSION_MISSING"} 0\n' in prometheus_report(run)


def test_terminal_line_of_a_target_with_only_ignored_codes_or_an_error() -> None:
    from fleetfix.audit.report import _target_cell

    assert _target_cell(TargetResult("t", "n", 1, "ok", ignored=("GPU_NOT_VISIBLE",))) == \
        "ignored: GPU_NOT_VISIBLE"
    assert _target_cell(TargetResult("t", "n", 1, "ok")) == "-"
    assert _target_cell(TargetResult("t", "n", 1, "unreachable", error="refused",
                                     ignored=("STALE_AUDIT",))) == "refused; ignored: STALE_AUDIT"


SAMPLE = re.compile(
    r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*")*)\})? (?P<value>-?[0-9.eE+-]+|NaN|[+-]Inf)'
)


def strict_exposition_check(text: str) -> dict[str, list[str]]:
    """The text format's rules: HELP and TYPE before a family's samples, families contiguous, no
    duplicate series, ends with a newline. Returns sample lines per family."""
    assert text.endswith("\n")
    families: dict[str, list[str]] = {}
    current, seen = None, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
            assert current not in families, f"family {current} repeated"
            families[current] = []
        elif line.startswith("# TYPE "):
            assert line.split()[2:] == [current, "gauge"], line
        else:
            match = SAMPLE.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            assert match["name"] == current, f"{line!r} outside its family"
            series = (match["name"], match["labels"])
            assert series not in seen, f"duplicate series {line!r}"
            seen.add(series)
            families[current].append(line)
    return families


def test_prometheus_textfile_parses_and_counts(audit: AuditRun) -> None:
    text = prometheus_report(audit)
    families = strict_exposition_check(text)
    assert len(families["fleetfix_audit_findings"]) == len(CODES)
    parser = pytest.importorskip("prometheus_client.parser")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in parser.text_string_to_metric_families(text) for s in family.samples}
    assert samples[("fleetfix_audit_findings", (("code", "DPKG_INTERRUPTED"),))] == 1
    assert samples[("fleetfix_audit_findings", (("code", "DRIVER_TOO_OLD"),))] == 0
    assert samples[("fleetfix_audit_unreachable_targets", ())] == 1
    assert samples[("fleetfix_audit_new_findings", ())] == 1
    health = (("health", "error"), ("node", "pve1"), ("target", "pve1/201"))
    assert samples[("fleetfix_audit_target_health", health)] == 1
    assert samples[("fleetfix_audit_run_duration_seconds", ())] == pytest.approx(audit.info.duration)


def prometheus_samples(run: AuditRun) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = prometheus_report(run)
    strict_exposition_check(text)
    parser = pytest.importorskip("prometheus_client.parser")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_prometheus_new_error_findings_per_target(audit: AuditRun) -> None:
    """What an alert on new errors needs: per target, the error findings that are new since the baseline,
    every target listed (zeros included), so the alert names the target and clears on the next run."""
    new = {dict(labels)["target"]: value for (name, labels), value in prometheus_samples(audit).items()
           if name == "fleetfix_audit_target_new_error_findings"}
    # 201 broke last night; 202 was broken the night before too (not new); 203 is not probed.
    assert new == {"pve1/200": 0, "pve1/201": 1, "pve1/202": 0, "pve1/203": 0}
    # A finding raised to error counts as a new error; one lowered from error does not.
    raised = FindingChange("pve1/200", finding("DISK_LOW", "error", path="/"), previous_severity="warning")
    lowered = FindingChange("pve1/202", finding("DISK_LOW", "warning", path="/"), previous_severity="error")
    run = AuditRun(audit.run, dataclasses.replace(audit.drift, severity_changed=[raised, lowered]))
    new = {dict(labels)["target"]: value for (name, labels), value in prometheus_samples(run).items()
           if name == "fleetfix_audit_target_new_error_findings"}
    assert new["pve1/200"] == 1 and new["pve1/202"] == 0


def test_prometheus_last_success_is_the_newest_complete_run(tmp_path: Path) -> None:
    """An alert on "no audit for a day" reads when the newest complete run finished: a killed run's file
    still carries it; a history with no complete run says 0 (an age that alerts), never NaN."""
    def last_success(run: AuditRun) -> float:
        return prometheus_samples(run)[("fleetfix_audit_last_success_timestamp_seconds", ())]

    healthy = TargetResult("pve1/200", "pve1", 200, "ok")
    with AuditStore(tmp_path / "a.db") as store:
        never = store.start_run(started=1_000.0)
        store.record_target(never, healthy)
        assert last_success(load_audit(store, never)) == 0
        done = store.start_run(started=2_000.0)
        store.record_target(done, healthy)
        store.finish_run(done, finished=2_100.0)
        assert last_success(load_audit(store, done)) == 2_100.0
        killed = store.start_run(started=3_000.0)
        store.record_target(killed, healthy)
        run = load_audit(store, killed)
    assert last_success(run) == 2_100.0
    samples = prometheus_samples(run)
    assert samples[("fleetfix_audit_run_complete", ())] == 0
    assert samples[("fleetfix_audit_last_run_timestamp_seconds", ())] == 3_000.0


def test_prometheus_label_values_are_escaped(audit: AuditRun) -> None:
    odd = TargetResult('a"b\\c\nd', "pve1", None, "ok")
    run = AuditRun(type(audit.run)(audit.info, (odd,)), audit.drift)
    text = prometheus_report(run)
    strict_exposition_check(text)
    assert 'target="a\\"b\\\\c\\nd"' in text


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics" / "fleetfix.prom"
    write_atomic(path, "old 1\n")  # private whatever the umask (issue 18)
    assert path.read_text() == "old 1\n" and oct(path.stat().st_mode & 0o777) == "0o600"

    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(path, "new 2\n")
    assert path.read_text() == "old 1\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["fleetfix.prom"]  # no temp file left


def test_show_re_renders_a_stored_run_identically(audit: AuditRun, tmp_path: Path) -> None:
    with AuditStore(tmp_path / "a.db") as store:
        again = load_audit(store, audit.info.id)
    assert json_report(again) == json_report(audit)
