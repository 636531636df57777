"""The dashboard's view model (fleetfix.audit.dashboard): groups, grid, fixes, versions, drift, trend, and
the treatment of untrusted text; on hand-made runs, and on a real audit of the fake fleet."""

from __future__ import annotations

import copy
import dataclasses
import shlex
from pathlib import Path
from typing import Any

from audit_testkit import (
    FakeWorld,
    assert_versions_agree_with_problems,
    edited,
    interrupt_dpkg,
    load_fixture,
    make_target,
)

from fleetfix.audit import DEFAULT_POLICY, AuditRun, AuditStore, RunInfo, StoredRun, TargetResult, run_audit
from fleetfix.audit.dashboard import (
    DRIVER_CODES,
    STACK_CODES,
    TOOLKIT_CODES,
    build_dashboard,
    fix_commands,
    grid_rows,
    natural_key,
    problem_groups,
    trend_chart,
    version_matrix,
)
from fleetfix.audit.drift import compute_drift
from fleetfix.audit.model import History, TrendPoint
from fleetfix.probe import Facts, Finding, Fix, NodeFacts, Severity, diagnose
from fleetfix.probe.rules import CODES
from fleetfix.terminal import has_control, safe, safe_line

TOOLKIT_FIX = Fix(playbook="playbooks/cuda-toolkit.yaml", vars={"cuda_version": "12.8"},
                  hint="install cuda-nvcc-12-8")


def find(code: str, severity: str = "error", *, summary: str | None = None, fix: Fix | None = None,
         **evidence: Any) -> Finding:
    return Finding(code=code, severity=Severity(severity), summary=summary or f"{code} summary",
                   evidence=evidence, fix=fix or Fix(hint=f"fix {code} by hand"))


def ok(name: str, *findings: Finding, node: str | None = None, facts: dict[str, Any] | None = None,
       node_facts: dict[str, Any] | None = None) -> TargetResult:
    return TargetResult(name, node or name.split("/")[0], None, "ok", findings=findings, facts=facts,
                        node_facts=node_facts)


def audit_run(*results: TargetResult, args: dict[str, Any] | None = None, history: History | None = None,
              previous: tuple[TargetResult, ...] | None = None) -> AuditRun:
    run = StoredRun(RunInfo(2, 1_000_000.0, 1_000_060.0, "complete", args=args or {}), results)
    before = None if previous is None else StoredRun(RunInfo(1, 900_000.0, 900_060.0, "complete"), previous)
    return AuditRun(run, compute_drift(before, run), history or History())


# ---------------------------------------------------------------- groups


def test_targets_with_the_same_findings_are_one_group_worst_and_biggest_first() -> None:
    repo = find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)
    results = [
        *(ok(f"pve1/{n}", find("DISK_LOW", "warning", summary=f"{n} MiB free", path="/"), repo)
          for n in (200, 201, 210)),
        ok("pve2/300", find("DISK_LOW", "warning", summary="9 MiB free", path="/"), repo),
        ok("pve2/301", repo),
        ok("pve2/302"),
        TargetResult("pve3/400", "pve3", None, "unreachable", error="connection refused"),
        ok("pve1/202", find("DISK_LOW", "warning", path="/var")),  # another path: another problem
    ]
    since = {("pve1/200", "DISK_LOW"): 50.0, ("pve2/300", "NVIDIA_REPO_NOT_CONFIGURED"): 40.0,
             ("pve1/201", "DISK_LOW"): 70.0}
    groups = problem_groups(results, since)
    assert [(g.health, len(g.targets)) for g in groups] == [
        ("unreachable", 1), ("error", 4), ("error", 1), ("warning", 1), ("healthy", 1)]
    assert [g.id for g in groups] == ["g1", "g2", "g3", "g4", "g5"]
    big = groups[1]
    assert [t.name for t in big.targets] == ["pve1/200", "pve1/201", "pve1/210", "pve2/300"]
    assert big.codes == ("NVIDIA_REPO_NOT_CONFIGURED", "DISK_LOW")  # errors before warnings
    assert big.nodes == (("pve1", 3), ("pve2", 1))
    assert big.since == 40.0 and [t.since for t in big.targets] == [50.0, 70.0, None, 40.0]
    disk = next(f for f in big.findings if f.code == "DISK_LOW")
    assert disk.summary == "200 MiB free" and disk.summary_varies  # one text, marked as varying
    assert not next(f for f in big.findings if f.code != "DISK_LOW").summary_varies
    assert big.findings[0].fix_text == TOOLKIT_FIX.text()
    assert groups[0].targets[0].error == "connection refused" and groups[0].title == "unreachable"
    assert groups[-1].title == "no findings"


