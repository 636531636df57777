"""benchmarks/instructions.py's parts that run without valgrind: reading callgrind's count, the module lists,
and the scripts that record and replay what `fleetfix probe` imports. The counting itself, under valgrind on
the test bed: tests/e2e/test_benchmark_smoke.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fleet_probe import REPO, _python_env
from benchmarks.instructions import IMPORTER, RECORDER, collected, split_modules

LOG = """\
==4242== Callgrind, a call-graph generating cache profiler
==4242== Command: python -c pass
==4242==
==4242== Events    : Ir
==4242== Collected : 89201345
==4242==
==4242== I   refs:      89,201,345
"""


def test_the_count_is_read_from_callgrinds_log() -> None:
    assert collected(LOG) == 89_201_345


@pytest.mark.parametrize("log", ["", LOG + LOG.replace("4242", "4243")], ids=["none", "two processes"])
def test_a_log_without_exactly_one_count_is_refused(log: str) -> None:
    with pytest.raises(ValueError, match="one 'Collected' line"):
        collected(log)


def test_fleetfix_modules_come_last_and_the_command_itself_never() -> None:
    loaded = ["sys", "__main__", "fleetfix", "json", "fleetfix.cli", "fleetfix.__main__", "paramiko",
              "fleetfix.probe.facts"]
    others, every = split_modules(loaded)
    assert others == ["sys", "json", "paramiko"]
    assert every == ["sys", "json", "paramiko", "fleetfix", "fleetfix.cli", "fleetfix.probe.facts"]


def _run(code: str, *args: str, cwd: Path) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=_python_env(), check=True,
                          capture_output=True, text=True, timeout=120).stdout


def test_the_recorder_lists_what_the_command_loaded_in_order(tmp_path: Path) -> None:
    record = tmp_path / "loaded.json"
    _run(RECORDER, str(record), "probe", "--help", cwd=tmp_path)
    loaded = json.loads(record.read_text())
    assert loaded.index("click") < loaded.index("fleetfix.cli.probe")
    assert "fleetfix.probe.facts" not in loaded  # --help loads no models


def test_the_importer_loads_the_list_and_nothing_the_command_went_without(tmp_path: Path) -> None:
    names, had = tmp_path / "names.json", tmp_path / "had.json"
    names.write_text(json.dumps(["colorsys", "wave"]))
    had.write_text(json.dumps(["colorsys"]))  # the command never loaded wave: it stays out
    shown = _run(IMPORTER + "print(sorted({'colorsys', 'wave'} & set(sys.modules)))", str(names), str(had),
                 cwd=tmp_path)
    assert shown.strip() == "['colorsys']"


def test_paramiko_replayed_goes_without_invoke_as_fleetfix_has_it(tmp_path: Path) -> None:
    record = tmp_path / "loaded.json"
    _run(RECORDER, str(record), "probe", "--help", cwd=tmp_path)  # loads no paramiko: add it as fleetfix does
    had = json.loads(record.read_text()) + json.loads(_run(
        "import json, sys, fleetfix.transport._paramiko; print(json.dumps(list(sys.modules)))", cwd=REPO))
    assert "paramiko" in had and "invoke" not in had
    (tmp_path / "had.json").write_text(json.dumps(had))
    (tmp_path / "names.json").write_text(json.dumps(["paramiko"]))
    shown = _run(IMPORTER + "print('paramiko' in sys.modules, 'invoke' in sys.modules)", "names.json",
                 "had.json", cwd=tmp_path)
    assert shown.split() == ["True", "False"]
