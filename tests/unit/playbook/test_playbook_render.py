"""Templating: values reach the shell as literal words; undefined names fail before anything runs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetfix.errors import TemplateError
from fleetfix.playbook.render import compile_playbook, render_script, shell_quote
from fleetfix.playbook.runner import plan_target
from tests.unit.playbook.conftest import make_target, playbook_from

HOSTILE = "it's $(touch CANARY) `touch CANARY`; touch CANARY && echo \"x\" | touch CANARY\nnext line $HOME"


def run_sh(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-s"], input=script, capture_output=True, text=True, cwd=cwd,
                          check=False)


def test_hostile_value_is_one_literal_argument(tmp_path: Path) -> None:
    script = render_script("printf '%s\\0' {{ value }} > args\n", {"value": HOSTILE})
    done = run_sh(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "CANARY").exists()
    assert (tmp_path / "args").read_bytes() == HOSTILE.encode() + b"\0"


def test_hostile_value_in_env_is_exported_literally(tmp_path: Path, facts: dict[str, Any]) -> None:
    book = playbook_from(
        "name: env\nsteps:\n  - name: s\n    env:\n      VALUE: '{{ value }}'\n"
        "    apply: printf '%s' \"$VALUE\" > out\n", tmp_path)
    plan = plan_target([compile_playbook(book)], make_target("ct", value=HOSTILE), facts, {})
    rendered = plan.plays[0].steps[0].rendered
    assert rendered is not None and rendered.apply is not None
    done = run_sh(rendered.apply, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "CANARY").exists()
    assert (tmp_path / "out").read_text() == HOSTILE


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40))
def test_any_text_survives_quoting(tmp_path_factory: pytest.TempPathFactory, value: str) -> None:
    script = render_script("printf '%s' {{ v }}", {"v": value})
    # Bytes, not text mode: universal newlines would turn a "\r" in the output into "\n".
    done = subprocess.run(["/bin/sh", "-s"], input=script.encode(), capture_output=True, check=False,
                          cwd=tmp_path_factory.getbasetemp())
    assert done.returncode == 0
    assert done.stdout == value.encode()


def test_list_becomes_several_quoted_words(tmp_path: Path) -> None:
    script = render_script("printf '[%s]' {{ items }}", {"items": ["a b", "$(x)", "c"]})
    assert run_sh(script, tmp_path).stdout == "[a b][$(x)][c]"


def test_raw_opts_out_and_quote_quotes(tmp_path: Path) -> None:
    script = render_script("{{ cmd | raw }} {{ arg | quote }}", {"cmd": "printf '<%s>'", "arg": "a b"})
    assert script == "printf '<%s>' 'a b'"
    assert run_sh(script, tmp_path).stdout == "<a b>"
    assert shell_quote(None) == "''"


def test_undefined_names_the_dotted_path(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from(
        "name: u\nsteps:\n  - name: first\n    apply: 'true'\n"
        "  - name: uses facts\n    apply: echo {{ facts.os.nvidia_distrox }}\n", tmp_path)
    with pytest.raises(TemplateError) as caught:
        plan_target([compile_playbook(book)], make_target("ct"), facts, {})
    message = str(caught.value)
    assert message == (f"{tmp_path / 'book.yaml'}:6: steps.1.apply: step 'uses facts': "
                       "facts.os.nvidia_distrox is undefined")


def test_undefined_top_level_var(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from("name: u\nsteps:\n  - name: s\n    apply: echo {{ cuda_repo_bse }}\n", tmp_path)
    with pytest.raises(TemplateError, match=r"steps.0.apply: step 's': 'cuda_repo_bse' is undefined"):
        plan_target([compile_playbook(book)], make_target("ct"), facts, {})


def test_vars_precedence_and_default_templates(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from(
        "name: v\nvars:\n  a: default\n  b: default\n  c: default\n"
        "  version: \"{{ facts.torch.cuda }}\"\n  suffix: \"{{ version | replace('.', '-') }}\"\n"
        "steps:\n  - name: s\n    apply: echo {{ a }} {{ b }} {{ c }} {{ suffix }}\n", tmp_path)
    target = make_target("ct", b="inventory", c="inventory")
    plan = plan_target([compile_playbook(book)], target, facts, {"c": "cli"})
    assert plan.plays[0].vars == {"a": "default", "b": "inventory", "c": "cli", "version": "12.8",
                                  "suffix": "12-8"}
    assert plan.plays[0].steps[0].rendered is not None
    assert plan.plays[0].steps[0].rendered.apply == "echo default inventory cli 12-8"
    # An overridden default is never rendered: it may use facts that are missing here.
    plan = plan_target([compile_playbook(book)], target, {"torch": None}, {"version": "12.4"})
    assert plan.plays[0].vars["suffix"] == "12-4"


def test_when_false_step_is_not_rendered(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from(
        "name: w\nsteps:\n  - name: s\n    when: facts.torch is none\n"
        "    apply: echo {{ facts.torch.cuda.nope }}\n", tmp_path)
    plan = plan_target([compile_playbook(book)], make_target("ct"), facts, {})
    assert plan.plays[0].steps[0].skip_reason == "when is false: facts.torch is none"
    assert plan.plays[0].steps[0].rendered is None


def test_steps_using_registered_render_late(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from(
        "name: r\nsteps:\n  - name: a\n    apply: echo hi\n    register: greet\n"
        "  - name: b\n    apply: echo {{ registered.greet.stdout }}\n", tmp_path)
    plan = plan_target([compile_playbook(book)], make_target("ct"), facts, {})
    assert plan.plays[0].steps[0].rendered is not None
    assert plan.plays[0].steps[1].rendered is None and plan.plays[0].steps[1].skip_reason is None


def test_target_in_scope(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from(
        "name: t\nsteps:\n  - name: s\n    apply: echo {{ target.name }} {{ target.ctid }}\n", tmp_path)
    plan = plan_target([compile_playbook(book)], make_target("pve1/101", 101), facts, {})
    assert plan.plays[0].steps[0].rendered is not None
    assert plan.plays[0].steps[0].rendered.apply == "echo pve1/101 101"


def test_reserved_var_from_inventory(facts: dict[str, Any], tmp_path: Path) -> None:
    book = playbook_from("name: t\nsteps:\n  - name: s\n    apply: 'true'\n", tmp_path)
    with pytest.raises(TemplateError, match="var name 'facts' is reserved"):
        plan_target([compile_playbook(book)], make_target("ct"), facts, {"facts": 1})
