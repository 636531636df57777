"""parse_facts: recorded fixtures parse, bad output is refused with one line, derived facts are right."""

from __future__ import annotations

import json
from types import FunctionType
from typing import Any

import pytest
from probe_testkit import FIXTURES, edited, facts_of, load_fixture
from pydantic import BaseModel

from fleetfix.errors import ProbeOutputError
from fleetfix.probe import parse_facts
from fleetfix.probe.facts import (
    MAX_PROBE_OUTPUT_BYTES,
    AptSource,
    Facts,
    OsFacts,
    empty,
    nvidia_arch,
    nvidia_distro,
)

ALL_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_recorded_fixture_parses(name: str) -> None:
    facts = parse_facts((FIXTURES / f"{name}.json").read_text())
    assert facts.fleetfix_probe == 1


@pytest.mark.parametrize(("os_id", "version_id", "expected"), [
    ("ubuntu", "24.04", "ubuntu2404"),
    ("ubuntu", "22.04", "ubuntu2204"),
    ("ubuntu", "20.04", "ubuntu2004"),
    ("debian", "12", "debian12"),
    ("debian", "13", "debian13"),
    ("debian", "11", "debian11"),
    ("ubuntu", "23.10", None),        # interim release: NVIDIA has no repo for it
    ("debian", "10", None),
    ("linuxmint", "21.3", None),      # derivatives are not mapped onto their base
    ("fedora", "40", None),
    ("debian", None, None),           # testing/sid have no VERSION_ID
    (None, None, None),
])
def test_nvidia_distro(os_id: str | None, version_id: str | None, expected: str | None) -> None:
    assert nvidia_distro(os_id, version_id) == expected


@pytest.mark.parametrize(("machine", "expected"), [
    ("x86_64", "x86_64"), ("aarch64", "sbsa"), ("armv7l", None), ("ppc64le", None), (None, None)])
def test_nvidia_arch(machine: str | None, expected: str | None) -> None:
    assert nvidia_arch(machine) == expected


def test_derived_fields_are_in_the_template_dump() -> None:
    dumped = facts_of(load_fixture("healthy")).model_dump(mode="json")
    assert dumped["os"]["nvidia_distro"] == "debian12"
    assert dumped["os"]["nvidia_arch"] == "x86_64"
    assert dumped["apt"]["nvidia_repo_configured"] is True
    assert dumped["torch"] == {"version": "2.11.0+cu128", "cuda": "12.8", "interpreter": "python3",
                               "path": "/usr/local/lib/python3.11/dist-packages/torch",
                               # recorded before the probe read them (issue 19): unknown, not guessed
                               "cxx11_abi": None, "python_tag": None, "libc": None}


CONTRACT_PATHS = [
    "os.id", "os.version_id", "os.codename", "os.machine", "os.nvidia_distro", "os.nvidia_arch",
    "apt.present", "apt.version", "apt.nvidia_repo_configured", "apt.keyring_installed", "apt.keyring_file",
    "apt.nvidia_sources", "cuda.toolkits", "cuda.default_link", "cuda.packages", "pythons", "torch",
    "gpu.devices", "gpu.driver_version", "gpu.names", "gpu.compute_caps", "build.gcc", "build.gxx",
    "build.ninja", "build.disk_free_mb", "build.mem_total_mb", "build.cpus",
]


@pytest.mark.parametrize("dotted", CONTRACT_PATHS)
def test_facts_contract_names(dotted: str) -> None:
    node: Any = facts_of(load_fixture("healthy")).model_dump(mode="json")
    for part in dotted.split("."):
        assert part in node, dotted
        node = node[part]


def test_contract_shapes_of_list_items() -> None:
    dumped = facts_of(load_fixture("healthy")).model_dump(mode="json")
    assert set(dumped["apt"]["nvidia_sources"][0]) >= {"file", "line", "uri", "signed_by", "format"}
    assert set(dumped["cuda"]["toolkits"][0]) == {"path", "version", "nvcc", "release"}
    assert set(dumped["cuda"]["packages"][0]) == {"name", "version"}
    env = dumped["pythons"][0]
    assert set(env) >= {"interpreter", "found", "version", "torch", "extensions"}
    assert set(env["extensions"]["causal_conv1d"]) >= {"present", "importable", "error"}
    assert set(dumped["build"]["disk_free_mb"]) >= {"/", "/var/cache/apt"}


def test_dump_parses_back_to_equal_facts() -> None:
    facts = facts_of(load_fixture("apt_trouble"))
    assert parse_facts(json.dumps(facts.model_dump(mode="json"))) == facts


