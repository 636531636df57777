"""The v5 history layout (issue 21): facts and findings stored once per change, deltas for the leaves that
move every night, retention that keeps drift, since and staleness exactly as they were, and the migration
of a v4 database."""

from __future__ import annotations

import copy
import dataclasses
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from audit_testkit import finding, load_fixture
from click.testing import CliRunner

from fleetfix.audit import AuditStore, TargetResult, load_audit
from fleetfix.audit.delta import apply_delta, leaf_delta
from fleetfix.audit.store import migrate
from fleetfix.cli import main
from fleetfix.errors import ConfigError

DAY = 86400.0


# ---------------------------------------------------------------- deltas


def test_a_delta_holds_only_the_leaves_that_moved_and_rebuilds_the_document_exactly() -> None:
    base = load_fixture("healthy")
    new = copy.deepcopy(base)
    new["build"]["mem_available_mb"] = 59874
    new["build"]["disk_free_mb"]["/"] = 50100
    new["dpkg"]["pending_updates"] = 4
    delta = leaf_delta(base, new)
    assert delta == [[["dpkg", "pending_updates"], 4], [["build", "disk_free_mb", "/"], 50100],
                     [["build", "mem_available_mb"], 59874]]
    before = json.dumps(base)
    rebuilt = apply_delta(base, delta)
    assert json.dumps(rebuilt) == json.dumps(new)  # key order included: reports print facts as stored
    assert json.dumps(base) == before  # the base is shared by other results: never changed
    assert leaf_delta(base, copy.deepcopy(base)) == []


@pytest.mark.parametrize("edit", [
    lambda d: d["build"].update(rust=True),                       # a key added
    lambda d: d["build"].pop("ninja"),                            # a key removed
    lambda d: d.update(build=dict(reversed(list(d["build"].items())))),  # keys reordered
    lambda d: d.update(gpu=None),                                 # an object became a leaf
])
def test_a_change_of_shape_is_no_delta(edit: Any) -> None:
    base = load_fixture("healthy")
    new = copy.deepcopy(base)
    edit(new)
    assert leaf_delta(base, new) is None


def test_leaves_compare_by_json_type_too() -> None:
    assert leaf_delta({"a": 1}, {"a": 1.0}) == [[["a"], 1.0]]
    assert leaf_delta({"a": 1}, {"a": True}) == [[["a"], True]]
    assert leaf_delta({"a": [1, 2]}, {"a": [1, 2, 3]}) == [[["a"], [1, 2, 3]]]  # arrays are leaves


# ---------------------------------------------------------------- storing once per change


def _probed(name: str, facts: dict[str, Any], *codes: str) -> TargetResult:
    return TargetResult(target=name, node=name.split("/")[0], ctid=int(name.split("/")[1]), status="ok",
                        findings=tuple(finding(code) for code in codes), facts=facts, duration=0.5,
                        node_facts={"hostname": "pve1", "kernel_module_version": "570.124.06"})


def _counts(store: AuditStore) -> dict[str, int]:
    conn = store._conn
    return {table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("target_results", "states", "blobs", "targets")}


def _night(store: AuditStore, day: int, results: list[TargetResult], *, complete: bool = True,
           args: dict[str, Any] | None = None) -> int:
    run_id = store.start_run(args or {"inventory": "inv.yaml"}, started=day * DAY)
    store.record_targets(run_id, results)
    if complete:
        store.finish_run(run_id, finished=day * DAY + 60)
    return run_id


def test_a_night_without_change_adds_one_small_row_per_target(history: str | Path) -> None:
    facts = load_fixture("problem_case")
    fleet = [_probed(f"pve1/{ctid}", {**facts, "hostname": f"ct{ctid}"}, "DPKG_INTERRUPTED", "DISK_LOW")
             for ctid in range(200, 210)]
    with AuditStore(history) as store:
        _night(store, 1, fleet)
        first = _counts(store)
        assert first == {"target_results": 10, "states": 10, "blobs": 10 + 1 + 1, "targets": 10}
        _night(store, 2, fleet)
        assert _counts(store) == {**first, "target_results": 20}  # nothing but the rows
        loaded = store.load(2)
    assert list(loaded.targets) == fleet


def test_the_leaves_that_move_every_night_are_a_delta_not_a_new_copy(history: str | Path) -> None:
    facts = load_fixture("healthy")
    with AuditStore(history) as store:
        _night(store, 1, [_probed("pve1/200", facts)])
        blobs = _counts(store)["blobs"]
        moved = copy.deepcopy(facts)
        moved["build"]["mem_available_mb"] = 12345
        result = _probed("pve1/200", moved)
        second = _night(store, 2, [result])
        assert _counts(store)["blobs"] == blobs and _counts(store)["states"] == 1
        delta = store._conn.execute("SELECT delta FROM target_results WHERE run = ?", (second,)).fetchone()[0]
        assert json.loads(delta) == [[["build", "mem_available_mb"], 12345]]
        assert json.dumps(store.load(second).targets[0].facts) == json.dumps(moved)
        assert store.load(1).targets[0].facts == facts
        # a new shape (a tool installed): a new base; the old one serves the older run still
        reshaped = {**moved, "extra": {"rust": True}}
        third = _night(store, 3, [_probed("pve1/200", reshaped)])
        assert store.load(third).targets[0].facts == reshaped and _counts(store)["blobs"] == blobs + 1
        assert store.load(2).targets[0].facts == moved


