"""The report files written in pieces (issue 21: the JUnit text of 10,000 targets, 43 MB, was held whole
and set the audit's peak memory) and the HTML report's facts loaded as a projection: the same bytes as
the renderers gave before either change (golden/, see report_golden.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_testkit import FIXTURES, load_fixture
from report_golden import FILES, GOLDEN, SITES_FILE, recorded_audit, two_site_audit

from fleetfix.audit import TargetResult
from fleetfix.audit.dashboard import matrix_facts, version_matrix
from fleetfix.audit.report import write_atomic
from fleetfix.reports import FORMATS, facts_needed, write_report

BY_NAME = {report_format.name: report_format for report_format in FORMATS}


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The golden files' times are in UTC (the HTML shows local times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("name", list(FILES))
def test_each_report_file_is_the_golden_bytes_streamed_and_with_only_the_facts_it_shows(
        name: str, tmp_path: Path, utc: None) -> None:
    report_format = BY_NAME[name]
    # Loaded as the audit command loads it for this format alone: JUnit and Prometheus without facts,
    # HTML with its projection, JSON with every fact.
    run = recorded_audit(tmp_path, facts=facts_needed([report_format]))
    golden = (GOLDEN / FILES[name]).read_bytes()
    pieces = list(report_format.pieces(run))
    assert "".join(pieces).encode("utf-8") == golden
    path = tmp_path / "out" / FILES[name]
    write_report(str(path), report_format.pieces(run))
    assert path.read_bytes() == golden


def test_the_page_of_two_sites_is_its_golden_bytes(tmp_path: Path, utc: None) -> None:
    run = two_site_audit(tmp_path, facts=facts_needed([BY_NAME["html"]]))
    assert BY_NAME["html"].render(run).encode("utf-8") == (GOLDEN / SITES_FILE).read_bytes()


@pytest.mark.parametrize("name", ["junit", "prometheus", "html", "text"])
def test_the_file_formats_come_in_pieces_none_near_the_whole(name: str, tmp_path: Path, utc: None) -> None:
    """What keeps the memory flat: no piece holds more than a small part of the file (JUnit: one
    target's suite; Prometheus and text: a line; HTML: the template's pieces)."""
    run = recorded_audit(tmp_path, facts=facts_needed([BY_NAME[name]]))
    pieces = list(BY_NAME[name].pieces(run))
    whole = sum(map(len, pieces))
    assert len(run.targets) == 10 and max(map(len, pieces)) < whole / 5


def test_which_facts_a_choice_of_formats_loads() -> None:
    assert facts_needed([BY_NAME["junit"], BY_NAME["prometheus"]]) is False
    assert facts_needed([BY_NAME["html"], BY_NAME["junit"]]) is matrix_facts
    assert facts_needed([BY_NAME["html"], BY_NAME["json"]]) is True  # all facts hold what html shows


@pytest.mark.parametrize("fixture", sorted(path.stem for path in FIXTURES.glob("*.json")))
def test_the_matrix_of_projected_facts_is_the_matrix_of_whole_ones(fixture: str) -> None:
    facts = load_fixture(fixture)
    node = {"kernel_module_version": "570.124.06"}
    whole = [TargetResult("t1", "n", 1, "ok", facts=facts), TargetResult("t2", "n", 2, "ok", facts=facts,
                                                                         node_facts=node)]
    projected = [TargetResult("t1", "n", 1, "ok", facts=matrix_facts(facts)),
                 TargetResult("t2", "n", 2, "ok", facts=matrix_facts(facts), node_facts=node)]
    assert version_matrix(projected) == version_matrix(whole)
    assert len(json.dumps(matrix_facts(facts))) < len(json.dumps(facts)) / 10


def test_projected_facts_stay_facts_whatever_they_hold() -> None:
    # _stack tells a probed target by non-empty facts: a projection keeps that, and keeps nothing else.
    assert matrix_facts({}) == {}
    assert matrix_facts({"os": {"id": "debian"}}) == {"probed": True}
    assert matrix_facts({"pythons": None, "cuda": None, "gpu": None}) == {
        "pythons": [], "cuda": {"toolkits": []}, "gpu": {"driver_version": None, "names": None}}
    bare = [TargetResult("t", "n", 1, "ok", facts={"os": {"id": "debian"}})]
    assert version_matrix([TargetResult("t", "n", 1, "ok", facts=matrix_facts(bare[0].facts or {}))]) == \
        version_matrix(bare)


def test_a_piece_that_fails_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "report.xml"
    write_atomic(path, iter(["old ", "file\n"]))
    assert path.read_text() == "old file\n" and oct(path.stat().st_mode & 0o777) == "0o600"

    def broken() -> Iterator[str]:
        yield "new half"
        raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError, match="renderer failed"):
        write_atomic(path, broken())
    assert path.read_text() == "old file\n"
    assert os.listdir(tmp_path) == ["report.xml"]  # no temporary file left behind
