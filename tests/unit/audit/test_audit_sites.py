"""Several controllers, one history: sites kept apart, concurrent runs, a connection lost mid-run. Each
test runs on both backends (the `history` fixture) unless it is about PostgreSQL alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_testkit import finding

from fleetfix.audit import AuditStore, TargetResult, load_audit
from fleetfix.audit.backend import connect_args, shown
from fleetfix.errors import AuditBusyError, ConfigError, StoreError
from tests.lab.pgserver import PgServer

DAY = 86400.0


def _result(target: str, *codes: str, status: str = "ok") -> TargetResult:
    return TargetResult(target=target, node=target.split("/")[0], ctid=None, status=status,
                        findings=tuple(finding(code) for code in codes))


def _run(store: AuditStore, started: float, *results: TargetResult, complete: bool = True) -> int:
    run_id = store.start_run({"inventory": "inv.yaml"}, started=started)
    for result in results:
        store.record_target(run_id, result)
    if complete:
        store.finish_run(run_id, finished=started + 1)
    return run_id


def test_the_same_node_name_at_two_sites_never_shares_a_history(history: str | Path) -> None:
    with AuditStore(history, site="east", controller="ctl-e") as east, \
            AuditStore(history, site="west", controller="ctl-w") as west:
        e1 = _run(east, 100.0, _result("pve1/200", "DISK_LOW"))
        w1 = _run(west, 150.0, _result("pve1/200"))  # the same name, another machine
        e2 = _run(east, 200.0, _result("pve1/200", "DISK_LOW"))
        w2 = _run(west, 250.0, _result("pve1/200", "DPKG_INTERRUPTED"))
        # drift: each run against its own site's last result only
        assert east.previous_complete(e2) == e1 and west.previous_complete(w2) == w1
        east_drift = load_audit(east, e2).drift.to_json()
        west_drift = load_audit(west, w2).drift.to_json()
        assert east_drift["new_findings"] == [] and east_drift["resolved_findings"] == []
        assert [c["code"] for c in west_drift["new_findings"]] == ["DPKG_INTERRUPTED"]
        # since and staleness per site
        assert east.since(e2) == {("pve1/200", "DISK_LOW"): 100.0}
        assert west.since(w2) == {("pve1/200", "DPKG_INTERRUPTED"): 250.0}
        assert (east.first_seen("pve1/200"), west.first_seen("pve1/200")) == (100.0, 150.0)
        # the trend of a site's run is its site's runs
        assert [p.run for p in east.trend(e2, limit=10)] == [e1, e2]
        assert [p.run for p in west.trend(w2, limit=10)] == [w1, w2]
        # the runs say who ran them where; readers filter by site
        assert [(i.id, i.site, i.controller) for i in east.runs()] == [
            (w2, "west", "ctl-w"), (e2, "east", "ctl-e"), (w1, "west", "ctl-w"), (e1, "east", "ctl-e")]
        assert [i.id for i in east.runs(site="west")] == [w2, w1]
        assert east.resolve("last", site="east") == e2 and east.resolve("last") == w2
        with pytest.raises(ConfigError, match=r"run \d+ is not of site 'east'"):
            east.resolve(str(w2), site="east")
        with pytest.raises(ConfigError, match="no audit runs recorded yet at site 'north'"):
            east.resolve("last", site="north")


def test_prune_keeps_each_sites_newest_complete_run(history: str | Path) -> None:
    with AuditStore(history, site="east") as east, AuditStore(history, site="west") as west:
        e1 = _run(east, 1 * DAY, _result("pve1/200"))
        w1 = _run(west, 2 * DAY, _result("pve1/200"))
        _run(west, 3 * DAY, _result("pve1/201"))  # west's newest covers another target
        e2 = _run(east, 50 * DAY, _result("pve1/200"), complete=False)
        assert east.prune(keep_days=1, now=100 * DAY).runs == 1  # only w1: each site's newest stays
        assert [r.target for r in east.load(e1).targets] == ["pve1/200"]
        with pytest.raises(ConfigError, match="was pruned"):
            west.load(w1)
        # w1's pve1/200 result was its newest: kept for the next west run's drift
        assert west.latest_complete_runs(e2 + 100, ["pve1/200"]) == {"pve1/200": w1}


def test_controllers_audit_their_sites_at_once_losing_and_mixing_nothing(
        history_factory: Callable[[], str | Path]) -> None:
    """N controllers, one database, overlapping runs of their own sites with the same target names and
    the same findings (the documents they intern are the same rows): every result lands in its own run,
    every run is complete, each site's drift is against its own previous run."""
    history = history_factory()
    controllers, nights, targets = 4, 3, 12
    with AuditStore(history):
        pass  # created once: the schema is made by whoever opens a new database first
    barrier = threading.Barrier(controllers)
    failures: list[BaseException] = []
    made: dict[str, list[int]] = {}

    def controller(index: int) -> None:
        site = f"site{index}"
        try:
            with AuditStore(history, site=site, controller=f"ctl{index}") as store, store.audit_lock():
                made[site] = []
                for night in range(nights):
                    barrier.wait(timeout=60)  # every controller's run of this night overlaps the others'
                    run_id = store.start_run({"inventory": site}, started=1000.0 * (night + 1) + index)
                    made[site].append(run_id)
                    for ctid in range(targets):
                        codes = ("DISK_LOW",) if ctid % 3 == 0 else ()
                        if night == nights - 1 and ctid == index:  # one new finding, per site, last night
                            codes = (*codes, "DPKG_INTERRUPTED")
                        store.record_target(run_id, _result(f"pve1/{200 + ctid}", *codes))
                    store.finish_run(run_id, finished=1000.0 * (night + 1) + 500)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=controller, args=(i,)) for i in range(controllers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not failures, failures
    with AuditStore(history, readonly=True) as reader:
        runs = reader.runs()
        assert len(runs) == controllers * nights and {i.status for i in runs} == {"complete"}
        for index in range(controllers):
            site = f"site{index}"
            ids = made[site]
            assert {i.id for i in runs if i.site == site} == set(ids)
            for run_id in ids:
                loaded = reader.load(run_id)
                assert loaded.info.controller == f"ctl{index}"
                assert [r.target for r in loaded.targets] == sorted(f"pve1/{200 + c}" for c in range(targets))
            last = load_audit(reader, ids[-1])
            assert reader.previous_complete(ids[-1]) == ids[-2]
            new = [(c["target"], c["code"]) for c in last.drift.to_json()["new_findings"]]
            assert new == [(f"pve1/{200 + index}", "DPKG_INTERRUPTED")]
            assert last.history.since[(f"pve1/{200 + 0}", "DISK_LOW")] == 1000.0 + index


def test_a_second_audit_of_the_same_site_is_refused(pg_server: PgServer) -> None:
    """PostgreSQL's per-site advisory lock (SQLite's is the file lock the CLI takes: fleetfix.audit.lock)."""
    history = pg_server.fresh_url()
    with AuditStore(history, site="east") as first, first.audit_lock():
        with AuditStore(history, site="west") as other, other.audit_lock():
            pass  # another site: audits at once
        with AuditStore(history, site="east") as second, pytest.raises(AuditBusyError, match="site 'east'"):
            second.audit_lock().__enter__()


def test_a_lost_connection_fails_the_run_in_one_line_and_loses_nothing_committed(pg_server: PgServer) -> None:
    url = pg_server.fresh_url()
    with AuditStore(url, site="east") as store:
        run_id = store.start_run({"inventory": "inv.yaml"}, started=100.0)
        store.record_target(run_id, _result("pve1/200", "DISK_LOW"))
        store.record_target(run_id, _result("pve1/201"))
        pid = store._conn.raw.info.backend_pid
        with pg_server.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StoreError) as lost:
            store.record_target(run_id, _result("pve1/202"))
    message = str(lost.value)
    assert "\n" not in message and "lost the connection to the audit database" in message
    assert message.startswith("postgresql://postgres@/postgres:")
    assert "results committed before are kept" in message
    with AuditStore(url, readonly=True) as reader:
        info = reader.info(run_id)
        assert info.status == "incomplete" and info.finished is None
        assert [r.target for r in reader.load(run_id).targets] == ["pve1/200", "pve1/201"]


