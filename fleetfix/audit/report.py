"""Audit reports, as data or text: terminal, JSON, HTML, JUnit XML, Prometheus textfile.

Nothing here prints; the CLI does. Every report puts drift first: what changed since the baseline is
what a person reading a nightly report needs before the full list.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from fleetfix.audit import AuditRun
from fleetfix.audit.dashboard import build_dashboard, build_sites_dashboard
from fleetfix.audit.dashboard import when as short_when
from fleetfix.audit.drift import Drift, FindingChange
from fleetfix.audit.model import ALL_CODES, HEALTH_ORDER, TargetResult
from fleetfix.audit.notify import notification_lines
from fleetfix.audit.remediate import NOTHING_TO_DO, Remediation
from fleetfix.paths import check_shared_file, group_change_refused, private_dir
from fleetfix.probe import Finding
from fleetfix.terminal import safe, safe_line

SEVERITIES = ("error", "warning", "info")


def health_counts(run: AuditRun) -> dict[str, int]:
    """Targets per health, every health listed (zeros included), in HEALTH_ORDER."""
    counts = dict.fromkeys(HEALTH_ORDER, 0)
    for result in run.targets:
        counts[result.health] = counts.get(result.health, 0) + 1
    return counts


def _when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


# ---------------------------------------------------------------- terminal


def drift_lines(drift: Drift) -> list[str]:
    if drift.baseline is None:
        return ["drift: no earlier complete run to compare with"]
    if drift.empty:
        if drift.policy_change is not None:
            return [f"drift since run {drift.baseline}: none on the targets", *policy_change_lines(drift)]
        return [f"drift since run {drift.baseline}: none"]
    lines = [f"drift since run {drift.baseline}:"]
    lines += _finding_change_lines(drift.new_findings, drift.resolved_findings, drift.severity_changed)
    lines += [f"  ! UNREACHABLE {name}" for name in drift.became_unreachable]
    lines += [f"  * RECOVERED {name}" for name in drift.recovered]
    lines += [f"  > APPEARED  {name}" for name in drift.appeared]
    lines += [f"  < VANISHED  {name}" for name in drift.vanished]
    return lines + policy_change_lines(drift)


def _finding_change_lines(new: list[FindingChange], resolved: list[FindingChange],
                          severity: list[FindingChange]) -> list[str]:
    lines = [f"  + NEW       {c.target}: {c.finding.severity.value.upper()} {c.finding.code}: "
             f"{c.finding.summary}" for c in new]
    lines += [f"  - RESOLVED  {c.target}: {c.finding.code}" for c in resolved]
    lines += [f"  ~ SEVERITY  {c.target}: {c.finding.code} {c.previous_severity} -> "
              f"{c.finding.severity.value}" for c in severity]
    return lines


def policy_change_lines(drift: Drift) -> list[str]:
    """The policy change since the baseline, and the finding changes it alone explains (none: nothing
    more is said, and the output is what it was before runs recorded their policy)."""
    change = drift.policy_change
    if change is None:
        return []
    before = ", ".join(ref.label for ref in change.before)
    if not change.known:  # whether it changed is not known: said, and nothing attributed to it
        return [f"policy since run {drift.baseline} unknown: {before} -> {change.after.label}; a run's "
                "policy was not recorded (an older fleetfix), so no change is attributed to it"]
    head = f"policy changed since run {drift.baseline}: {before} -> {change.after.label}"
    if not change.changes:
        return [head + "; no finding changed by it alone"]
    return [head + f"; {change.changes} finding change(s) by the policy alone, not the targets:",
            *_finding_change_lines(change.new_findings, change.resolved_findings, change.severity_changed)]


def remediation_lines(run: AuditRun) -> list[str]:
    """What `--remediate` did, when this run holds a remediation: per target the apply's status and,
    for a re-probe run, the health before -> after."""
    remediation = run.remediation
    if remediation is None:
        return []
    mode = " --check" if remediation.check else ""
    head = f"remediation{mode} of run {remediation.source_run} with {remediation.playbook}"
    if remediation.status == NOTHING_TO_DO:
        return [f"{head}: no target had an error-severity finding; nothing applied"]
    head += f" (apply run {remediation.apply_run}): {remediation.status}"
    if remediation.error:
        head += f" — refused: {remediation.error}"
    if remediation.reprobed:
        head += f"; re-probed as run {run.info.id}"
    elif remediation.check:
        head += "; nothing changed, not re-probed"
    lines = [head]
    width = max(len(t.target) for t in remediation.targets) if remediation.targets else 0
    for item in remediation.targets:
        after = _health_after(run, remediation, item.target)
        codes = ", ".join(item.codes_before) or "-"
        lines.append(f"  {item.target:<{width}}  apply {item.apply_status:<12}  error -> {after:<11}  "
                     f"(was: {codes})" + (f"; {item.snapshot}" if item.snapshot else ""))
    return lines


def _health_after(run: AuditRun, remediation: Remediation, target: str) -> str:
    if not remediation.reprobed:
        return "error"  # nothing was re-probed: the audit's verdict stands
    result = run.run.target(target)
    return "-" if result is None else result.health


def remediation_report(run: AuditRun) -> str:
    """The short report printed after the audit's own when `--remediate` re-probed: the remediation,
    the drift it caused (against the audit run) and what still needs action on the remediated targets."""
    lines = remediation_lines(run) + drift_lines(run.drift)
    remediation = run.remediation
    remediated = {t.target for t in remediation.targets} if remediation else set()
    for result in run.targets:
        shown = [f for f in result.findings if result.target in remediated and f.severity.value != "info"]
        lines += _findings_block(f"{result.target} (after remediation)", shown)
    lines += ["", f"after remediation: {_counts(run)}"]
    return "\n".join(lines) + "\n"


def _findings_block(title: str, findings: Sequence[Finding]) -> list[str]:
    lines = ["", f"== {title}"] if findings else []
    for finding in findings:
        lines.append(f"   {finding.severity.value.upper():<7} {finding.code}: {finding.summary}")
        lines.append(f"           fix: {finding.fix.text()}")
    return lines


def _counts(run: AuditRun) -> str:
    counts = ", ".join(f"{n} {health}" for health, n in health_counts(run).items() if n)
    ignored = sum(len(result.ignored) for result in run.targets)
    # An ignored finding is no finding (no health, exit code, drift or metric), but every report names
    # it, so a policy cannot hide a problem without the report saying so.
    return f"{len(run.targets)} target(s): {counts or 'none'}" + (
        f"; {ignored} ignored by policy" if ignored else "")


def _target_cell(result: TargetResult) -> str:
    """The finding codes of a target's line, then the codes the policy ignored (or its error)."""
    codes = ", ".join(f.code for f in result.findings) or result.error
    parts = [codes] if codes else []
    if result.ignored:
        parts.append(f"ignored: {', '.join(result.ignored)}")
    return "; ".join(parts) or "-"


