"""Fuzzing the three user-facing loaders (inventory, playbook, policy) with hypothesis.

Whatever the file holds, a loader either returns or raises a `ConfigError` (InventoryError, PlaybookError
and TemplateError are subclasses) whose message is one line: that is what the CLI turns into
`fleetfix: error: ...` and exit 2. Any other exception would be a traceback for the user.

Three kinds of input: arbitrary text; arbitrary YAML documents built from each loader's own field names
(so the fuzz gets past "not a mapping" into the validators); and the shipped example files with one line
deleted, duplicated or replaced (near-misses, the most common real mistake).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetfix.audit.policy import load_policy
from fleetfix.errors import ConfigError
from fleetfix.inventory.discovery.model import DiscoveryResult, ProxmoxSource
from fleetfix.inventory.load import load_inventory
from fleetfix.playbook.load import load_playbook

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def no_discovery(source: ProxmoxSource) -> DiscoveryResult:
    """Discovery never touches the network here: a source lists no containers."""
    return DiscoveryResult(source=f"proxmox:{source.name}", targets=[], skipped=[])


LOADERS: dict[str, Callable[[Path], Any]] = {
    "inventory": lambda path: load_inventory(path, discover=no_discovery),
    "playbook": load_playbook,
    "policy": load_policy,
}

# Field names each loader knows (and a few it does not), so generated documents reach the validators.
FIELDS = {
    "inventory": ["defaults", "nodes", "groups", "proxmox", "name", "address", "port", "user", "containers",
                  "ctid", "tags", "vars", "include_node", "identity_file", "known_hosts", "accept_new",
                  "jump_host", "connect_timeout", "keepalive", "targets", "python", "bogus"],
    "playbook": ["name", "description", "vars", "hosts", "requires", "steps", "when", "check", "apply",
                 "verify", "retries", "delay", "until", "timeout", "register", "env", "ignore_errors",
                 "changed_when", "facts", "bogus"],
    "policy": ["severity", "required_extensions", "rules", "match", "groups", "tags", "targets", "max_age",
               "unreachable_days", "CUDA_RUNTIME_WITHOUT_TOOLKIT", "DPKG_INTERRUPTED", "error", "warning",
               "info", "ignore", "bogus", "source"],
}
EXAMPLE_POLICY = """\
severity:
  DPKG_LOCK_HELD: error
required_extensions: [causal_conv1d]
rules:
  - match: {tags: [training], groups: [gpu], targets: ["pve1/*"]}
    severity: {EXTENSION_MISSING: warning}
    required_extensions: [flash_attn]
max_age:
  unreachable_days: 3
"""
EXAMPLES = {
    "inventory": (REPO / "inventory.example.yaml").read_text(),
    "playbook": (REPO / "playbooks" / "cuda-toolkit.yaml").read_text(),
    "policy": EXAMPLE_POLICY,
}

HOSTILE_TEXT = st.sampled_from(["'", '"', "$(touch /canary)", "`id`", ";", "\n", "ünï", "{{ 7 * 7 }}",
                                "{% for %}", "\x00", "-1", "1e999", "~", "&anchor", "*alias", ": ", "- "])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), HOSTILE_TEXT,
)


def documents(kind: str) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.sampled_from(FIELDS[kind]), st.text(max_size=8))
    return st.recursive(
        SCALARS,
        lambda children: st.one_of(st.lists(children, max_size=4),
                                   st.dictionaries(keys, children, max_size=5)),
        max_leaves=25,
    )


def load(kind: str, text: str) -> str | None:
    """Write text to a file and load it; only a ConfigError may come out. Returns its message."""
    with tempfile.TemporaryDirectory(prefix="fleetfix-fuzz-") as scratch:
        path = Path(scratch) / f"{kind}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            LOADERS[kind](path)
        except ConfigError as error:
            assert str(error), "an empty error message"
            return str(error)
    return None


KINDS = st.sampled_from(sorted(LOADERS))


@FUZZ
@given(kind=KINDS, text=st.text(max_size=300))
def test_arbitrary_text(kind: str, text: str) -> None:
    load(kind, text.replace("\ud800", ""))


@FUZZ
@given(kind=KINDS, data=st.data())
def test_arbitrary_documents(kind: str, data: st.DataObject) -> None:
    document = data.draw(documents(kind))
    load(kind, yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(kind=st.sampled_from(sorted(EXAMPLES)), data=st.data())
def test_example_files_with_one_line_changed(kind: str, data: st.DataObject) -> None:
    lines = EXAMPLES[kind].splitlines()
    index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    edit = data.draw(st.sampled_from(["delete", "duplicate", "replace", "indent"]))
    if edit == "delete":
        del lines[index]
    elif edit == "duplicate":
        lines.insert(index, lines[index])
    elif edit == "indent":
        lines[index] = "  " + lines[index]
    else:
        lines[index] = data.draw(st.one_of(HOSTILE_TEXT, st.text(max_size=40)))
    load(kind, "\n".join(lines) + "\n")


def test_the_unmodified_examples_load() -> None:
    """The mutation test above starts from files that are valid (else it would only fuzz one error)."""
    for kind, text in EXAMPLES.items():
        with tempfile.TemporaryDirectory(prefix="fleetfix-fuzz-") as scratch:
            path = Path(scratch) / f"{kind}.yaml"
            path.write_text(text)
            LOADERS[kind](path)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_an_unknown_field_name_with_a_newline_is_reported_on_one_line(kind: str) -> None:
    """A hostile key must not add a line of its own to `fleetfix: error: ...` (it could forge output)."""
    message = load(kind, yaml.safe_dump({"x\nfleetfix: forged line": 1}))
    assert message is not None
    assert "\n" not in message, message