def test_a_password_is_a_reference_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_PG_PASSWORD", "s3cret")
    url = "postgresql://audit@127.0.0.1:5433/fleet?password=@env:AUDIT_PG_PASSWORD&sslmode=disable"
    conninfo, kwargs = connect_args(url)
    assert kwargs == {"password": "s3cret"} and "s3cret" not in conninfo and "sslmode=disable" in conninfo
    assert shown(url) == "postgresql://audit@127.0.0.1:5433/fleet"
    with pytest.raises(ConfigError, match="a password in the URL") as literal:
        connect_args("postgresql://audit:hunter2@127.0.0.1/fleet")
    assert "hunter2" not in str(literal.value)
    with pytest.raises(ConfigError, match="must be a reference") as plain:
        connect_args("postgresql://audit@127.0.0.1/fleet?password=hunter2")
    assert "hunter2" not in str(plain.value)


def test_the_cli_reads_prunes_and_migrates_either_backend(history: str | Path) -> None:
    import json

    from click.testing import CliRunner

    from fleetfix.cli import main

    with AuditStore(history, site="east", controller="ctl-e") as east, \
            AuditStore(history, site="west", controller="ctl-w") as west:
        e1 = _run(east, 100.0, _result("pve1/200"))
        w1 = _run(west, 150.0, _result("pve1/200", "DISK_LOW"))
        e2 = _run(east, 200.0, _result("pve1/200", "DPKG_INTERRUPTED"))
    db = str(history)

    def cli(*args: str) -> str:
        result = CliRunner().invoke(main, ["audit", *args, "--db", db])
        assert result.exit_code in (0, 3), result.output
        return result.stdout

    runs = json.loads(cli("history", "--json"))
    assert [(r["id"], r["site"], r["controller"]) for r in runs] == [
        (e2, "east", "ctl-e"), (w1, "west", "ctl-w"), (e1, "east", "ctl-e")]
    assert [r["id"] for r in json.loads(cli("history", "--site", "west", "--json"))] == [w1]
    text = cli("history").splitlines()
    assert text[0].split()[-2:] == ["SITE", "CONTROLLER"] and text[1].split()[-2:] == ["east", "ctl-e"]
    shown_run = json.loads(cli("show", "last", "--site", "west", "--json"))
    assert shown_run["run"]["id"] == w1 and shown_run["drift"]["new_findings"] == []  # east is no baseline
    east_run = json.loads(cli("show", "last", "--site", "east", "--json"))
    assert [c["code"] for c in east_run["drift"]["new_findings"]] == ["DPKG_INTERRUPTED"]
    assert cli("show", "last", "--site", "west").startswith(f"audit run {w1} at site west (controller ctl-w)")
    diff = json.loads(cli("diff", str(e1), str(e2), "--site", "east", "--json"))
    assert [c["code"] for c in diff["new_findings"]] == ["DPKG_INTERRUPTED"]
    assert "up to date" in cli("migrate")
    # e1 only: each site's newest complete run stays (w1 is west's, though older than e1)
    assert "pruned 1 result(s) of 1 run(s)" in cli("prune", "--keep-days", "1")
    assert json.loads(cli("show", "last", "--site", "west", "--json"))["run"]["id"] == w1


