"""The --limit pattern language: each term kind, exclusions, order, and one-line errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetfix.errors import ConfigError
from fleetfix.inventory.select import parse_term, select
from fleetfix.target import NODE, GuestRef, NodeRef, Target

PVE1 = NodeRef("pve1", None)
PVE2 = NodeRef("pve2", None)
TARGETS = [
    Target("pve1", PVE1, NODE, tags=frozenset({"a100"})),
    Target("train-a", PVE1, GuestRef.lxc(200), tags=frozenset({"a100", "training"}),
           groups=frozenset({"training", "gpu"})),
    Target("pve1/201", PVE1, GuestRef.lxc(201), tags=frozenset({"a100", "training", "notebooks"}),
           groups=frozenset({"training", "gpu"})),
    Target("pve2/300", PVE2, GuestRef.lxc(300), tags=frozenset({"inference"}),
           groups=frozenset({"serving", "gpu"})),
    Target("pve2/1250", PVE2, GuestRef.lxc(1250)),
    Target("fe80::1", NodeRef("fe80::1", None), NODE),  # an ad-hoc IPv6 host is a legal target name
]


def names(pattern: str | None) -> list[str]:
    return [target.name for target in select(TARGETS, pattern)]


@pytest.mark.parametrize(("pattern", "expected"), [
    (None, [t.name for t in TARGETS]),
    ("train-a", ["train-a"]),
    ("pve1", ["pve1"]),  # the node target by name, not everything on the node
    ("pve1/*", ["pve1/201"]),
    ("pve?/[23]*", ["pve1/201", "pve2/300"]),
    ("*", [t.name for t in TARGETS]),
    ("all", [t.name for t in TARGETS]),
    ("training", ["train-a", "pve1/201"]),  # a bare group name
    ("group:training", ["train-a", "pve1/201"]),
    ("group:s*", ["pve2/300"]),
    ("tag:a100", ["pve1", "train-a", "pve1/201"]),
    ("tag:note*", ["pve1/201"]),
    ("node:pve2", ["pve2/300", "pve2/1250"]),
    ("node:pve*", [t.name for t in TARGETS[:5]]),
    ("ctid:300", ["pve2/300"]),
    ("ctid:200-300", ["train-a", "pve1/201", "pve2/300"]),
    ("name:pve1*", ["pve1", "pve1/201"]),
    ("name:training", []),  # name: never means a group
    ("fe80::1", ["fe80::1"]),
])
def test_each_term_kind(pattern: str | None, expected: list[str]) -> None:
    if expected:
        assert names(pattern) == expected
    else:
        with pytest.raises(ConfigError, match="matched no targets"):
            names(pattern)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("gpu,!tag:notebooks", ["train-a", "pve2/300"]),
    ("!node:pve1", ["pve2/300", "pve2/1250", "fe80::1"]),  # only exclusions: start from all
    ("!node:pve1,!fe80::1", ["pve2/300", "pve2/1250"]),
    ("tag:a100, !pve1 ,ctid:1250", ["train-a", "pve1/201", "pve2/1250"]),  # spaces around terms are fine
    ("!train-a,training", ["pve1/201"]),  # an exclusion wins wherever it is written
])
def test_exclusions(pattern: str, expected: list[str]) -> None:
    assert names(pattern) == expected


def test_input_order_is_kept_and_no_duplicates() -> None:
    assert names("pve2/300,train-a,gpu,train-a") == ["train-a", "pve1/201", "pve2/300"]
    reversed_targets = list(reversed(TARGETS))
    assert [t.name for t in select(reversed_targets, "gpu")] == ["pve2/300", "pve1/201", "train-a"]


@pytest.mark.parametrize(("pattern", "message"), [
    ("nothing-here", "--limit 'nothing-here' matched no targets"),
    ("all,!all", "--limit 'all,!all' matched no targets"),
    ("", "--limit '': empty pattern"),
    ("a,,b", "--limit 'a,,b': empty term"),
    ("!", "--limit '!': '!' needs a term after it"),
    ("tag:", "--limit 'tag:': tag: needs a value"),
    ("ctid:abc", "--limit 'ctid:abc': 'ctid:abc': ctid: expects a CT id or a range"),
    ("ctid:300-200", "ctid range is empty (300 > 200)"),
    ("tga:gpu", "--limit 'tga:gpu': unknown selector 'tga:'"),
])
def test_errors_are_one_line_config_errors(pattern: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        select(TARGETS, pattern)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_option_name_in_errors_can_be_changed() -> None:
    with pytest.raises(ConfigError, match=r"^--only 'x' matched no targets$"):
        select(TARGETS, "x", option="--only")


def test_parse_term_records_the_text_as_written() -> None:
    term = parse_term(" !tag:gpu ")
    assert (term.text, term.kind, term.value, term.exclude) == ("!tag:gpu", "tag", "gpu", True)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab!:*?[],-/ 0123tagnodectidgroup", max_size=30))
def test_fuzz_patterns_select_a_subset_or_raise_config_error(pattern: str) -> None:
    try:
        chosen = select(TARGETS, pattern)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert chosen
        positions = [TARGETS.index(target) for target in chosen]
        assert positions == sorted(set(positions))  # a subset, in input order, without repeats