def test_grid_has_nodes_as_rows_and_cells_in_name_order_linked_to_their_group() -> None:
    results = [ok("pve10/1"), ok("pve2/110", find("DPKG_INTERRUPTED")), ok("pve2/20"),
               ok("pve2", node="pve2"),
               TargetResult("pve2/9", "pve2", None, "failed", error="probe output is not JSON")]
    groups = problem_groups(results, {})
    rows = grid_rows(results, groups)
    assert [row.node for row in rows] == ["pve2", "pve10"]
    assert [c.name for c in rows[0].cells] == ["pve2", "pve2/9", "pve2/20", "pve2/110"]
    assert [c.health for c in rows[0].cells] == ["healthy", "failed", "healthy", "error"]
    group_of = {t.name: g.id for g in groups for t in g.targets}
    assert all(c.group == group_of[c.name] for row in rows for c in row.cells)
    assert rows[0].counts == (("failed", 1), ("error", 1), ("healthy", 2)) and rows[0].worst == "failed"
    assert sorted(["b10", "b9", "a"], key=natural_key) == ["a", "b9", "b10"]


# ---------------------------------------------------------------- fixes


def test_one_command_per_fix_for_all_its_targets_quoted_exactly_as_fix_text() -> None:
    odd = Fix(playbook="playbooks/build-extensions.yaml",
              vars={"extensions": ["causal_conv1d", "flash_attn"], "python": "/opt/my env/bin/python's"},
              hint="build them")
    results = [
        ok("pve1/201", find("CUDA_RUNTIME_WITHOUT_TOOLKIT", fix=TOOLKIT_FIX),
           find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)),
        ok("pve1/200", find("CUDA_TOOLKIT_MINOR_MISMATCH", "warning", fix=TOOLKIT_FIX)),
        ok("pve2/7", find("EXTENSION_MISSING", "warning", fix=odd)),
        ok("pve2/8", find("DPKG_INTERRUPTED")),
    ]
    fixes = fix_commands(results, {"inventory": "/etc/fleet fix/inv.yaml"})
    assert [f.codes for f in fixes] == [
        ("CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED", "CUDA_TOOLKIT_MINOR_MISMATCH"),
        ("EXTENSION_MISSING",), ("DPKG_INTERRUPTED",)]
    toolkit, build, manual = fixes
    assert toolkit.severity == "error" and toolkit.targets == ("pve1/200", "pve1/201")
    assert toolkit.command == (TOOLKIT_FIX.text().split(" — ")[0]
                               + " -i '/etc/fleet fix/inv.yaml' --limit name:pve1/200,name:pve1/201")
    # The fix's own words, quoted by Fix.text(), come first and unchanged; the shell reads them back.
    assert build.command is not None and build.command.startswith(odd.text().split(" — ")[0] + " -i ")
    assert shlex.split(build.command) == [
        "fleetfix", "apply", "playbooks/build-extensions.yaml",
        "--var", "extensions=causal_conv1d,flash_attn", "--var", "python=/opt/my env/bin/python's",
        "-i", "/etc/fleet fix/inv.yaml", "--limit", "name:pve2/7"]
    assert manual.command is None and manual.hint == "fix DPKG_INTERRUPTED by hand"
    assert all(f.copyable for f in (toolkit, build)) and not manual.copyable
    assert toolkit.hints == ()  # one hint for every code: shown once
    by_ct = [dataclasses.replace(r, ctid=ctid) for r, ctid in zip(results[:2], (201, 200), strict=True)]
    adhoc = fix_commands(by_ct, {"host": "10.1.2.6", "inventory": None})
    assert adhoc[0].command is not None
    assert adhoc[0].command.endswith("cuda_version=12.8 --host 10.1.2.6 --ct 200 --ct 201")


def test_control_characters_never_reach_a_command_offered_to_copy() -> None:
    evil_var = Fix(playbook="playbooks/cuda-toolkit.yaml", vars={"cuda_version": "12.8\nrm -rf /"}, hint="")
    results = [
        ok("pve1/200", find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)),
        ok("pve1/2\x1b[2K01", find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)),
        ok("pve1/\u202e302", find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)),
        ok("pve1/300", find("CUDA_RUNTIME_WITHOUT_TOOLKIT", fix=evil_var)),
    ]
    toolkit, evil = fix_commands(results, {})
    assert toolkit.command == TOOLKIT_FIX.text().split(" — ")[0] + " --limit name:pve1/200"
    assert toolkit.copyable and set(toolkit.left_out) == {"pve1/2\x1b[2K01", "pve1/\u202e302"}
    assert evil.command is not None and "\n" in evil.command and not evil.copyable


