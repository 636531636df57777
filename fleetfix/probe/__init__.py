"""The probe: one POSIX sh script per target, one JSON document back, Facts, and rules -> Findings.

    script = build_probe_script(pythons=("python3",), deep=False)   # send with run_script()
    facts = parse_facts(result.stdout)                               # ProbeOutputError if not the probe's
    node = parse_node_facts(run_script(node_transport, build_node_script()).stdout)
    findings = diagnose(facts, node)                                 # root cause first
"""

from fleetfix.probe.facts import Facts, NodeFacts, parse_facts, parse_node_facts
from fleetfix.probe.rules import Finding, Fix, Severity, diagnose
from fleetfix.probe.script import NODE_FACTS_SCRIPT, build_node_script, build_probe_script

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
