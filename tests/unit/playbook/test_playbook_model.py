"""Loading playbooks: shape errors and rule errors are one line naming file:line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetfix.errors import PlaybookError
from fleetfix.playbook.load import load_playbook
from tests.unit.playbook.conftest import playbook_from

GOOD = """\
name: demo
vars:
  greeting: hello
steps:
  - name: say
    check: test -f done
    apply: touch done
"""


def error_of(text: str, tmp_path: Path) -> str:
    with pytest.raises(PlaybookError) as caught:
        playbook_from(textwrap.dedent(text), tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_good_playbook_loads(tmp_path: Path) -> None:
    book = playbook_from(GOOD, tmp_path)
    assert book.name == "demo"
    assert [step.name for step in book.steps] == ["say"]
    assert book.steps[0].retries == 0 and book.steps[0].ignore_errors is False


def test_unknown_step_key_names_file_line_field(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            check: "true"
            aply: touch x
        """, tmp_path)
    assert message == f"{tmp_path / 'book.yaml'}:5: steps.0.aply: unknown field (did you mean 'apply'?)"


def test_a_misspelt_key_alone_is_named_before_the_field_it_leaves_missing(tmp_path: Path) -> None:
    message = error_of("""\
        nmae: demo
        steps:
          - name: a
            apply: touch x
        """, tmp_path)
    assert message == f"{tmp_path / 'book.yaml'}:1: nmae: unknown field (did you mean 'name'?)"
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: touch x
            registr: a
        """, tmp_path)
    assert message.endswith("steps.0.registr: unknown field (did you mean 'register'?)")


def test_wrong_type_names_the_field(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: touch x
            retries: many
        """, tmp_path)
    assert message.startswith(f"{tmp_path / 'book.yaml'}:5: steps.0.retries:")
    assert "integer" in message


def test_step_without_check_or_apply(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            verify: "true"
        """, tmp_path)
    assert ":3: steps.0: a step needs check, apply or both" in message


@pytest.mark.parametrize(("extra", "field"), [
    ("until: result.rc == 0", "until"),
    ("verify: 'true'", "verify"),
    ("retries: 2", "retries"),
])
def test_apply_only_fields_on_an_assertion(tmp_path: Path, extra: str, field: str) -> None:
    message = error_of(f"""\
        name: demo
        steps:
          - name: a
            check: "true"
            {extra}
        """, tmp_path)
    assert f":5: steps.0.{field}: only meaningful with apply" in message


def test_duplicate_step_names(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: "true"
          - name: a
            apply: "true"
        """, tmp_path)
    assert ":5: steps.1.name: duplicate step name 'a'" in message


def test_reserved_var_name(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        vars:
          facts: 1
        steps:
          - name: a
            apply: "true"
        """, tmp_path)
    assert ":3: vars.facts: not a usable var name" in message


def test_bad_env_name(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: "true"
            env:
              "BAD-NAME": x
        """, tmp_path)
    assert ":6: steps.0.env.BAD-NAME: not a valid environment variable name" in message


def test_template_syntax_error_at_load(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: echo {{ oops(
        """, tmp_path)
    assert ":4: steps.0.apply: template syntax error" in message


def test_value_inside_shell_quotes_is_refused(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: |
              echo "hello {{ who }}"
        """, tmp_path)
    assert ":4: steps.0.apply:" in message and "inside double quotes" in message


def test_raw_inside_quotes_is_the_authors_call(tmp_path: Path) -> None:
    playbook_from(textwrap.dedent("""\
        name: demo
        steps:
          - name: a
            apply: |
              echo "hello {{ who | raw }}"
        """), tmp_path)


def test_registered_must_come_from_an_earlier_step(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            apply: echo {{ registered.later.stdout }}
          - name: b
            apply: "true"
            register: later
        """, tmp_path)
    assert ":4: steps.0.apply: step 'a': registered.later: no earlier step has `register: later`" in message


def test_result_only_in_until_and_changed_when(tmp_path: Path) -> None:
    message = error_of("""\
        name: demo
        steps:
          - name: a
            when: result.rc == 0
            apply: "true"
        """, tmp_path)
    assert "steps.0.when" in message and "`result` exists only in until and changed_when" in message


def test_invalid_yaml_is_one_line(tmp_path: Path) -> None:
    message = error_of("name: [unclosed\n", tmp_path)
    assert "invalid YAML" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="file not found"):
        load_playbook(tmp_path / "nope.yaml")


def test_requires_runs_prerequisites_first(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(GOOD.replace("demo", "base"))
    (tmp_path / "top.yaml").write_text(
        "name: top\nrequires: [base.yaml]\nsteps:\n  - name: t\n    apply: 'true'\n")
    book = load_playbook(tmp_path / "top.yaml")
    assert [b.name for b in book.chain()] == ["base", "top"]


def test_requires_cycle_and_missing(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\nrequires: [b.yaml]\nsteps:\n  - name: s\n    apply: 'true'\n")
    (tmp_path / "b.yaml").write_text("name: b\nrequires: [a.yaml]\nsteps:\n  - name: s\n    apply: 'true'\n")
    with pytest.raises(PlaybookError, match="circular requirement"):
        load_playbook(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text(
        "name: c\nrequires: [gone.yaml]\nsteps:\n  - name: s\n    apply: 'true'\n")
    with pytest.raises(PlaybookError, match=r"c.yaml:2: requires.0: required playbook not found"):
        load_playbook(tmp_path / "c.yaml")
