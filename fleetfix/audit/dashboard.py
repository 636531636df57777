"""The HTML dashboard's view model: everything the page shows, computed here from a run and its history.

Pure (no I/O, no clock): `build_dashboard(run)` -> `Dashboard`, which the template only lays out. What a
team brings to the morning report decides the sections: how many targets are in trouble and whether that
is getting better (glance + trend), where the trouble sits (a grid of nodes x guests), what changed last
night (drift, with since when each problem has been there), which problems there are rather than which
targets (groups of targets with the same findings: 140 identical failures are one line), what to run to
fix them (one `fleetfix apply` line per fix, for all its targets) and which versions run where.

Nothing from a target is trusted: the template escapes every value (autoescape) and `fleetfix.terminal`
makes control and bidi characters visible before that, so a name cannot hide text or forge a line. A fix
command is offered to copy only when it contains no such character; targets whose names do are left out
of it, named.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetfix.audit import AuditRun
from fleetfix.audit.drift import IDENTITY_KEYS, FindingChange, PolicyChange
from fleetfix.audit.model import HEALTH_ORDER, TargetResult, TrendPoint
from fleetfix.probe import Finding, Fix
from fleetfix.terminal import has_control

# Worst first: the order groups, fixes and bars are sorted by.
HEALTH_RANK = {health: rank for rank, health in enumerate(reversed(HEALTH_ORDER))}
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
# How many finding codes the glance's bar chart shows.
TOP_CODES = 8

# ---------------------------------------------------------------- untrusted text

def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """pve1/9 before pve1/10: digit runs compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", text) if part)


def when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def age(seconds: float) -> str:
    """A duration as a person says it: '5 min', '3 h', '4 d'."""
    if seconds < 3600:
        return f"{max(0, round(seconds / 60))} min"
    if seconds < 2 * 86400:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} d"


# ---------------------------------------------------------------- the glance


@dataclass(frozen=True)
class Series:
    name: str  # "error" | "warning" | "unreachable"
    points: str  # SVG polyline points "x,y x,y"
    dots: tuple[tuple[float, float, str], ...]  # x, y, tooltip
    last: int
    label_y: float


@dataclass(frozen=True)
class TrendChart:
    """A line chart of error / warning / unreachable targets per run, geometry computed here so the page
    needs no script to draw it."""

    width: int
    height: int
    top: int
    bottom: int  # y of the x axis
    left: int
    right: int
    y_max: int
    y_ticks: tuple[tuple[float, int], ...]
    x_labels: tuple[tuple[float, str], ...]
    series: tuple[Series, ...]
    rows: tuple[TrendPoint, ...]  # the same numbers as a table

    @property
    def empty(self) -> bool:
        return not self.rows


TREND_SERIES = (("error", ("error",)), ("warning", ("warning",)), ("unreachable", ("unreachable", "failed")))


