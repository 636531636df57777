"""What a probe imports before its first script goes out, and importing ahead (fleetfix.importahead).

The facts models (pydantic) and the rules are loaded while the first scripts run, not before they are sent;
rich only for a progress bar that can show (issue 21: one target's start-up was most of its time)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fleetfix.importahead import import_ahead


def _loaded_after(code: str) -> set[str]:
    """The top-level packages loaded in a fresh interpreter after running code."""
    listing = "import sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    program = textwrap.dedent(code) + "\n" + listing
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_probe_runner_loads_neither_pydantic_nor_rich() -> None:
    loaded = _loaded_after("import fleetfix.probe.run, fleetfix.cli.probe, fleetfix.cli.progress")
    assert "fleetfix" in loaded  # the check sees what was imported
    assert "pydantic" not in loaded and "rich" not in loaded


def test_the_probe_packages_names_load_on_first_use() -> None:
    loaded = _loaded_after("import fleetfix.probe as p\nassert p.parse_facts and p.Severity.ERROR == 'error'")
    assert "pydantic" in loaded
    import fleetfix.probe

    with pytest.raises(AttributeError, match="no_such_name"):
        fleetfix.probe.no_such_name  # noqa: B018 - the lookup is the test


def test_a_progress_bar_that_cannot_show_loads_no_rich() -> None:
    code = """
    from fleetfix.cli.progress import ProbeProgress
    with ProbeProgress(1, enabled=True), ProbeProgress(5, enabled=False):
        pass
    """
    assert "rich" not in _loaded_after(code)
    two_targets = code.replace("ProbeProgress(1, enabled=True)", "ProbeProgress(2, enabled=True)")
    assert "rich" in _loaded_after(two_targets)


def test_import_ahead_loads_the_modules_and_leaves_a_failing_one_to_its_user() -> None:
    code = """
    from fleetfix.importahead import import_ahead
    import_ahead("fleetfix.no_such_module", "json.tool").join(timeout=30)
    import sys
    assert "json.tool" in sys.modules
    """
    assert "json" in _loaded_after(code)
    import_ahead("fleetfix.no_such_module").join(timeout=30)
    with pytest.raises(ModuleNotFoundError):
        import fleetfix.no_such_module  # type: ignore[import-not-found]  # noqa: F401
