"""The policy: YAML validation with one-line errors, severity overrides, required extensions."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from audit_testkit import FakeWorld, make_target

from fleetfix.audit import DEFAULT_POLICY, AuditStore, load_policy, run_audit
from fleetfix.audit.policy import evaluate, stale_finding
from fleetfix.audit.report import junit_report, prometheus_report
from fleetfix.errors import ConfigError
from fleetfix.probe.run import probe_targets
from fleetfix.target import Target

POLICY = """\
severity:
  APT_OLD_NVIDIA_KEY: ignore
required_extensions: []
rules:
  - match: {groups: [training]}
    severity: {EXTENSION_MISSING: error}
    required_extensions: [flash_attn]
  - match: {targets: ["pve1/20[1-9]"], tags: [lab]}
    severity: {EXTENSION_MISSING: warning, CUDA_RUNTIME_WITHOUT_TOOLKIT: ignore}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_no_file_is_the_default_policy() -> None:
    assert load_policy(None) is DEFAULT_POLICY
    assert DEFAULT_POLICY.levels_for(frozenset(), frozenset(), "x") == {}


def test_later_rules_win_and_extensions_add_up(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, POLICY))
    assert policy.source.endswith("policy.yaml")
    training = policy.levels_for(frozenset({"training"}), frozenset(), "other")
    assert training == {"APT_OLD_NVIDIA_KEY": "ignore", "EXTENSION_MISSING": "error"}
    both = policy.levels_for(frozenset({"training"}), frozenset(), "pve1/201")
    assert both["EXTENSION_MISSING"] == "warning" and both["CUDA_RUNTIME_WITHOUT_TOOLKIT"] == "ignore"
    assert policy.extensions_for(frozenset({"training"}), frozenset(), "x") == ["flash_attn"]
    assert policy.extensions_for(frozenset(), frozenset({"lab"}), "x") == []
    assert policy.levels_for(frozenset(), frozenset(), "pve1/200") == {"APT_OLD_NVIDIA_KEY": "ignore"}


@pytest.mark.parametrize(("text", "message"), [
    ("severity:\n  NOT_A_CODE: error\n", r"policy.yaml:1: severity: Value error, unknown finding code"),
    ("severity:\n  DPKG_INTERRUPTED: fatal\n", r"policy.yaml:2: severity.DPKG_INTERRUPTED: Input should be"),
    ("rules:\n  - match: {groups: [a]}\n    colour: red\n", r"policy.yaml:3: rules.0.colour: unknown field"),
    ("rules:\n  - mach: {groups: [a]}\n",
     r"policy.yaml:2: rules.0.mach: unknown field \(did you mean 'match'\?\)"),
    ("severty: {}\n", r"policy.yaml:1: severty: unknown field \(did you mean 'severity'\?\)"),
    ("rules:\n  - severity: {}\n", r"policy.yaml:2: rules.0.match: Field required"),
    ("required_extensions: [flash-attn]\n", r"policy.yaml:1: required_extensions: .*importable"),
    ("- a\n- b\n", r"policy.yaml: a policy is a mapping"),
    ("severity: [\n", r"policy.yaml:2: invalid YAML"),
])
def test_bad_policy_is_one_line_naming_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_policy(write(tmp_path, text))
    assert "\n" not in str(caught.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        load_policy(tmp_path / "nope.yaml")


def test_policy_overrides_ignores_and_requires_through_a_real_audit(tmp_path: Path) -> None:
    # The healthy fixture has torch cu128 and no flash_attn: fine, until the policy requires it.
    world = FakeWorld({200: "healthy", 201: "problem_case"})
    targets = [make_target("pve1", 200, groups=["training"]), make_target("pve1", 201, tags=["lab"])]
    policy = load_policy(write(tmp_path, POLICY))
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        baseline = run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store)
        judged = run_audit(fleet, targets, policy=policy, store=store)
    healthy_before, problem_before = baseline.targets
    healthy_after, problem_after = judged.targets
    # Required by the policy for the training group: flash_attn missing becomes an error finding.
    assert healthy_before.health == "healthy"
    assert [(f.code, f.severity.value) for f in healthy_after.findings] == [("EXTENSION_MISSING", "error")]
    # Ignored for the lab tag: dropped, and remembered as ignored.
    before = {f.code for f in problem_before.findings}
    after = {f.code for f in problem_after.findings}
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" in before and "CUDA_RUNTIME_WITHOUT_TOOLKIT" not in after
    assert problem_after.ignored == ("CUDA_RUNTIME_WITHOUT_TOOLKIT",)
    assert judged.info.args["policy"].endswith("policy.yaml")


# ---------------------------------------------------------------- max_age: STALE_AUDIT

DAY = 86400.0


@pytest.mark.parametrize(("text", "message"), [
    ("max_age: {unreachable_days: 0}\n", r"policy.yaml:1: max_age.unreachable_days: Input should be greater"),
    ("max_age: {last_apply_days: 3}\n", r"policy.yaml:1: max_age.last_apply_days: unknown field"),
])
def test_bad_max_age_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_policy(write(tmp_path, text))