def test_results_load_without_facts_for_drift_and_text(history: str | Path) -> None:
    with AuditStore(history) as store:
        run = _night(store, 1, [_probed("pve1/200", load_fixture("healthy"), "DISK_LOW")])
        light = store.load(run, facts=False).targets[0]
    assert light.facts is None and [f.code for f in light.findings] == ["DISK_LOW"]
    assert light.node_facts == {"hostname": "pve1", "kernel_module_version": "570.124.06"}


# ---------------------------------------------------------------- retention


def _history(store: AuditStore) -> None:
    """Ten nights. pve1/200 keeps DPKG_INTERRUPTED from night 1; pve1/201 is unreachable from night 6 on;
    pve1/202 is audited only by night 3's --limit run and never again; pve1/203 is vanishing: last seen
    in night 4 (a complete run of the same scope)."""
    facts = load_fixture("healthy")
    for day in range(1, 11):
        results = [_probed("pve1/200", facts, "DPKG_INTERRUPTED")]
        if day < 6:
            results.append(_probed("pve1/201", facts, "DISK_LOW"))
        else:
            results.append(TargetResult("pve1/201", "pve1", 201, "unreachable", error="refused",
                                        findings=(finding("STALE_AUDIT"),) if day > 7 else ()))
        if day <= 4:
            results.append(_probed("pve1/203", facts))
        _night(store, day, results)
        if day == 3:
            _night(store, 3, [_probed("pve1/202", facts, "DISK_LOW")], args={"limit": "pve1/202"})
    _night(store, 11, [_probed("pve1/200", facts)], complete=False)  # killed: a real observation


def _observed(store: AuditStore, run_id: int) -> dict[str, Any]:
    audit = load_audit(store, run_id)
    return {
        "drift": audit.drift.to_json(), "since": audit.history.since,
        "trend": [(p.run, p.counts) for p in audit.history.trend],
        "history": [info.to_json() for info in store.runs()],
        "staleness": {name: (store.last_probed(name), store.first_seen(name))
                      for name in ("pve1/200", "pve1/201", "pve1/202", "pve1/203")},
    }


def test_pruning_keeps_drift_since_trend_and_staleness_exactly(
        history_factory: Callable[[], str | Path]) -> None:
    kept, pruned = AuditStore(history_factory()), AuditStore(history_factory())
    with kept, pruned:
        for store in (kept, pruned):
            _history(store)
        before = _counts(pruned)
        done = pruned.prune(keep_days=3, now=11.5 * DAY)
        after = _counts(pruned)
        assert done.runs == 9 and after["target_results"] < before["target_results"]
        assert done.results == before["target_results"] - after["target_results"]
        # the next night, in both: every answer the same
        facts = load_fixture("healthy")
        for store in (kept, pruned):
            tonight = _night(store, 12, [
                _probed("pve1/200", facts, "DPKG_INTERRUPTED"), _probed("pve1/201", facts, "DISK_LOW"),
                _probed("pve1/202", facts)])
        assert _observed(pruned, tonight) == _observed(kept, tonight)
        # drift of the limited target is against its own old result, which pruning kept
        assert {c["target"] for c in load_audit(pruned, tonight).drift.to_json()["resolved_findings"]} == {
            "pve1/202"}
        # unreachable nights 6-11 do not end 201's streak; the killed run 11 saw 200 without its problem
        assert pruned.since(tonight)[("pve1/201", "DISK_LOW")] == 1 * DAY
        assert pruned.since(tonight)[("pve1/200", "DPKG_INTERRUPTED")] == 12 * DAY
        with pytest.raises(ConfigError, match=r"run 2 was pruned on .*only its summary is kept"):
            pruned.load(2)
        assert [info.target_count for info in pruned.runs()] == [info.target_count for info in kept.runs()]
        # pruning again deletes nothing more; orphaned states and documents are gone
        assert pruned.prune(keep_days=3, now=11.5 * DAY).results == 0
        conn = pruned._conn
        assert conn.execute("SELECT COUNT(*) FROM states WHERE id NOT IN"
                            " (SELECT state FROM target_results)").fetchone()[0] == 0
        pruned.vacuum()


def test_prune_never_touches_the_newest_complete_run(history: str | Path) -> None:
    with AuditStore(history) as store:
        only = _night(store, 1, [_probed("pve1/200", load_fixture("healthy"))])
        assert store.prune(keep_days=1, now=100 * DAY).runs == 0
        assert len(store.load(only).targets) == 1