def test_an_audit_whose_connection_is_killed_fails_in_one_line_keeping_its_results(
        pg_server: PgServer) -> None:
    """The whole audit (run_audit, worker threads committing as results arrive), its backend terminated
    from a second connection after two results."""
    from audit_testkit import FakeWorld, make_target

    from fleetfix.audit import DEFAULT_POLICY, run_audit
    from fleetfix.fleet import Fleet

    url = pg_server.fresh_url()
    world = FakeWorld({200: "healthy", 201: "problem_case", 202: "healthy", 203: "healthy"})
    targets = [make_target("pve1", ctid) for ctid in (200, 201, 202, 203)]
    with AuditStore(url, site="east") as store:
        done: list[str] = []

        def progress(report: object) -> None:
            done.append("x")
            if len(done) == 2:
                with pg_server.admin() as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (store._conn.raw.info.backend_pid,))

        fleet = Fleet(connect=world.connect, channels_per_node=1)
        with pytest.raises(StoreError, match="lost the connection to the audit database") as lost:
            run_audit(fleet, targets, policy=DEFAULT_POLICY, store=store, on_progress=progress)
    assert "\n" not in str(lost.value)
    with AuditStore(url, readonly=True) as reader:
        [info] = reader.runs()
        assert info.status == "incomplete"
        assert [r.target for r in reader.load(info.id).targets] == ["pve1/200", "pve1/201"]


def _night(n: int, targets: int) -> list[TargetResult]:
    """Results whose facts move a leaf each night (a delta), with node facts and findings: every kind of
    row a result is written as."""
    results = []
    for i in range(targets):
        codes = ("DISK_LOW",) if (i + n) % 3 == 0 else ()
        results.append(TargetResult(
            target=f"pve{i % 2}/{200 + i}", node=f"pve{i % 2}", ctid=200 + i,
            status="unreachable" if (i, n) == (1, 1) else "ok",
            findings=tuple(finding(code) for code in codes), duration=0.5,
            facts=None if (i, n) == (1, 1) else {
                "hostname": f"ct{i}", "build": {"mem_available_mb": 1000 + n, "packages": list(range(40))},
                "big": "x" * (2000 if n < 2 else 10)},
            node_facts={"kernel": "6.8", "node": i % 2}))
    return results