def test_stale_finding_counts_from_the_last_good_probe_else_first_sighting() -> None:
    now = 100 * DAY
    assert stale_finding(3, last_probed=now - 2 * DAY, first_seen=now - 9 * DAY, now=now) is None
    late = stale_finding(3, last_probed=now - 4 * DAY, first_seen=now - 9 * DAY, now=now)
    assert late is not None and late.code == "STALE_AUDIT" and late.severity.value == "error"
    assert late.evidence["days"] == 4.0 and "last probed successfully" in late.summary
    never = stale_finding(3, last_probed=None, first_seen=now - 5 * DAY, now=now)
    assert never is not None and "never probed" in never.summary
    assert stale_finding(3, last_probed=None, first_seen=None, now=now) is None  # first sighting: tonight


def _history(store: AuditStore, world: FakeWorld, target: Target, *, days_ago: float) -> None:
    """An old run in which target was probed fine (run_audit stamps now; the store takes `started`)."""
    run_id = store.start_run({}, started=time.time() - days_ago * DAY)
    with world.fleet() as fleet:
        store.record_target(run_id, evaluate(DEFAULT_POLICY, probe_targets(fleet, [target])[0]))
    store.finish_run(run_id, finished=time.time() - days_ago * DAY + 5)


@pytest.mark.parametrize(("policy_text", "expected"), [
    ("max_age: {unreachable_days: 3}\n", "error"),
    ("max_age: {unreachable_days: 10}\n", None),
    ("max_age: {unreachable_days: 3}\nrules:\n  - match: {tags: [lab]}\n"
     "    severity: {STALE_AUDIT: warning}\n", "warning"),
    ("max_age: {unreachable_days: 3}\nseverity: {STALE_AUDIT: ignore}\n", "ignored"),
    ("{}\n", None),
])
def test_an_unreachable_target_goes_stale_after_max_age(
    tmp_path: Path, policy_text: str, expected: str | None,
) -> None:
    world = FakeWorld({200: "healthy"})
    target = make_target("pve1", 200, tags=["lab"])
    with AuditStore(tmp_path / "a.db") as store:
        _history(store, world, target, days_ago=5)
        world.cts[200] = "stopped"
        with world.fleet() as fleet:
            run = run_audit(fleet, [target], policy=load_policy(write(tmp_path, policy_text)), store=store)
    [result] = run.targets
    assert result.status == "unreachable" and run.exit_code == 4
    stale = [f for f in result.findings if f.code == "STALE_AUDIT"]
    if expected is None:
        assert not stale and "STALE_AUDIT" not in result.ignored
    elif expected == "ignored":
        assert not stale and result.ignored == ("STALE_AUDIT",)
    else:
        assert [f.severity.value for f in stale] == [expected]
        junit = ET.fromstring(junit_report(run).split("\n", 1)[1])
        case = next(c for c in junit.iter("testcase") if c.get("name") == "STALE_AUDIT")
        assert (case.find("failure") is not None) == (expected == "error")
        assert 'fleetfix_audit_findings{code="STALE_AUDIT"} 1' in prometheus_report(run)


def test_a_reachable_target_never_goes_stale(tmp_path: Path) -> None:
    world = FakeWorld({200: "healthy"})
    target = make_target("pve1", 200)
    with AuditStore(tmp_path / "a.db") as store:
        _history(store, world, target, days_ago=30)
        with world.fleet() as fleet:
            policy = load_policy(write(tmp_path, "max_age: {unreachable_days: 1}\n"))
            run = run_audit(fleet, [target], policy=policy, store=store)
    assert not [f for f in run.targets[0].findings if f.code == "STALE_AUDIT"]


def test_evaluate_keeps_the_node_facts_for_the_version_matrix_but_not_in_json() -> None:
    from fleetfix.probe import NodeFacts
    from fleetfix.probe.run import TargetReport

    node = NodeFacts(hostname="pve1", kernel_module_version="570.124.06", kernel_module_flavor="open")
    report = TargetReport(make_target("pve1", 200), "ok", None, node)
    result = evaluate(DEFAULT_POLICY, report)
    assert result.node_facts is not None and result.node_facts["kernel_module_version"] == "570.124.06"
    assert "node_facts" not in result.to_json()  # the JSON report keeps its shape
    assert evaluate(DEFAULT_POLICY, TargetReport(make_target("pve1", 201), "unreachable")).node_facts is None


def test_the_example_policy_loads() -> None:
    """policy.example.yaml, the commented policy the docs run against the lab."""
    policy = load_policy(Path(__file__).resolve().parents[3] / "policy.example.yaml")
    assert policy.severity == {"GPU_NOT_VISIBLE": "ignore"}
    assert policy.required_extensions == ["causal_conv1d"]
    assert policy.levels_for(frozenset(), frozenset({"training"}), "t")["EXTENSION_MISSING"] == "error"