def test_torch_is_the_first_env_that_has_it() -> None:
    def two_envs(data: dict[str, Any]) -> None:
        with_torch = data["pythons"][0]
        data["pythons"] = [{"interpreter": "/usr/bin/python3", "found": True, "torch": None},
                           {**with_torch, "interpreter": "/opt/venv/bin/python"}]
    facts = edited("problem_case", two_envs)
    assert facts.torch is not None
    assert (facts.torch.interpreter, facts.torch.cuda) == ("/opt/venv/bin/python", "12.8")
    assert facts_of(load_fixture("no_python")).torch is None


def source(**overrides: Any) -> AptSource:
    fields: dict[str, Any] = {"file": "/etc/apt/sources.list.d/cuda.list", "line": 1, "format": "list",
                              "uri": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
                              "suite": "/"}
    return AptSource(**{**fields, **overrides})


@pytest.mark.parametrize(("entries", "configured"), [
    ([source()], True),
    ([source(types="deb-src")], False),
    ([source(enabled=False)], False),
    ([source(uri="https://developer.download.nvidia.com/compute/machine-learning/repos/ubuntu1804/x86_64")],
     False),
    ([], False),
])
def test_nvidia_repo_configured(entries: list[AptSource], configured: bool) -> None:
    def set_sources(data: dict[str, Any]) -> None:
        data["apt"]["nvidia_sources"] = [e.model_dump() for e in entries]
    assert edited("problem_case", set_sources).apt.nvidia_repo_configured is configured


def test_repo_distro_from_uri() -> None:
    assert source().repo_distro == "debian12"
    assert source(uri="http://127.0.0.1:8080/compute/cuda/repos/ubuntu2404/sbsa/").repo_distro == "ubuntu2404"


@pytest.mark.parametrize(("version", "sqv", "uses_sqv"), [
    ("2.6.1", False, False), ("3.0.3", False, True), ("3.1.2ubuntu1", False, True), (None, True, True),
    (None, False, False)])
def test_apt_uses_sqv(version: str | None, sqv: bool, uses_sqv: bool) -> None:
    def set_apt(data: dict[str, Any]) -> None:
        data["apt"].update(version=version, sqv=sqv)
    assert edited("problem_case", set_apt).apt.uses_sqv is uses_sqv


# ---------------------------------------------------------------- refusals


def refusal(text: str) -> str:
    with pytest.raises(ProbeOutputError) as caught:
        parse_facts(text)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_refuses_empty_output() -> None:
    assert "printed nothing" in refusal("  \n")


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_refuses_truncated_output(fraction: float) -> None:
    whole = json.dumps(load_fixture("healthy"))
    assert "truncated" in refusal(whole[: int(len(whole) * fraction)])


def test_refuses_non_json() -> None:
    message = refusal("sh: 1: Syntax error: Unterminated quoted string\n")
    assert "not JSON" in message and "Syntax error" in message


def test_refuses_huge_output() -> None:
    assert "cap" in refusal('{"fleetfix_probe": 1, "pad": "' + "x" * MAX_PROBE_OUTPUT_BYTES + '"}')


@pytest.mark.parametrize("text", ['[1, 2]', '"fleetfix_probe"', '{"os": {}}'])
def test_refuses_json_that_is_not_the_probes(text: str) -> None:
    assert "not the probe's document" in refusal(text)


def test_refuses_other_schema_version() -> None:
    assert "schema" in refusal('{"fleetfix_probe": 2}')


def test_refuses_wrong_shape_naming_the_field() -> None:
    data = load_fixture("healthy")
    data["pythons"][0]["found"] = "maybe"
    data["build"]["cpus"] = "many"
    message = refusal(json.dumps(data))
    assert "wrong shape" in message
    assert "pythons.0.found" in message           # the first bad field, by name
    assert "(and 1 more)" in message              # build.cpus is counted, not listed


def _probe_models() -> list[type[BaseModel]]:
    from fleetfix.probe import facts
    from fleetfix.probe.rules import base

    return [value for module in (facts, base) for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseModel)
            and value.__module__ == module.__name__]


def test_the_probe_models_default_factories_are_plain_functions() -> None:
    """`empty(list)`, not `list` or a model class: pydantic parses a builtin's signature from text and builds
    a model class's as it builds the model, a start-up cost every command paid (facts.empty, issue 21)."""
    factories = [(model.__name__, name, field.default_factory) for model in _probe_models()
                 for name, field in model.model_fields.items() if field.default_factory is not None]
    assert len(factories) >= 20  # the facts' lists, dicts and sections
    assert [(model, name) for model, name, factory in factories
            if not isinstance(factory, FunctionType)] == []


def test_an_empty_factory_makes_a_new_value_each_time() -> None:
    assert empty(list)() == [] and empty(list)() is not empty(list)()
    first, second = Facts.model_validate({"fleetfix_probe": 1}), Facts.model_validate({"fleetfix_probe": 1})
    assert first.pythons == [] and first.pythons is not second.pythons
    assert first.os == OsFacts() and first.os is not second.os