def _nice_scale(value: int) -> tuple[int, int]:
    """The axis maximum and the tick step: at most 4 steps of a round size."""
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000):
        if value <= step * 4:
            return max(step * -(-value // step), step), step
    return value, value


def trend_chart(points: Sequence[TrendPoint], *, width: int = 560, height: int = 150) -> TrendChart:
    left, right, top, bottom = 40, width - 110, 10, height - 24
    y_max, y_step = _nice_scale(max((p.count(*healths) for p in points for _, healths in TREND_SERIES),
                                    default=0))
    span = max(len(points) - 1, 1)

    def x(index: int) -> float:
        return round(left + (right - left) * (index / span if len(points) > 1 else 0.5), 1)

    def y(value: int) -> float:
        return round(bottom - (bottom - top) * value / y_max, 1)

    series = []
    for name, healths in TREND_SERIES:
        values = [p.count(*healths) for p in points]
        series.append(Series(
            name=name,
            points=" ".join(f"{x(i)},{y(v)}" for i, v in enumerate(values)),
            dots=tuple((x(i), y(v), f"run {p.run} ({when(p.started)}): {v} {name}")
                       for i, (p, v) in enumerate(zip(points, values, strict=True))),
            last=values[-1] if values else 0,
            label_y=y(values[-1]) if values else bottom,
        ))
    # End labels must not overlap: 12 px apart at least, in their order, none below the axis.
    ordered = sorted(series, key=lambda s: s.label_y)
    ys = [s.label_y for s in ordered]
    for i in range(1, len(ys)):
        ys[i] = max(ys[i], ys[i - 1] + 12)
    for i in reversed(range(len(ys))):
        ys[i] = min(ys[i], bottom if i == len(ys) - 1 else ys[i + 1] - 12)
    by_name = {s.name: Series(s.name, s.points, s.dots, s.last, y) for s, y in zip(ordered, ys, strict=True)}
    step = max(1, len(points) // 6)  # at most ~7 dates under the axis
    same_day = len({time.strftime("%Y%m%d", time.localtime(p.started)) for p in points}) == 1
    fmt = "%H:%M" if same_day else "%m-%d"
    shown = [i for i in range(len(points)) if i % step == 0 or i == len(points) - 1]
    texts = [time.strftime(fmt, time.localtime(points[i].started)) for i in shown]
    if len(set(texts)) < len(texts):  # runs minutes apart: their numbers tell them apart, times do not
        texts = [f"run {points[i].run}" for i in shown]
    labels = tuple(zip((x(i) for i in shown), texts, strict=True))
    ticks = tuple((y(v), v) for v in range(0, y_max + 1, y_step))
    return TrendChart(width, height, top, bottom, left, right, y_max, ticks, labels,
                      tuple(by_name[name] for name, _ in TREND_SERIES), tuple(points))


@dataclass(frozen=True)
class CodeBar:
    code: str
    targets: int
    severity: str  # the worst severity the code has anywhere in the fleet
    percent: float  # bar length, of the most frequent code


@dataclass(frozen=True)
class Glance:
    total: int
    counts: dict[str, int]  # per health, HEALTH_ORDER, zeros included
    trend: TrendChart
    codes: tuple[CodeBar, ...]
    more_codes: int  # codes left out of the bar chart


def _code_bars(results: Sequence[TargetResult]) -> tuple[tuple[CodeBar, ...], int]:
    targets: Counter[str] = Counter()
    worst: dict[str, str] = {}
    for result in results:
        targets.update({f.code for f in result.findings})
        for finding in result.findings:
            worst[finding.code] = min(worst.get(finding.code, "info"), finding.severity.value,
                                      key=SEVERITY_RANK.__getitem__)
    ranked = sorted(targets.items(), key=lambda item: (-item[1], SEVERITY_RANK[worst[item[0]]], item[0]))
    top = max((n for _, n in ranked), default=1)
    bars = tuple(CodeBar(code, n, worst[code], round(100 * n / top, 1)) for code, n in ranked[:TOP_CODES])
    return bars, max(0, len(ranked) - TOP_CODES)


# ---------------------------------------------------------------- problem groups


@dataclass(frozen=True)
class GroupFinding:
    code: str
    severity: str
    summary: str  # the first target's: summaries may carry per-target numbers
    summary_varies: bool
    evidence: dict[str, Any]
    fix_text: str  # exactly Fix.text()


@dataclass(frozen=True)
class GroupTarget:
    name: str
    node: str
    since: float | None  # the oldest of its current findings' since
    error: str | None


@dataclass(frozen=True)
class ProblemGroup:
    id: str  # "g1": the anchor grid cells link to
    health: str
    findings: tuple[GroupFinding, ...]
    targets: tuple[GroupTarget, ...]
    nodes: tuple[tuple[str, int], ...]  # affected nodes, most affected first
    since: float | None  # the oldest since of any of its targets
    ignored: tuple[tuple[str, int], ...]  # codes the policy ignored on its targets, and on how many
    site: str = ""  # on a page of several sites: the site of its targets (groups never span sites)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.code for f in self.findings))

    @property
    def title(self) -> str:
        if self.findings:
            return ", ".join(self.codes)
        return {"healthy": "no findings", "unreachable": "unreachable", "failed": "probe failed"}.get(
            self.health, self.health)


def _identity(finding: Finding) -> tuple[tuple[str, str], ...]:
    return tuple((key, str(finding.evidence[key])) for key in IDENTITY_KEYS
                 if finding.evidence.get(key) is not None)


def _finding_key(finding: Finding) -> tuple[Any, ...]:
    # Same problem = same code, severity, identity (which extension, which apt source) and the same fix;
    # never the summary, whose numbers (free MiB, pending updates) differ from target to target.
    return (finding.code, finding.severity.value, _identity(finding), finding.fix.text())


def _group_key(result: TargetResult) -> tuple[Any, ...]:
    status = "ok" if result.reachable else result.status
    return (status, tuple(sorted(_finding_key(f) for f in result.findings)))


def target_since(result: TargetResult, since: Mapping[tuple[str, str], float]) -> float | None:
    found = [since[(result.target, f.code)] for f in result.findings if (result.target, f.code) in since]
    return min(found) if found else None


def problem_groups(results: Sequence[TargetResult], since: Mapping[tuple[str, str], float]
                   ) -> tuple[ProblemGroup, ...]:
    """Targets with the same findings as one group each, worst health first, then the biggest."""
    members: dict[tuple[Any, ...], list[TargetResult]] = defaultdict(list)
    for result in results:
        members[_group_key(result)].append(result)
    drafts = []
    for group in members.values():
        first = group[0]
        summaries: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        for member in group:
            for finding in member.findings:
                summaries[_finding_key(finding)].add(finding.summary)
        findings = tuple(
            GroupFinding(
                code=f.code, severity=f.severity.value, summary=f.summary,
                summary_varies=len(summaries[_finding_key(f)]) > 1,
                evidence=dict(f.evidence), fix_text=f.fix.text(),
            )
            for f in sorted(first.findings, key=lambda f: SEVERITY_RANK[f.severity.value])
        )
        targets = tuple(sorted(
            (GroupTarget(r.target, r.node, target_since(r, since), r.error) for r in group),
            key=lambda t: natural_key(t.name)))
        nodes = Counter(r.node for r in group)
        ignored = Counter(code for r in group for code in r.ignored)
        sinces = [t.since for t in targets if t.since is not None]
        drafts.append((first.health, findings, targets,
                       tuple(sorted(nodes.items(), key=lambda item: (-item[1], natural_key(item[0])))),
                       min(sinces) if sinces else None, tuple(sorted(ignored.items()))))
    drafts.sort(key=lambda d: (HEALTH_RANK[d[0]], -len(d[2]), natural_key(d[2][0].name)))
    return tuple(ProblemGroup(f"g{index}", *draft) for index, draft in enumerate(drafts, start=1))


# ---------------------------------------------------------------- the grid


@dataclass(frozen=True)
class GridCell:
    name: str
    health: str
    group: str  # the id of its problem group


@dataclass(frozen=True)
class GridRow:
    node: str
    cells: tuple[GridCell, ...]
    counts: tuple[tuple[str, int], ...]  # per health present, worst first
    site: str = ""  # on a page of several sites: the node's site (the same name may be at two)

    @property
    def worst(self) -> str:
        return self.counts[0][0] if self.counts else "healthy"


def grid_rows(results: Sequence[TargetResult], groups: Sequence[ProblemGroup]) -> tuple[GridRow, ...]:
    """Nodes as rows, their guests (and the node itself, when it is a target) as cells in name order, so
    a cell keeps its place from one night to the next. Built from the recorded node and target names."""
    group_of = {t.name: g.id for g in groups for t in g.targets}
    by_node: dict[str, list[TargetResult]] = defaultdict(list)
    for result in results:
        by_node[result.node].append(result)
    rows = []
    for node in sorted(by_node, key=natural_key):
        members = sorted(by_node[node], key=lambda r: natural_key(r.target))
        counts = Counter(r.health for r in members)
        rows.append(GridRow(
            node=node,
            cells=tuple(GridCell(r.target, r.health, group_of[r.target]) for r in members),
            counts=tuple(sorted(counts.items(), key=lambda item: HEALTH_RANK[item[0]])),
        ))
    return tuple(rows)


# ---------------------------------------------------------------- fixes


@dataclass(frozen=True)
class FixCommand:
    """One fix for every target that needs it: the `fleetfix apply` line to paste, or, for a fix that is
    a manual step, its hint and the targets."""

    command: str | None  # None: no playbook, a manual step
    hint: str  # the first finding's hint; `hints` has each code's
    codes: tuple[str, ...]
    severity: str
    targets: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # targets whose names hold control characters
    copyable: bool = True  # False: the command itself holds control characters (shown escaped)
    hints: tuple[tuple[str, str], ...] = ()  # (code, what the fix does for it), when they differ
    site: str = ""  # on a page of several sites: whose run's inventory the command selects from


def targeting(args: Mapping[str, Any], targets: Sequence[TargetResult]) -> list[str]:
    """The options that select exactly these targets of the fleet the audit run looked at: `-i` (its
    inventory, when one was given) and `--limit` with one `name:` term per target (a name term never
    matches a group of the same name). An ad-hoc run (`--host`, no inventory) has no names to limit by:
    its containers are named by `--ct`; its port, user and key were not recorded and must be added."""
    if args.get("host") and not args.get("inventory"):
        ctids = sorted({t.ctid for t in targets if t.ctid is not None})
        return ["--host", str(args["host"]), *(word for ctid in ctids for word in ("--ct", str(ctid)))]
    select = ["-i", str(args["inventory"])] if args.get("inventory") else []
    names = sorted((t.target for t in targets), key=natural_key)
    return [*select, "--limit", ",".join(f"name:{name}" for name in names)]


def fix_commands(results: Sequence[TargetResult], args: Mapping[str, Any]) -> tuple[FixCommand, ...]:
    """One entry per distinct fix: `Fix.text()`'s own command (its quoting untouched) with `-i` and
    `--limit` naming exactly the targets whose findings it fixes (`name:` terms match names only, never a
    group of the same name). Worst severity first, then the most targets."""
    found: dict[tuple[str | None, str], dict[str, Any]] = {}
    for result in results:
        for finding in result.findings:
            fix = finding.fix
            base = Fix(playbook=fix.playbook, vars=fix.vars, hint="").text() if fix.playbook else None
            entry = found.setdefault((base, "" if base else fix.hint),
                                     {"hint": fix.hint, "codes": {}, "targets": {}, "severity": "info"})
            entry["codes"].setdefault(finding.code, fix.hint)
            entry["targets"][result.target] = result
            if SEVERITY_RANK[finding.severity.value] < SEVERITY_RANK[entry["severity"]]:
                entry["severity"] = finding.severity.value
    commands = []
    for (base, _), entry in found.items():
        names = sorted(entry["targets"], key=natural_key)
        left_out = tuple(n for n in names if has_control(n))
        kept = [entry["targets"][n] for n in names if not has_control(n)]
        command = None
        if base is not None and kept:
            command = " ".join([base, *(shlex.quote(word) for word in targeting(args, kept))])
        commands.append(FixCommand(
            command=command, hint=entry["hint"], codes=tuple(entry["codes"]), severity=entry["severity"],
            targets=tuple(names), left_out=left_out,
            copyable=command is not None and not has_control(command),
            hints=tuple(entry["codes"].items()) if len(set(entry["codes"].values())) > 1 else (),
        ))
    commands.sort(key=lambda c: (c.command is None, SEVERITY_RANK[c.severity], -len(c.targets),
                                 c.command or c.hint))
    return tuple(commands)


# ---------------------------------------------------------------- versions


@dataclass(frozen=True)
class StackRow:
    torch_cuda: str
    toolkits: str
    driver: str
    gpus: tuple[tuple[str, int], ...]  # GPU models (as "2 x NVIDIA H200" per target) and on how many
    targets: tuple[str, ...]
    nodes: tuple[tuple[str, int], ...]
    verdict: str  # "ok" | "warning" | "error" | "unknown"
    note: str


@dataclass(frozen=True)
class VersionMatrix:
    rows: tuple[StackRow, ...]  # one per combination, mismatches first, then the most targets
    torch_versions: tuple[str, ...]  # the pivot: torch CUDA (rows) x toolkits (columns)
    toolkit_sets: tuple[str, ...]
    pivot: dict[tuple[str, str], tuple[int, str]]  # -> (targets, verdict)
    unprobed: int  # targets without facts (unreachable, failed)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)) or (0,)


def matrix_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """Of a target's facts, what _stack reads, in the same shape: the HTML report loads the history's
    facts through this (ReportFormat.facts), because a whole fleet's facts would set the report's peak
    memory and the matrix reads a few fields of them. Facts that are there stay non-empty: _stack tells a
    probed target by them."""
    kept: dict[str, Any] = {}
    if "pythons" in facts:
        kept["pythons"] = [{"torch": {"cuda": env["torch"].get("cuda")}}
                           for env in facts["pythons"] or () if env.get("torch")]
    if "cuda" in facts:
        kept["cuda"] = {"toolkits": [{key: t.get(key) for key in ("version", "path", "nvcc")}
                                     for t in (facts["cuda"] or {}).get("toolkits") or ()]}
    if "gpu" in facts:
        gpu = facts["gpu"] or {}
        kept["gpu"] = {"driver_version": gpu.get("driver_version"), "names": gpu.get("names")}
    if facts and not kept:
        kept["probed"] = True  # none of the fields the matrix reads, but probed all the same
    return kept


def _toolkit_label(toolkit: Mapping[str, Any]) -> str:
    label = str(toolkit.get("version") or toolkit.get("path"))
    # A toolkit directory whose nvcc is gone (deleted, its package still installed) builds nothing: the
    # rules do not count it, and the column must not read as if it could.
    return label if toolkit.get("nvcc") else f"{label} (no nvcc)"


def _stack(result: TargetResult) -> tuple[tuple[str, str, str, str, str], str] | None:
    """((torch CUDA, toolkits, driver, verdict, note), GPU) of a probed target; None if not probed."""
    facts = result.facts
    if not facts:
        return None
    cudas = sorted({str(env["torch"]["cuda"]) if env["torch"].get("cuda") else "CPU build"
                    for env in facts.get("pythons") or () if env.get("torch")})
    torch_cuda = " + ".join(cudas) if cudas else "no torch"
    installed = (facts.get("cuda") or {}).get("toolkits") or ()
    kits = sorted({_toolkit_label(t) for t in installed}, key=_version, reverse=True)
    toolkits = " + ".join(kits) if kits else "none"
    gpu = facts.get("gpu") or {}
    node_driver = (result.node_facts or {}).get("kernel_module_version")
    driver = node_driver or gpu.get("driver_version") or "unknown"
    names = Counter(str(name) for name in gpu.get("names") or ())
    gpu_text = ", ".join(f"{n} x {name}" if n > 1 else name for name, n in sorted(names.items()))
    verdict, note = stack_verdict(result, cudas)
    return (torch_cuda, toolkits, driver, verdict, note), gpu_text or "none visible"


def _joined(values: Any) -> str:
    return ", ".join(str(v) for v in values) if isinstance(values, list) else str(values)


# The findings that judge the version stack. The Versions view reads the rules' judgement (the findings
# Problems shows, after the policy) and never judges versions itself, so the two cannot disagree: a toolkit
# the rules do not count (its nvcc gone, say) is not "matching" here either.
TOOLKIT_CODES = ("CUDA_RUNTIME_WITHOUT_TOOLKIT", "CUDA_TOOLKIT_MAJOR_MISMATCH", "CUDA_TOOLKIT_MINOR_MISMATCH",
                 "NVCC_GLIBC_INCOMPATIBLE")
DRIVER_CODES = ("DRIVER_TOO_OLD", "DRIVER_BELOW_FULL_FEATURE")
STACK_CODES = (*TOOLKIT_CODES, *DRIVER_CODES)
_VERDICT_OF = {"error": "error", "warning": "warning", "info": "ok"}


def stack_note(finding: Finding) -> str:
    """What the Versions view says of one of the STACK_CODES findings, from its evidence."""
    e = finding.evidence
    cuda, nvccs, driver = e.get("torch_cuda"), _joined(e.get("nvcc_versions")), e.get("driver_version")
    notes = {
        "CUDA_RUNTIME_WITHOUT_TOOLKIT": f"no nvcc for CUDA {cuda}",
        "CUDA_TOOLKIT_MAJOR_MISMATCH": f"major mismatch: nvcc {nvccs} for CUDA {cuda}",
        "CUDA_TOOLKIT_MINOR_MISMATCH": f"minor mismatch: nvcc {nvccs} for CUDA {cuda}",
        "NVCC_GLIBC_INCOMPATIBLE": f"CUDA {e.get('nvcc_version')}'s nvcc cannot compile against glibc "
                                   f"{e.get('glibc')}",
        "DRIVER_TOO_OLD": f"driver {driver} too old for CUDA {str(cuda).split('.')[0]} "
                          f"(needs ≥ {e.get('minimum_driver')})",
        "DRIVER_BELOW_FULL_FEATURE": f"driver {driver} runs CUDA {cuda} by minor-version compatibility "
                                     f"(its own: {e.get('full_feature_driver')})",
    }
    return notes[finding.code]


def _concerns(finding: Finding, cuda: str) -> bool:
    """Whether a toolkit finding is about torch's CUDA `cuda` (another nvcc installed is judged too)."""
    if finding.code == "NVCC_GLIBC_INCOMPATIBLE":
        return bool(finding.evidence.get("nvcc_version") == cuda)
    return bool(finding.evidence.get("torch_cuda") == cuda)


def stack_verdict(result: TargetResult, cudas: Sequence[str]) -> tuple[str, str]:
    """The Versions view's verdict and note for one probed target, from its findings: the worst severity
    among the findings on its version stack (STACK_CODES), each said in a few words; where there are none,
    what the absence means (torch's CUDA has a matching nvcc, or there is no CUDA torch to match)."""
    found = [f for f in result.findings if f.code in STACK_CODES]
    ignored = [code for code in dict.fromkeys(result.ignored) if code in STACK_CODES]
    notes = list(dict.fromkeys(stack_note(f) for f in found))
    wanted = [c for c in cudas if c != "CPU build"]
    if not any(code in TOOLKIT_CODES for code in ignored):  # an ignored finding's CUDA is not recorded
        notes[:0] = [f"toolkit matches CUDA {cuda}" for cuda in wanted
                     if not any(f.code in TOOLKIT_CODES and _concerns(f, cuda) for f in found)]
    notes += [f"{code} ignored by policy" for code in ignored]
    if found:
        worst = min((f.severity.value for f in found), key=SEVERITY_RANK.__getitem__)
        return _VERDICT_OF[worst], "; ".join(notes)
    if not wanted:
        verdict, note = ("unknown", "no CUDA torch") if not cudas else ("ok", "CPU-only torch")
        return verdict, "; ".join([note, *notes])
    return "ok", "; ".join(notes)


VERDICT_RANK = {"error": 0, "warning": 1, "unknown": 2, "ok": 3}


def version_matrix(results: Sequence[TargetResult]) -> VersionMatrix:
    combos: dict[tuple[str, str, str, str, str], list[TargetResult]] = defaultdict(list)
    gpus: dict[tuple[str, str, str, str, str], Counter[str]] = defaultdict(Counter)
    unprobed = 0
    for result in results:
        stack = _stack(result)
        if stack is None:
            unprobed += 1
        else:
            combos[stack[0]].append(result)
            gpus[stack[0]][stack[1]] += 1
    rows = []
    pivot: dict[tuple[str, str], tuple[int, str]] = {}
    for key, members in combos.items():
        torch_cuda, toolkits, driver, verdict, note = key
        nodes = Counter(r.node for r in members)
        rows.append(StackRow(
            torch_cuda, toolkits, driver, tuple(gpus[key].most_common()),
            tuple(sorted((r.target for r in members), key=natural_key)),
            tuple(sorted(nodes.items(), key=lambda item: (-item[1], natural_key(item[0])))),
            verdict, note,
        ))
        count, worst = pivot.get((torch_cuda, toolkits), (0, "ok"))
        # A pivot cell shows the worst verdict among its combinations (drivers may differ).
        worst = min(worst, verdict, key=VERDICT_RANK.__getitem__)
        pivot[(torch_cuda, toolkits)] = (count + len(members), worst)
    rows.sort(key=lambda r: (VERDICT_RANK[r.verdict], -len(r.targets), r.torch_cuda, r.toolkits, r.driver))
    torch_versions = tuple(sorted({r.torch_cuda for r in rows}, key=_version, reverse=True))
    toolkit_sets = tuple(sorted({r.toolkits for r in rows}, key=_version, reverse=True))
    return VersionMatrix(tuple(rows), torch_versions, toolkit_sets, pivot, unprobed)


def merged_matrix(matrices: Sequence[VersionMatrix]) -> VersionMatrix:
    """Several sites' matrices as one: the same combination at two sites is one row (their targets,
    GPUs and nodes together). From the sites' rows, never their targets again."""
    if len(matrices) == 1:
        return matrices[0]
    rows: dict[tuple[str, str, str, str, str], StackRow] = {}
    for matrix in matrices:
        for row in matrix.rows:
            key = (row.torch_cuda, row.toolkits, row.driver, row.verdict, row.note)
            had = rows.get(key)
            if had is not None:
                gpus = Counter(dict(had.gpus)) + Counter(dict(row.gpus))
                nodes = Counter(dict(had.nodes)) + Counter(dict(row.nodes))
                row = StackRow(row.torch_cuda, row.toolkits, row.driver, tuple(gpus.most_common()),
                               had.targets + row.targets,
                               tuple(sorted(nodes.items(),
                                            key=lambda item: (-item[1], natural_key(item[0])))),
                               row.verdict, row.note)
            rows[key] = row
    pivot: dict[tuple[str, str], tuple[int, str]] = {}
    for matrix in matrices:
        for cell, (count, verdict) in matrix.pivot.items():
            had_count, worst = pivot.get(cell, (0, "ok"))
            pivot[cell] = (had_count + count, min(worst, verdict, key=VERDICT_RANK.__getitem__))
    ordered = sorted(rows.values(), key=lambda r: (VERDICT_RANK[r.verdict], -len(r.targets), r.torch_cuda,
                                                   r.toolkits, r.driver))
    return VersionMatrix(
        tuple(ordered), tuple(sorted({r.torch_cuda for r in ordered}, key=_version, reverse=True)),
        tuple(sorted({r.toolkits for r in ordered}, key=_version, reverse=True)), pivot,
        sum(m.unprobed for m in matrices))


# ---------------------------------------------------------------- drift


@dataclass(frozen=True)
class DriftItem:
    kind: str  # "new" | "resolved" | "severity"
    code: str
    severity: str
    previous: str | None  # the severity before, for "severity"
    summary: str
    targets: tuple[tuple[str, float | None], ...]  # name, since when it has shown the code


@dataclass(frozen=True)
class OpenProblem:
    """A finding code still present, unchanged since the baseline: how many targets, since when."""

    code: str
    severity: str
    targets: int
    oldest: float | None
    newest: float | None


@dataclass(frozen=True)
class PolicyView:
    """The policy changed since the baseline: from what to what, and the finding changes it alone explains
    (not counted as new or resolved on the targets)."""

    before: str  # labels: `policy.example.yaml (sha256 0123456789ab…)`
    after: str
    known: bool  # False: a run's policy was not recorded, nothing is attributed to it
    items: tuple[DriftItem, ...]

    def count(self, kind: str) -> int:
        return sum(len(item.targets) for item in self.items if item.kind == kind)


@dataclass(frozen=True)
class DriftView:
    baseline: int | None
    items: tuple[DriftItem, ...]
    became_unreachable: tuple[str, ...]
    recovered: tuple[str, ...]
    appeared: tuple[str, ...]
    vanished: tuple[str, ...]
    still_open: tuple[OpenProblem, ...]
    policy: PolicyView | None = None

    @property
    def empty(self) -> bool:
        return not (self.items or self.became_unreachable or self.recovered or self.appeared or self.vanished)

    def count(self, kind: str) -> int:
        return sum(len(item.targets) for item in self.items if item.kind == kind)


def _changes(new: list[FindingChange], severity: list[FindingChange], resolved: list[FindingChange]
             ) -> list[tuple[str, FindingChange]]:
    return ([("new", c) for c in new] + [("severity", c) for c in severity]
            + [("resolved", c) for c in resolved])


def _policy_view(change: PolicyChange | None, since: dict[tuple[str, str], float]) -> PolicyView | None:
    if change is None:
        return None
    changes = _changes(change.new_findings, change.severity_changed, change.resolved_findings)
    return PolicyView(", ".join(ref.label for ref in change.before), change.after.label, change.known,
                      _drift_items(changes, since))


def drift_view(run: AuditRun) -> DriftView:
    drift, since = run.drift, run.history.since
    changes = _changes(drift.new_findings, drift.severity_changed, drift.resolved_findings)
    items = _drift_items(changes, since)
    policy = _policy_view(drift.policy_change, since)
    # A finding the policy changed is no more "still open" than one the target changed.
    changed = {(c.target, c.finding.code) for _, c in changes}
    if drift.policy_change is not None:
        changed |= {(c.target, c.finding.code) for _, c in _changes(
            drift.policy_change.new_findings, drift.policy_change.severity_changed,
            drift.policy_change.resolved_findings)}
    still: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    if drift.baseline is not None:
        for result in run.targets:
            for code, severity in dict.fromkeys((f.code, f.severity.value) for f in result.findings):
                if (result.target, code) not in changed and result.target not in drift.appeared:
                    still[(code, severity)].append(since.get((result.target, code)))
    still_open = tuple(sorted(
        (OpenProblem(code, severity, len(values), min((v for v in values if v is not None), default=None),
                     max((v for v in values if v is not None), default=None))
         for (code, severity), values in still.items()),
        key=lambda p: (SEVERITY_RANK[p.severity], -p.targets, p.code)))
    return DriftView(drift.baseline, items, tuple(drift.became_unreachable), tuple(drift.recovered),
                     tuple(drift.appeared), tuple(drift.vanished), still_open, policy)


def _drift_items(changes: list[tuple[str, FindingChange]], since: dict[tuple[str, str], float]
                 ) -> tuple[DriftItem, ...]:
    """Finding changes grouped by kind, code and severity, each with its targets and since when."""
    grouped: dict[tuple[str, str, str, str | None], dict[str, Any]] = {}
    for kind, change in changes:
        key = (kind, change.finding.code, change.finding.severity.value, change.previous_severity)
        entry = grouped.setdefault(key, {"summary": change.finding.summary, "targets": {}})
        entry["targets"][change.target] = None if kind == "resolved" else since.get((change.target,
                                                                                        change.finding.code))
    order = {"new": 0, "severity": 1, "resolved": 2}
    items = sorted(
        (DriftItem(kind, code, severity, previous, entry["summary"],
                   tuple(sorted(entry["targets"].items(), key=lambda item: natural_key(item[0]))))
         for (kind, code, severity, previous), entry in grouped.items()),
        key=lambda i: (order[i.kind], SEVERITY_RANK[i.severity], -len(i.targets), i.code))
    return tuple(items)


# ---------------------------------------------------------------- the page


@dataclass(frozen=True)
class SiteView:
    """One site's part of a page of several sites: its newest run, the drift against its own previous
    run and its own trend."""

    site: str
    controller: str | None
    run: int
    status: str
    started: float
    counts: dict[str, int]  # per health, HEALTH_ORDER
    total: int
    drift: DriftView
    trend: TrendChart
    versions: VersionMatrix  # the site's own (the page shows all sites' together)
    suffix: str  # what the ids of its drift and trend blocks end in: unique on the page

    def age(self, since: float | None) -> str:
        return "" if since is None else age(self.started - since)


@dataclass(frozen=True)
class Dashboard:
    glance: Glance
    drift: DriftView
    grid: tuple[GridRow, ...]
    groups: tuple[ProblemGroup, ...]
    fixes: tuple[FixCommand, ...]
    versions: VersionMatrix
    nodes: tuple[str, ...]
    codes: tuple[str, ...]  # every finding code present, for the filter
    started: float  # the run's start: ages are relative to it, never to the time of rendering
    sites: tuple[SiteView, ...] = ()  # a page of several sites (build_sites_dashboard); () for one run

    @property
    def drift_blocks(self) -> tuple[tuple[SiteView | None, DriftView, Any], ...]:
        """(site or None, drift, what ages are relative to) per drift block: one per site, or the run's."""
        if not self.sites:
            return ((None, self.drift, self),)
        return tuple((site, site.drift, site) for site in self.sites)

    @property
    def trend_blocks(self) -> tuple[tuple[SiteView | None, TrendChart], ...]:
        if not self.sites:
            return ((None, self.glance.trend),)
        return tuple((site, site.trend) for site in self.sites)

    @property
    def open_group(self) -> str | None:
        """The group shown open: the worst with findings to act on (unreachable targets have none)."""
        return next((g.id for g in self.groups if g.health in ("error", "warning")), None)

    def age(self, since: float | None) -> str:
        return "" if since is None else age(self.started - since)


def build_dashboard(run: AuditRun) -> Dashboard:
    results = run.targets
    counts = dict.fromkeys(HEALTH_ORDER, 0)
    for result in results:
        counts[result.health] = counts.get(result.health, 0) + 1
    bars, more = _code_bars(results)
    groups = problem_groups(results, run.history.since)
    codes = sorted({f.code for r in results for f in r.findings})
    return Dashboard(
        glance=Glance(len(results), counts, trend_chart(run.history.trend), bars, more),
        drift=drift_view(run),
        grid=grid_rows(results, groups),
        groups=groups,
        fixes=fix_commands(results, run.info.args),
        versions=version_matrix(results),
        nodes=tuple(sorted({r.node for r in results}, key=natural_key)),
        codes=tuple(codes),
        started=run.info.started,
    )


def _counts(results: Sequence[TargetResult]) -> dict[str, int]:
    counts = dict.fromkeys(HEALTH_ORDER, 0)
    for result in results:
        counts[result.health] = counts.get(result.health, 0) + 1
    return counts


def build_sites_dashboard(runs: Sequence[AuditRun]) -> Dashboard:
    """One page for the newest run of each of several sites (in site order): each site's problem groups,
    grid rows and fix commands its own (a fix selects from its own run's inventory), its drift against its
    own previous run and its own trend; the glance, filters and versions over all of them. Each site's
    part is computed as a one-site page computes it, from what load_audit already read: no query here."""
    runs = sorted(runs, key=lambda r: r.info.site)
    sites: list[SiteView] = []
    groups: list[ProblemGroup] = []
    grid: list[GridRow] = []
    fixes: list[FixCommand] = []
    for index, run in enumerate(runs, start=1):
        results, site = run.targets, run.info.site
        site_groups = problem_groups(results, run.history.since)
        # Group ids run on across sites: a grid cell links to its own site's group.
        site_groups = tuple(dataclasses.replace(g, id=f"g{len(groups) + n}", site=site)
                            for n, g in enumerate(site_groups, start=1))
        groups += site_groups
        grid += [dataclasses.replace(row, site=site) for row in grid_rows(results, site_groups)]
        fixes += [dataclasses.replace(fix, site=site) for fix in fix_commands(results, run.info.args)]
        sites.append(SiteView(site, run.info.controller, run.info.id, run.info.status, run.info.started,
                              _counts(results), len(results), drift_view(run), trend_chart(run.history.trend),
                              version_matrix(results), f"-s{index}"))
    results = tuple(result for run in runs for result in run.targets)
    bars, more = _code_bars(results)
    fixes.sort(key=lambda c: (c.command is None, SEVERITY_RANK[c.severity], -len(c.targets),
                              c.command or c.hint, c.site))
    return Dashboard(
        glance=Glance(len(results), _counts(results), trend_chart(()), bars, more),
        drift=sites[0].drift,
        grid=tuple(grid),
        groups=tuple(groups),
        fixes=tuple(fixes),
        versions=merged_matrix([site.versions for site in sites]),
        nodes=tuple(sorted({r.node for r in results}, key=natural_key)),
        codes=tuple(sorted({f.code for r in results for f in r.findings})),
        started=max(site.started for site in sites),
        sites=tuple(sites),
    )
