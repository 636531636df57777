"""The probe: one POSIX sh script per target, one JSON document back, Facts, and rules -> Findings.

    script = build_probe_script(pythons=("python3",), deep=False)   # send with run_script()
    facts = parse_facts(result.stdout)                               # ProbeOutputError if not the probe's
    node = parse_node_facts(run_script(node_transport, build_node_script()).stdout)
    findings = diagnose(facts, node)                                 # root cause first

The names are loaded on first use (PEP 562): the facts models (pydantic) and the rules are slow to import,
and a probe can send its script before it needs them; `fleetfix.probe.run` imports them on a thread of
their own while the first targets work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetfix.probe.facts import Facts, NodeFacts, parse_facts, parse_node_facts
    from fleetfix.probe.rules import Finding, Fix, Severity, diagnose
    from fleetfix.probe.script import NODE_FACTS_SCRIPT, build_node_script, build_probe_script

_MODULE_OF = {
    "Facts": "fleetfix.probe.facts", "NodeFacts": "fleetfix.probe.facts",
    "parse_facts": "fleetfix.probe.facts", "parse_node_facts": "fleetfix.probe.facts",
    "Finding": "fleetfix.probe.rules", "Fix": "fleetfix.probe.rules", "Severity": "fleetfix.probe.rules",
    "diagnose": "fleetfix.probe.rules",
    "NODE_FACTS_SCRIPT": "fleetfix.probe.script", "build_node_script": "fleetfix.probe.script",
    "build_probe_script": "fleetfix.probe.script",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


__all__ = [
    "NODE_FACTS_SCRIPT",
    "Facts",
    "Finding",
    "Fix",
    "NodeFacts",
    "Severity",
    "build_node_script",
    "build_probe_script",
    "diagnose",
    "parse_facts",
    "parse_node_facts",
]