def text_report(run: AuditRun, *, verbose: bool = False) -> str:
    """The terminal summary: drift, then one line per target, then the findings that need action."""
    return "".join(text_pieces(run, verbose=verbose))


def text_pieces(run: AuditRun, *, verbose: bool = False) -> Iterator[str]:
    """text_report's text a line at a time: held whole, a large fleet's text and its copies on the way
    to stdout would set the audit's peak memory."""
    info = run.info
    # The site only where there are sites: a history of one reads as it always did.
    where = "" if info.site == "default" else f" at site {info.site} (controller {info.controller or '-'})"
    yield (f"audit run {info.id}{where} ({info.status}) started {_when(info.started)}"
           + (f", {info.duration:.1f}s" if info.duration is not None else "") + "\n")
    for line in drift_lines(run.drift) + remediation_lines(run) + notification_lines(info.args) + [""]:
        yield line + "\n"
    width = max((len(result.target) for result in run.targets), default=6)
    for result in run.targets:
        yield f"{result.target:<{width}}  {result.health:<11}  {_target_cell(result)}\n"
    for result in run.targets:
        shown = [f for f in result.findings if verbose or f.severity.value != "info"]
        for line in _findings_block(result.target, shown):
            yield line + "\n"
    yield "\n" + _counts(run) + "\n"