def test_a_postgresql_result_costs_a_few_round_trips(pg_server: PgServer) -> None:
    """Each result its own transaction, in two round trips (three when its facts need a new base):
    counted in libpq's own trace of the connection, so a return to a statement at a time (~11) fails."""
    from tests.lab.pgserver import round_trips

    targets = 6
    with AuditStore(pg_server.fresh_url(), site="east") as store:
        per_night = []
        for night in range(3):
            run_id = store.start_run({}, started=100.0 + night * DAY)
            store.record_target(run_id, _night(night, targets)[0])  # the run's start is read once
            with round_trips(store._conn.raw) as counted:
                for result in _night(night, targets)[1:]:
                    store.record_target(run_id, result)
            per_night.append(counted[0] / (targets - 1))
            store.finish_run(run_id, finished=200.0 + night * DAY)
    # night 0: every facts base new; night 2: a new base (the big leaf shrank); night 1: deltas only
    assert per_night[0] <= 3 and per_night[2] <= 3, per_night
    assert per_night[1] <= 2, per_night


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "statement-at-a-time"])
def test_postgresql_stores_the_same_rows_as_sqlite(pg_server: PgServer, tmp_path: Path,
                                                   pipelined: bool) -> None:
    """The pipelined writer keeps the layout's rows: the same targets, states (each reference to a blob
    as its document), results and deltas, the same number of each (nothing stored twice). Blob ids may
    be drawn in another order (node facts and findings are interned before a new facts base). Without
    pipeline mode (a libpq older than 14) the store writes a statement at a time, the same rows."""
    from fleetfix.audit.layout import unpack

    dumps = []
    for history in (tmp_path / "history.db", pg_server.fresh_url()):
        with AuditStore(history, site="east") as store:
            store._pipelined = store._pipelined and pipelined
            for night in range(3):
                _run(store, 100.0 + night * DAY, *_night(night, 6))
            run_id = store.start_run({}, started=100.0 + 3 * DAY)
            store.record_targets(run_id, _night(3, 6))
            conn = store._conn
            docs = {i: unpack(data) for i, data in conn.execute("SELECT id, data FROM blobs").fetchall()}
            state_rows = conn.execute("SELECT id, node, ctid, status, health, error, facts, node_facts,"
                                      " findings, ignored, since FROM states").fetchall()
            states = {row[0]: (*row[1:6], *(docs.get(ref) for ref in row[6:9]), *row[9:])
                      for row in state_rows}
            dumps.append({
                "targets": conn.execute("SELECT id, site, name, first_seen, last_probed FROM targets"
                                        " ORDER BY id").fetchall(),
                "counts": [len(docs), len(states)],
                "results": sorted(
                    (run, target, states[state], duration, delta) for run, target, state, duration, delta
                    in conn.execute("SELECT run, target, state, duration, delta FROM target_results")),
            })
    assert dumps[0] == dumps[1]
    assert any(row[4] is not None for row in dumps[0]["results"])  # deltas were written


def test_a_document_another_controller_commits_meanwhile_is_shared(pg_server: PgServer) -> None:
    """The race the one-statement interning must survive: the findings list is not in the writer's
    snapshot, but another transaction inserts it and commits while the writer waits on the conflict.
    The writer then uses that row (a DO NOTHING alone would return no id)."""
    import time

    from fleetfix.audit.layout import digest, dumps, pack_for

    url = pg_server.fresh_url()
    result = _result("pve1/200", "DISK_LOW")
    text = dumps([item.model_dump(mode="json") for item in result.findings])
    with AuditStore(url, site="east") as store, pg_server.admin() as other:
        other.execute(f"SET search_path TO {url.rsplit('search_path%3D', 1)[1]}")
        run_id = store.start_run({}, started=100.0)
        other.execute("BEGIN")
        theirs = other.execute("INSERT INTO blobs (digest, data) VALUES (%s, %s) RETURNING id",
                               (digest(text), pack_for(store._conn, text))).fetchone()[0]
        writer = threading.Thread(target=store.record_target, args=(run_id, result))
        writer.start()
        for _ in range(400):  # until the writer waits for the other transaction
            if other.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                             ).fetchone()[0]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the writer never waited for the other transaction")
        other.execute("COMMIT")
        writer.join(30)
        assert not writer.is_alive()
        ids = store._conn.execute("SELECT s.findings FROM target_results t JOIN states s ON s.id = t.state"
                                  " WHERE t.run = ?", (run_id,)).fetchall()
        assert ids == [(theirs,)]
        assert store._conn.execute("SELECT count(*) FROM blobs").fetchone()[0] == 1
