"""The fuzz half of issue 18's abuse suite (the loaders' own fuzzing is tests/unit/test_fuzz_loaders.py):
hypothesis over YAML documents with aliases, `--var` parsing and references, var files, and the probe's
JSON parser. Whatever comes in, only the expected error class comes out, in one line; never a traceback.

CI time: about 10 s on a 2-core machine (max_examples kept small; no deadline: the machine is shared).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetfix.cli.common import parse_var
from fleetfix.errors import ConfigError, ProbeOutputError
from fleetfix.probe.facts import parse_facts
from fleetfix.secrets import load_var_file, resolve_reference
from fleetfix.yamlsource import parse_yaml

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def aliased_yaml(draw: st.DrawFn) -> str:
    """Documents made of anchors and aliases to them, nested and repeated: bombs and ordinary reuse."""
    lines = []
    for level in range(draw(st.integers(1, 8))):
        refs = draw(st.lists(st.integers(0, max(level - 1, 0)), min_size=1, max_size=12))
        body = ",".join(f"*a{ref}" for ref in refs) if level else '"x"'
        lines.append(f"a{level}: &a{level} [{body}]")
    if draw(st.booleans()):
        lines.append("loop: &loop [*loop]")
    return "\n".join(lines) + "\n"


@FUZZ
@given(aliased_yaml())
def test_yaml_with_aliases_loads_or_is_one_line(text: str) -> None:
    try:
        parse_yaml(text, "fuzz.yaml")
    except ConfigError as error:
        assert "\n" not in str(error)


@FUZZ
@given(st.lists(st.text(max_size=40), max_size=5))
def test_var_parsing_never_echoes_a_value(items: list[str]) -> None:
    try:
        parsed = parse_var(items)
    except ConfigError as error:
        message = str(error)
        for item in items:
            _, sep, value = item.partition("=")
            if len(value) > 3 and sep:
                assert value not in message.replace("--var", "")
    else:
        assert all(name.isidentifier() for name in parsed)


@FUZZ
@given(st.text(max_size=60))
def test_references_resolve_or_are_one_line(reference: str) -> None:
    try:
        resolve_reference(reference)
    except ConfigError as error:
        assert "\n" not in str(error)


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                     children, max_size=3),
                    max_leaves=15))
def test_var_files_load_or_are_one_line(document: object) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "vars.json"
        path.write_text(json.dumps(document))
        os.chmod(path, 0o600)
        try:
            load_var_file(str(path))
        except ConfigError as error:
            assert "\n" not in str(error)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                      max_size=4),
    max_leaves=30)


@FUZZ
@given(JSON_VALUES, st.booleans())
def test_probe_json_parser_takes_anything(document: object, with_header: bool) -> None:
    if with_header and isinstance(document, dict):
        document = {"fleetfix_probe": 1, **document}
    try:
        parse_facts(json.dumps(document))
    except ProbeOutputError as error:
        assert "\n" not in str(error)


@FUZZ
@given(st.text(max_size=200))
def test_probe_json_parser_takes_any_text(text: str) -> None:
    try:
        parse_facts(text)
    except ProbeOutputError as error:
        assert "\n" not in str(error)