# ---------------------------------------------------------------- JSON


def json_report(run: AuditRun) -> dict[str, Any]:
    return {
        "run": run.info.to_json(),
        "drift": run.drift.to_json(),
        "summary": health_counts(run),
        "exit_code": run.exit_code,
        "targets": [result.to_json() for result in run.targets],
        "remediation": None if run.remediation is None else run.remediation.to_json(),
    }


# ---------------------------------------------------------------- HTML


def _shown(value: Any) -> Any:
    """Every {{ value }} of the page passes here before it is escaped: control, bidi and line-separator
    characters from a target become visible escapes. Markup is the template's own (tojson keeps the
    newlines it indents with; JSON already escapes control characters inside its strings)."""
    if isinstance(value, Markup):
        return Markup(safe(str(value)))
    if isinstance(value, str):
        return safe_line(value)
    return value


def _environment() -> jinja2.Environment:
    template_dir = resources.files("fleetfix.audit") / "templates"
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        autoescape=True,  # every value comes from targets (names, error text, evidence): escape it all
        finalize=_shown,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def html_report(run: AuditRun) -> str:
    """The dashboard (fleetfix.audit.dashboard computes it; the template lays it out): one file, no
    external assets, usable without JavaScript, which only adds filtering, hover details and copy."""
    return "".join(html_pieces(run))


def html_pieces(run: AuditRun) -> Iterator[str]:
    """html_report's text in the pieces the template renders it in (written to the file as they come)."""
    template = _environment().get_template("report.html.j2")
    if len(run.sites) > 1:
        # Several sites on one page: each site's remediation is on its own page (`--site`).
        return template.generate(run=run, info=run.info, dash=build_sites_dashboard(run.sites),
                                 when=short_when, remediation=[])
    return template.generate(
        run=run, info=run.info, dash=build_dashboard(run), when=short_when,
        remediation=remediation_lines(run),
    )


# ---------------------------------------------------------------- JUnit XML


def junit_report(run: AuditRun) -> str:
    """One <testsuite> per target; in it a `reachable` testcase and one testcase per finding code.
    An error-severity finding is a <failure>, a warning passes with the finding in <system-out>, a code
    the policy ignored is <skipped>; an unreachable target fails `reachable` and skips the checks."""
    return "".join(junit_pieces(run))


def junit_pieces(run: AuditRun) -> Iterator[str]:
    """junit_report's text a suite at a time: a large fleet's whole tree (dozens of testcases per target)
    and its whole text would set the audit's peak memory (docs/performance.md). The text is what one
    tree of every suite, indented, would give. The root's totals come before the suites, so they are
    counted first, by the same rule (_outcome) that writes the testcases."""
    root = ET.Element("testsuites", name="fleetfix audit", timestamp=_iso(run.info.started))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for result in run.targets:
        for key, value in _suite_counts(result).items():
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    _xml_safe(root)
    if not run.targets:
        yield ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
        return
    root.text = _SUITES  # where the suites go: the root holds only fixed words and numbers besides
    head, _, tail = ET.tostring(root, encoding="unicode", xml_declaration=True).partition(_SUITES)
    yield head
    for result in run.targets:
        yield "\n  " + _suite_text(result)
    yield "\n" + tail + "\n"


def _outcome(result: TargetResult, code: str) -> tuple[str | None, list[Finding]]:
    """What the testcase of one code holds: "failure" (the error-severity findings), "system-out" (the
    findings, none an error), "skipped" (target not probed), "ignored" (by policy) or None (passed)."""
    found = [f for f in result.findings if f.code == code]
    # Findings first: an unreachable target still carries the audit's own (STALE_AUDIT).
    errors = [f for f in found if f.severity.value == "error"]
    if errors:
        return "failure", errors
    if found:
        return "system-out", found
    if not result.reachable:
        return "skipped", []
    if code in result.ignored:
        return "ignored", []
    return None, []