def test_the_sanitiser_shows_control_bidi_and_line_separators_as_escapes() -> None:
    assert safe_line("pve1/200") == "pve1/200" and safe_line("Zürich ✓ 東京") == "Zürich ✓ 東京"
    assert safe_line("a\x1b[31mb\rc") == "a\\x1b[31mb\\rc"
    assert safe_line("x\u202ey\u2028z\u200b") == "x\\u202ey\\u2028z\\u200b"
    assert safe_line("a\nb") == "a\\nb" and safe("a\nb\tc") == "a\nb\tc"
    assert has_control("a\nb") and not has_control("pve1/200")


# ---------------------------------------------------------------- versions


def facts(cuda: str | None, toolkits: tuple[str, ...], *, driver: str | None = None,
          gpus: tuple[str, ...] = (), without_nvcc: tuple[str, ...] = ()) -> dict[str, Any]:
    """problem_case's facts with torch's CUDA, the /usr/local toolkits (those in without_nvcc: the
    directory still there, its nvcc deleted), the driver and the GPUs replaced."""
    data = copy.deepcopy(load_fixture("problem_case"))
    data["pythons"][0]["torch"]["cuda"] = cuda
    data["cuda"]["toolkits"] = [
        {"path": f"/usr/local/cuda-{v}", "version": v,
         "nvcc": None if v in without_nvcc else f"/usr/local/cuda-{v}/bin/nvcc",
         "release": None if v in without_nvcc else f"V{v}.1"}
        for v in toolkits]
    data["gpu"].update(driver_version=driver, names=list(gpus))
    return data


def probed(name: str, data: dict[str, Any], node_facts: dict[str, Any] | None = None) -> TargetResult:
    """A target as an audit records it: the rules' findings on its facts."""
    node = NodeFacts.model_validate(node_facts) if node_facts else None
    return ok(name, *diagnose(Facts.model_validate(data), node), facts=data, node_facts=node_facts)


def test_version_matrix_counts_stacks_and_flags_mismatches() -> None:
    results = [
        probed("pve1/1", facts("12.8", ("12.8",), driver="570.124.06", gpus=("NVIDIA H200",))),
        probed("pve1/2", facts("12.8", ("12.8",), driver="570.124.06", gpus=("NVIDIA H200",) * 2)),
        probed("pve3/1", facts("12.8", ("12.4",), driver="570.124.06")),
        probed("pve3/2", facts("12.8", ("12.4",), driver="570.124.06")),
        probed("pve3/3", facts("12.8", ("12.8",), driver="570.124.06")),
        probed("pve4/1", facts("12.8", ("13.0", "12.8")), {"kernel_module_version": "470.82.01"}),
        probed("pve5/1", facts("12.8", ())),
        probed("pve6/1", facts(None, ())),
        TargetResult("pve7/1", "pve7", None, "unreachable"),
    ]
    matrix = version_matrix(results)
    rows = {(r.torch_cuda, r.toolkits, r.driver): r for r in matrix.rows}
    assert rows[("12.8", "12.4", "570.124.06")].verdict == "warning"
    assert rows[("12.8", "12.4", "570.124.06")].nodes == (("pve3", 2),)
    assert rows[("12.8", "12.4", "570.124.06")].note == "minor mismatch: nvcc 12.4 for CUDA 12.8"
    healthy = rows[("12.8", "12.8", "570.124.06")]
    assert healthy.verdict == "ok" and healthy.targets == ("pve1/1", "pve1/2", "pve3/3")
    assert healthy.note == "toolkit matches CUDA 12.8"
    assert healthy.gpus == (("NVIDIA H200", 1), ("2 x NVIDIA H200", 1), ("none visible", 1))
    # The node's own kernel module wins over what the container saw, and is checked against CUDA 12.
    old = rows[("12.8", "13.0 + 12.8", "470.82.01")]
    assert old.verdict == "error" and "driver 470.82.01 too old for CUDA 12 (needs ≥ 525)" in old.note
    assert rows[("12.8", "none", "unknown")].note == "no nvcc for CUDA 12.8"
    assert rows[("CPU build", "none", "unknown")].verdict == "ok"
    assert matrix.unprobed == 1
    assert [r.verdict for r in matrix.rows][:3] == ["error", "error", "warning"]  # mismatches first
    assert matrix.pivot[("12.8", "12.8")] == (3, "ok") and matrix.pivot[("12.8", "12.4")] == (2, "warning")
    assert matrix.torch_versions == ("12.8", "CPU build")
    assert_versions_agree_with_problems(build_dashboard(audit_run(*results)))


