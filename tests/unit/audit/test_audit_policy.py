"""The policy: YAML validation with one-line errors, severity overrides, required extensions."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_testkit import FakeWorld, make_target

from fleetfix.audit import DEFAULT_POLICY, AuditStore, load_policy, run_audit
from fleetfix.errors import ConfigError

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