def _suite_counts(result: TargetResult, kinds: Sequence[str | None] | None = None) -> dict[str, int]:
    """The suite's tests, failures, errors and skipped, in the order its attributes are written; kinds:
    the outcome of each code in ALL_CODES, when already known."""
    if kinds is None:
        kinds = [_outcome(result, code)[0] for code in ALL_CODES]
    return {"tests": 1 + len(ALL_CODES), "failures": kinds.count("failure"),
            "errors": 0 if result.reachable else 1,
            "skipped": kinds.count("skipped") + kinds.count("ignored")}


def _suite_text(result: TargetResult) -> str:
    suite = ET.Element("testsuite", name=result.target, hostname=result.node)
    reach = _testcase(suite, result, "reachable")
    reach.set("time", f"{result.duration:.3f}")
    if not result.reachable:
        ET.SubElement(reach, "error", message=result.error or result.status, type=result.status)
    outcomes = [_outcome(result, code) for code in ALL_CODES]
    for code, (kind, found) in zip(ALL_CODES, outcomes, strict=True):
        case = _testcase(suite, result, code)
        if kind == "failure":
            failure = ET.SubElement(case, "failure", message=found[0].summary, type=code)
            failure.text = "\n\n".join(_finding_text(f) for f in found)
        elif kind == "system-out":
            ET.SubElement(case, "system-out").text = "\n\n".join(_finding_text(f) for f in found)
        elif kind == "skipped":
            ET.SubElement(case, "skipped", message=f"target {result.status}")
        elif kind == "ignored":
            ET.SubElement(case, "skipped", message="ignored by policy")
    for key, value in _suite_counts(result, [kind for kind, _ in outcomes]).items():
        suite.set(key, str(value))
    _xml_safe(suite)
    ET.indent(suite, level=1)
    return ET.tostring(suite, encoding="unicode")


_SUITES = "@@fleetfix-junit-suites@@"


def _xml_safe(root: ET.Element) -> None:
    """Every text and attribute, its control characters escaped visibly: XML 1.0 cannot carry them, and
    ElementTree writes them anyway, leaving the file not well-formed."""
    for element in root.iter():
        element.text = None if element.text is None else safe(element.text)
        for key, value in element.attrib.items():
            element.set(key, safe(value))


def _testcase(suite: ET.Element, result: TargetResult, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=f"fleetfix.audit.{result.target}", name=name)


def _finding_text(finding: Finding) -> str:
    return f"{finding.severity.value.upper()} {finding.code}: {finding.summary}\nfix: {finding.fix.text()}"


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


# ---------------------------------------------------------------- Prometheus textfile


def _label_value(value: str) -> str:
    # The exposition format escapes exactly these three in label values.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_label_value(value)}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _gauge(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> Iterator[str]:
    yield f"# HELP {name} {help_text}\n"
    yield f"# TYPE {name} gauge\n"
    for labels, value in samples:
        yield f"{name}{_labels(**labels)} {_number(value)}\n"


def prometheus_report(run: AuditRun) -> str:
    """node_exporter textfile-collector format. Every finding code and health gets a series, zeros
    included, so an alert on `> 0` sees the value drop when a problem is fixed instead of going stale."""
    return "".join(prometheus_pieces(run))


