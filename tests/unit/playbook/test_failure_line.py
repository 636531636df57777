"""A failed step's one-line reason is the line that says what failed, on outputs real tools printed
(tests/fixtures/failures/README.md says where each was captured), not the output's last line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetfix.playbook.runner import ScriptRun, _why, informative_line

FAILURES = Path(__file__).resolve().parents[2] / "fixtures" / "failures"


def captured(name: str) -> tuple[str, str]:
    """(stderr, stdout) of a captured case, as a step's ScriptRun holds them."""
    return ((FAILURES / f"{name}.stderr").read_text(), (FAILURES / f"{name}.stdout").read_text())


def last_line(stderr: str, stdout: str) -> str:
    return (stderr.strip() or stdout.strip()).splitlines()[-1].strip()


NO_DIST = "fleetfix-no-such-dist"
NO_PACKAGE = "fleetfix-no-such-package"


@pytest.mark.parametrize(("name", "line"), [
    ("pip-pep668-debian12", "error: externally-managed-environment"),
    ("pip-no-matching-distribution",
     f"ERROR: Could not find a version that satisfies the requirement {NO_DIST} (from versions: none)"),
    ("gcc-undeclared",  # gcc quotes with U+2018/U+2019
     "broken.c:1:25: error: \u2018undefined_name\u2019 undeclared (first use in this function)"),
    ("nvcc-undefined", 'broken.cu(1): error: identifier "undefined_name" is undefined'),
])
def test_the_error_line_is_chosen_where_it_is_not_the_last_line(name: str, line: str) -> None:
    stderr, stdout = captured(name)
    assert last_line(stderr, stdout) != line  # the old choice, the output's last line, was not it
    assert informative_line(stderr, stdout) == line


@pytest.mark.parametrize(("name", "line"), [
    ("apt-get-unable-to-locate-debian12", f"E: Unable to locate package {NO_PACKAGE}"),
    ("apt-get-unable-to-locate-debian13", f"E: Unable to locate package {NO_PACKAGE}"),
    ("apt-unable-to-locate-debian13", f"Error: Unable to locate package {NO_PACKAGE}"),
    ("dpkg-missing-archive-debian12",
     "dpkg: error: cannot access archive '/root/fleetfix-missing.deb': No such file or directory"),
    ("python-traceback-debian12", "json.decoder.JSONDecodeError: Expecting property name enclosed in double "
                                  "quotes: line 1 column 2 (char 1)"),
])
def test_where_the_last_line_was_the_error_it_still_is(name: str, line: str) -> None:
    stderr, stdout = captured(name)
    assert last_line(stderr, stdout) == line == informative_line(stderr, stdout)


def test_the_recaps_reason_for_pips_pep_668_refusal() -> None:
    stderr, stdout = captured("pip-pep668-debian12")
    run = ScriptRun("apply", 1, "python3 -m pip install fleetfix-x", rc=1, stdout=stdout, stderr=stderr,
                    duration=0.4)
    assert _why(run) == "exit 1: error: externally-managed-environment"


def test_dpkgs_own_error_is_preferred_to_apts_summary_of_it() -> None:
    """apt-get installing a package whose postinst fails: stderr holds only apt's `E: Sub-process
    /usr/bin/dpkg returned an error code (1)`, dpkg's line naming the package is on stdout."""
    stderr, stdout = captured("apt-get-postinst-fails-debian12")
    assert stderr.strip() == "E: Sub-process /usr/bin/dpkg returned an error code (1)"
    assert informative_line(stderr, stdout) == "dpkg: error processing package fleetfix-broken (--configure):"


def test_a_pip_build_shows_the_exception_of_the_traceback_it_wraps() -> None:
    traceback = "".join(captured("python-traceback-debian12")[0].splitlines(keepends=True))
    stderr = ("  error: subprocess-exited-with-error\n" + traceback
              + "error: metadata-generation-failed\nhint: See above for details.\n")
    assert informative_line(stderr).startswith("json.decoder.JSONDecodeError: Expecting property name")


def test_without_an_error_line_it_is_the_last_non_empty_line_stderr_first() -> None:
    assert informative_line("first\nsecond\n\n", "from stdout\n") == "second"
    assert informative_line("  \n", "one\ntwo\n") == "two"
    assert informative_line("", "") == ""
    # A line naming an error class without a traceback is no traceback's exception.
    assert informative_line("ValueError: looked like one\nthe end\n") == "the end"


def test_a_script_that_says_the_error_again_with_its_context_is_preferred() -> None:
    """cuda-toolkit.yaml's lock wait ends with its own line quoting dpkg's: that line says more."""
    dpkg = "dpkg: error: dpkg frontend lock was locked by another process with pid 105"
    stderr = (f"{dpkg}\nNote: removing the lock file is always wrong\n"
              f"gave up after 5s (apt_lock_timeout): {dpkg}\n")
    assert informative_line(stderr) == f"gave up after 5s (apt_lock_timeout): {dpkg}"
    # The quote must contain the whole error line: a mere mention does not win.
    located = "E: Unable to locate package x"
    assert informative_line(f"{located}\nsee E: above\n") == located