def test_a_toolkit_whose_nvcc_was_deleted_is_no_match_in_versions_as_in_problems() -> None:
    """The nvcc deleted, the toolkit's package (and directory) still there: the rules find no nvcc, and
    the Versions view says so rather than "toolkit matches CUDA 12.8"."""
    result = probed("pve1/1", facts("12.8", ("12.8",), driver="570.124.06", without_nvcc=("12.8",)))
    assert [f.code for f in result.findings if f.code in STACK_CODES] == ["CUDA_RUNTIME_WITHOUT_TOOLKIT"]
    dash = build_dashboard(audit_run(result))
    [row] = dash.versions.rows
    assert (row.toolkits, row.verdict, row.note) == ("12.8 (no nvcc)", "error", "no nvcc for CUDA 12.8")
    assert dash.versions.pivot[("12.8", "12.8 (no nvcc)")] == (1, "error")
    assert_versions_agree_with_problems(dash)


def test_versions_read_the_findings_after_the_policy() -> None:
    """Severity overridden or code ignored by the policy: Versions follows what Problems shows."""
    data = facts("12.8", ("12.4",), driver="570.124.06")
    [minor] = [f for f in probed("t", data).findings if f.code == "CUDA_TOOLKIT_MINOR_MISMATCH"]
    raised = ok("pve1/1", minor.model_copy(update={"severity": Severity.ERROR}), facts=data)
    dropped = TargetResult("pve1/2", "pve1", None, "ok", facts=data, ignored=("CUDA_TOOLKIT_MINOR_MISMATCH",))
    dash = build_dashboard(audit_run(raised, dropped))
    rows = {r.targets: r for r in dash.versions.rows}
    assert (rows[("pve1/1",)].verdict, rows[("pve1/1",)].note) == (
        "error", "minor mismatch: nvcc 12.4 for CUDA 12.8")
    assert (rows[("pve1/2",)].verdict, rows[("pve1/2",)].note) == (
        "ok", "CUDA_TOOLKIT_MINOR_MISMATCH ignored by policy")
    assert_versions_agree_with_problems(dash)


def test_the_stack_codes_are_the_rules_codes() -> None:
    assert set(STACK_CODES) <= set(CODES)
    assert set(TOOLKIT_CODES) | set(DRIVER_CODES) == set(STACK_CODES)


# ---------------------------------------------------------------- drift and trend


def test_drift_is_grouped_by_change_and_code_with_since_from_the_history() -> None:
    repo = find("NVIDIA_REPO_NOT_CONFIGURED", fix=TOOLKIT_FIX)
    previous = (ok("pve1/1", repo), ok("pve1/2", repo), ok("pve1/3", find("DPKG_INTERRUPTED")), ok("pve1/4"))
    current = (ok("pve1/1", repo), ok("pve1/2", find("NVIDIA_REPO_NOT_CONFIGURED", "warning")),
               ok("pve1/3"), ok("pve1/4", find("DPKG_INTERRUPTED"), repo), ok("pve1/5", repo))
    now, repo_code = 1_000_000.0, "NVIDIA_REPO_NOT_CONFIGURED"
    since = {("pve1/1", repo_code): 100.0, ("pve1/2", repo_code): 90.0, ("pve1/4", "DPKG_INTERRUPTED"): now,
             ("pve1/4", repo_code): now, ("pve1/5", repo_code): now}
    view = build_dashboard(audit_run(*current, previous=previous, history=History(since=since))).drift
    assert view.baseline == 1
    assert [(i.kind, i.code, i.severity, [name for name, _ in i.targets]) for i in view.items] == [
        ("new", "DPKG_INTERRUPTED", "error", ["pve1/4"]),
        ("new", "NVIDIA_REPO_NOT_CONFIGURED", "error", ["pve1/4"]),
        ("severity", "NVIDIA_REPO_NOT_CONFIGURED", "warning", ["pve1/2"]),
        ("resolved", "DPKG_INTERRUPTED", "error", ["pve1/3"]),
    ]
    assert view.items[2].previous == "error" and view.items[2].targets == (("pve1/2", 90.0),)
    assert view.appeared == ("pve1/5",) and (view.count("new"), view.count("resolved")) == (2, 1)
    [still] = view.still_open  # pve1/1 only: pve1/5 appeared, pve1/2 changed
    assert (still.code, still.targets, still.oldest) == ("NVIDIA_REPO_NOT_CONFIGURED", 1, 100.0)