def prometheus_pieces(run: AuditRun) -> Iterator[str]:
    """prometheus_report's text a line at a time (at 10,000 targets ~80,000 lines: never whole)."""
    by_code = dict.fromkeys(ALL_CODES, 0)
    by_severity = dict.fromkeys(SEVERITIES, 0)
    for result in run.targets:
        for finding in result.findings:
            by_code[finding.code] = by_code.get(finding.code, 0) + 1
            by_severity[finding.severity.value] += 1
    yield from _gauge("fleetfix_audit_findings", "Findings in the last audit run, per finding code.",
                      (({"code": code}, n) for code, n in by_code.items()))
    yield from _gauge("fleetfix_audit_findings_by_severity", "Findings in the last audit run, per severity.",
                      (({"severity": severity}, n) for severity, n in by_severity.items()))
    yield from _gauge(
        "fleetfix_audit_target_health",
        "1 for the target's health in the last audit run (healthy, info, warning, error, failed, "
        "unreachable), 0 for the others.",
        (({"target": r.target, "node": r.node, "health": health}, int(r.health == health))
         for r in run.targets for health in HEALTH_ORDER),
    )
    yield from _gauge("fleetfix_audit_target_error_findings",
                      "Error-severity findings per target in the last audit run.",
                      (({"target": r.target, "node": r.node},
                        sum(f.severity.value == "error" for f in r.findings)) for r in run.targets))
    yield from _gauge("fleetfix_audit_targets", "Targets in the last audit run, per health.",
                      (({"health": health}, n) for health, n in health_counts(run).items()))
    yield from _gauge("fleetfix_audit_unreachable_targets",
                      "Targets the last audit run could not probe (unreachable or failed).",
                      [({}, sum(not r.reachable for r in run.targets))])
    yield from _gauge("fleetfix_audit_run_duration_seconds", "Wall time of the last audit run.",
                      [({}, run.info.duration if run.info.duration is not None else float("nan"))])
    yield from _gauge("fleetfix_audit_run_complete", "1 if the last audit run completed.",
                      [({}, int(run.info.status == "complete"))])
    yield from _gauge("fleetfix_audit_last_run_timestamp_seconds", "When the last audit run started (epoch).",
                      [({}, run.info.started)])
    yield from _gauge("fleetfix_audit_new_findings", "Findings new since the baseline run.",
                      [({}, len(run.drift.new_findings))])
    yield from _gauge("fleetfix_audit_resolved_findings", "Findings resolved since the baseline run.",
                      [({}, len(run.drift.resolved_findings))])
    new_errors = new_error_findings(run.drift)
    yield from _gauge("fleetfix_audit_target_new_error_findings",
                      "Error-severity findings per target new since the baseline run (new, or there before "
                      "at a lower severity).",
                      (({"target": r.target, "node": r.node}, new_errors.get(r.target, 0))
                       for r in run.targets))
    yield from _gauge("fleetfix_audit_last_success_timestamp_seconds",
                      "When the newest complete audit run (this one, else the one before it) finished "
                      "(epoch); 0 if there is none.",
                      [({}, last_success(run))])


def new_error_findings(drift: Drift) -> dict[str, int]:
    """Per target, the error-severity findings the drift calls new or raised to error. What the policy
    alone changed is left out, as in fleetfix_audit_new_findings: the person who edited it knows."""
    counts: dict[str, int] = {}
    for change in (*drift.new_findings, *drift.severity_changed):
        if change.finding.severity.value == "error" and change.previous_severity != "error":
            counts[change.target] = counts.get(change.target, 0) + 1
    return counts


def last_success(run: AuditRun) -> float:
    """When the newest complete run up to this one finished: the run itself, else the newest complete run
    of its trend (which holds the newest complete runs before it). 0 when none is known, so that an alert
    on its age fires rather than a NaN that compares false."""
    if run.info.status == "complete" and run.info.finished is not None:
        return run.info.finished
    done = [point.finished for point in run.history.trend
            if point.status == "complete" and point.finished is not None and point.run <= run.info.id]
    return max(done, default=0.0)


# ---------------------------------------------------------------- files


def write_atomic(path: str | Path, text: str | Iterable[str], *, group: int | None = None,
                 group_option: str = "--prometheus-group") -> None:
    """Write text (or its pieces, as they come: a large report is never whole in memory) to path via a
    temporary file in the same directory and a rename, so a reader (the node_exporter textfile collector,
    a web server) sees the old file or the new one, never half; nor a file cut short when producing a
    piece fails. The file is 0600; with a group (its option named in errors), 0640 and that group."""
    target = Path(path)
    if group is not None:
        check_shared_file(target, group, group_option)
    private_dir(target.parent, group)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if group is not None:
                # On the open file, before a byte or the rename: the file the reader sees has had its group
                # from the start, and a name the collector reads never has other permissions.
                try:
                    os.fchown(fd, -1, group)
                except PermissionError:
                    raise group_change_refused(group, group_option) from None
                os.fchmod(fd, 0o640)
            if isinstance(text, str):
                handle.write(text)
            else:
                for piece in text:
                    handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        if group is None:
            # 0600 whatever the umask (mkstemp's mode; said again for clarity): a report names every target
            # and its weaknesses. A collector running as another user gets it through a group.
            os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