def test_audit_prune_command(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db) as store:
        _history(store)
    result = CliRunner().invoke(main, ["audit", "prune", "--db", str(db), "--keep-days", "3", "--vacuum"])
    assert result.exit_code == 0, result.output
    assert "of 10 run(s) older than 3 days" in result.stdout and "vacuumed" in result.stdout
    missing = CliRunner().invoke(main, ["audit", "prune", "--db", str(tmp_path / "typo.db"),
                                        "--keep-days", "3"])
    assert missing.exit_code == 2 and not (tmp_path / "typo.db").exists()


@pytest.mark.parametrize(("days", "said"), [("0", "0 is less than one day"),
                                            ("0.5", "0.5 is less than one day"),
                                            ("nan", "nan is less than one day")])
def test_audit_prune_refuses_less_than_a_day_in_the_users_number(tmp_path: Path, days: str,
                                                                  said: str) -> None:
    db = tmp_path / "audit.db"
    with AuditStore(db) as store:
        _history(store)
    result = CliRunner().invoke(main, ["audit", "prune", "--db", str(db), "--keep-days", days])
    assert result.exit_code == 2 and f"Invalid value for '--keep-days': {said}" in result.output
    assert "0.0" not in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------- migration


def test_a_v4_database_is_converted_keeping_every_value(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target_version=4)
    facts = load_fixture("healthy")
    moved = {**facts, "build": {**facts["build"], "mem_available_mb": 1}}
    problem = finding("EXTENSION_MISSING", "warning", extension="fla").model_dump(mode="json")
    for run, started, run_facts in ((1, 100.0, facts), (2, 200.0, moved)):
        conn.execute("INSERT INTO runs (id, started, finished, status, duration)"
                     " VALUES (?, ?, ?, 'complete', 5)", (run, started, started + 5))
        conn.execute("INSERT INTO target_results (run, target, node, ctid, status, health, duration, facts,"
                     " ignored, node_facts) VALUES (?, 'pve1/200', 'pve1', 200, 'ok', 'warning', 1.25, ?,"
                     " '[\"TORCH_CPU_ONLY\"]', '{\"kernel_module_version\": \"570\"}')",
                     (run, json.dumps(run_facts)))
        conn.execute("INSERT INTO findings (run, target, seq, code, severity, summary, evidence, fix, since)"
                     " VALUES (?, 'pve1/200', 0, ?, ?, ?, ?, ?, 100.0)",
                     (run, problem["code"], problem["severity"], problem["summary"],
                      json.dumps(problem["evidence"]), json.dumps(problem["fix"])))
        conn.execute("INSERT INTO target_results (run, target, node, status, health, error)"
                     " VALUES (?, 'pve2/300', 'pve2', 'unreachable', 'unreachable', 'refused')", (run,))
    conn.close()
    with AuditStore(path, migrate=True) as store:
        second = store.load(2)
        missing = finding("EXTENSION_MISSING", "warning", extension="fla")
        assert second.target("pve1/200") == TargetResult(
            "pve1/200", "pve1", 200, "ok", findings=(missing,), facts=moved, duration=1.25,
            ignored=("TORCH_CPU_ONLY",), node_facts={"kernel_module_version": "570"})
        down = TargetResult("pve2/300", "pve2", None, "unreachable", error="refused")
        assert second.target("pve2/300") == down
        assert store.since(2) == {("pve1/200", "EXTENSION_MISSING"): 100.0}
        assert [(i.target_count, i.error_count, i.unreachable_count) for i in store.runs()] == [(2, 0, 1)] * 2
        assert (store.first_seen("pve2/300"), store.last_probed("pve2/300")) == (100.0, None)
        assert store.last_probed("pve1/200") == 200.0
        assert store._conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 3  # facts once, + delta
        tables = {name for (name,) in store._conn.execute("SELECT name FROM sqlite_master")}
        assert "findings" not in tables and "target_results_v5" not in tables


def test_a_projection_keeps_of_each_result_what_it_returns_deltas_included(history: str | Path) -> None:
    """The HTML report loads facts through its projection (issue 21): each result's facts as the
    projection of its whole facts, a result stored as a delta on its base included."""
    from fleetfix.audit.dashboard import matrix_facts

    facts = load_fixture("healthy")
    moved = copy.deepcopy(facts)
    moved["gpu"]["driver_version"] = "575.1.2"  # a leaf the projection keeps, stored as a delta
    with AuditStore(history) as store:
        other = _probed("pve1/201", load_fixture("toolkit_12_4"))
        _night(store, 1, [_probed("pve1/200", facts), other])
        second = _night(store, 2, [_probed("pve1/200", moved), other])
        assert store._conn.execute("SELECT COUNT(*) FROM target_results WHERE run = ? AND delta IS NOT NULL",
                                   (second,)).fetchone()[0] == 1
        for run in (1, second):
            whole = store.load(run).targets
            projected = store.load(run, facts=matrix_facts).targets
            assert [r.facts for r in projected] == [matrix_facts(r.facts or {}) for r in whole]
            assert [dataclasses.replace(r, facts=None) for r in projected] == \
                [dataclasses.replace(r, facts=None) for r in whole]
        assert store.load(second, facts=matrix_facts).targets[0].facts["gpu"]["driver_version"] == "575.1.2"