def test_findings_the_policy_changed_are_shown_apart_and_are_not_still_open() -> None:
    from fleetfix.audit.policy import Policy, policy_args
    from fleetfix.audit.report import html_report

    gpu, repo = find("GPU_NOT_VISIBLE", "info"), find("NVIDIA_REPO_NOT_CONFIGURED")
    strict = Policy(severity={"GPU_NOT_VISIBLE": "ignore"}, source="policy.example.yaml")
    before = StoredRun(RunInfo(1, 900_000.0, 900_060.0, "complete", args=policy_args(strict)),
                       (dataclasses.replace(ok("pve1/1", repo), ignored=("GPU_NOT_VISIBLE",)),))
    run = StoredRun(RunInfo(2, 1_000_000.0, 1_000_060.0, "complete", args=policy_args(DEFAULT_POLICY)),
                    (ok("pve1/1", repo, gpu),))
    audit = AuditRun(run, compute_drift(before, run), History())
    view = build_dashboard(audit).drift
    assert view.empty and view.count("new") == 0  # nothing changed on the target
    assert view.policy is not None and view.policy.known
    assert view.policy.before.startswith("policy.example.yaml (sha256 ")
    assert view.policy.after.startswith("built-in default (sha256 ")
    assert [(i.kind, i.code) for i in view.policy.items] == [("new", "GPU_NOT_VISIBLE")]
    assert [p.code for p in view.still_open] == ["NVIDIA_REPO_NOT_CONFIGURED"]
    page = html_report(audit)
    assert "No change on the targets since run 1." in page
    assert f"policy changed:</strong> <span class=\"mono\">{view.policy.before}</span>" in page
    assert "By the policy alone, not counted above: 1 new, 0 resolved, 0 changed finding(s)." in page


def test_trend_chart_geometry() -> None:
    points = [TrendPoint(run, 86400.0 * run, "complete", None, counts)
              for run, counts in enumerate([{"error": 3, "healthy": 5}, {"error": 7, "warning": 6},
                                            {"error": 7, "warning": 7, "unreachable": 1, "failed": 1}], 1)]
    chart = trend_chart(points)
    assert chart.y_max == 8 and [v for _, v in chart.y_ticks] == [0, 2, 4, 6, 8]
    error, warning, unreachable = chart.series
    assert [error.last, warning.last, unreachable.last] == [7, 7, 2]
    xs = [float(p.split(",")[0]) for p in error.points.split()]
    assert xs[0] == chart.left and xs[-1] == chart.right and len(xs) == 3
    assert float(error.points.split()[1].split(",")[1]) < float(error.points.split()[0].split(",")[1])
    assert abs(error.label_y - warning.label_y) >= 12  # equal last values: labels pushed apart
    assert error.dots[0][2].startswith("run 1 (")
    assert trend_chart([]).empty and trend_chart(points[:1]).series[0].points.count(",") == 1


def test_dashboard_of_a_real_audit_history(tmp_path: Path) -> None:
    from fleetfix.audit import load_audit

    world = FakeWorld({200: "healthy", 201: "healthy", 202: "problem_case", 203: "stopped"})
    targets = [make_target("pve1", n) for n in (200, 201, 202, 203)]
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        first = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        world.cts[201] = edited("healthy", interrupt_dpkg)
        run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, args={"inventory": "inv.yaml"})
        run = load_audit(store, store.resolve("last"))
    dash = build_dashboard(run)
    assert [p.run for p in dash.glance.trend.rows] == [first.info.id, run.info.id]
    assert dash.glance.counts["error"] == 2 and dash.glance.total == 4
    assert dash.glance.codes[0].targets >= 1 and dash.glance.codes[0].percent == 100.0
    problem = next(g for g in dash.groups if "CUDA_RUNTIME_WITHOUT_TOOLKIT" in g.codes)
    assert problem.targets[0].since == first.info.started  # there since the first run
    dpkg = next(g for g in dash.groups if g.codes == ("DPKG_INTERRUPTED",))
    assert dpkg.since == run.info.started and dash.age(dpkg.since) == "0 min"
    assert [i.code for i in dash.drift.items] == ["DPKG_INTERRUPTED"]
    toolkit = next(f for f in dash.fixes if "CUDA_RUNTIME_WITHOUT_TOOLKIT" in f.codes)
    assert toolkit.command is not None and toolkit.command.endswith("-i inv.yaml --limit name:pve1/202")
    assert dash.versions.unprobed == 1 and dash.nodes == ("pve1",)
