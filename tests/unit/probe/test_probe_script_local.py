"""The real probe.sh on THIS machine, under real shells, the way a transport runs it (script on stdin)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from probe_testkit import PCT_PATH, FakeBin, probe_facts, run_probe

from fleetfix.probe import build_probe_script, parse_facts
from fleetfix.probe.facts import version_tuple
from fleetfix.probe.script import probe_script_body

REAL_NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]
needs_real_nvcc = pytest.mark.skipif(not REAL_NVCC.exists(), reason="no /usr/local/cuda-13.0 here")


@needs_real_nvcc
@pytest.mark.parametrize("shell", SHELLS)
def test_reports_the_real_cuda_13_toolkit(shell: str) -> None:
    done = run_probe(build_probe_script(), shell=shell)
    assert done.returncode == 0
    assert done.stderr == ""
    facts = parse_facts(done.stdout)
    toolkit = facts.cuda.toolkit_at("/usr/local/cuda-13.0")
    assert toolkit is not None
    assert (toolkit.version, toolkit.nvcc) == ("13.0", str(REAL_NVCC))
    assert toolkit.release is not None and toolkit.release.startswith("V13.0.")
    assert facts.cuda.default_link == "/usr/local/cuda-13.0"


def test_one_json_document_and_real_os_facts() -> None:
    done = run_probe(build_probe_script())
    assert done.stdout.count("\n") == 1     # exactly one line: one document
    data = json.loads(done.stdout)
    os_release = dict(
        line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
    )
    assert data["os"]["id"] == os_release["ID"].strip('"')
    assert data["os"]["version_id"] == os_release["VERSION_ID"].strip('"')
    assert data["build"]["cpus"] >= 1
    assert data["build"]["disk_free_mb"]["/"] > 0
    # The C library and the versioned g++ this machine really has.
    assert data["build"]["glibc"] == os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    installed = sorted(int(p.name[4:]) for p in Path("/usr/bin").glob("g++-*") if p.name[4:].isdigit())
    assert sorted(data["build"]["gxx_majors"]) == installed


def test_glibc_from_getconf_else_ldd(fakebin: FakeBin) -> None:
    fakebin.script("getconf", 'echo "glibc 2.41"\n')
    assert probe_facts(build_probe_script(), path=str(fakebin.path), hermetic=True).build.glibc == "2.41"
    fakebin.script("getconf", "exit 1\n")
    fakebin.script("ldd", 'echo "ldd (Debian GLIBC 2.42-1) 2.42"; echo "Copyright"\n')
    assert probe_facts(build_probe_script(), path=str(fakebin.path), hermetic=True).build.glibc == "2.42"
    fakebin.script("ldd", 'echo "musl libc (x86_64)" >&2; exit 1\n')   # musl: no glibc
    assert probe_facts(build_probe_script(), path=str(fakebin.path), hermetic=True).build.glibc is None


@needs_real_nvcc
def test_works_with_pcts_forced_path() -> None:
    facts = probe_facts(build_probe_script(), path=PCT_PATH)
    # Found by its full path even though /usr/local/cuda-13.0/bin is not on pct's PATH...
    assert [t.version for t in facts.cuda.toolkits] == ["13.0"]
    # ...while "nvcc on PATH" honestly reports what that PATH finds.
    assert facts.cuda.nvcc_on_path is None
    assert facts.pythons[0].found and facts.pythons[0].executable is not None


def test_python_less_target_still_gives_valid_json(fakebin: FakeBin) -> None:
    assert not list(fakebin.path.glob("python*"))
    facts = probe_facts(build_probe_script(discover=False), path=str(fakebin.path), hermetic=True)
    assert [(p.interpreter, p.found) for p in facts.pythons] == [("python3", False)]
    assert facts.torch is None
    assert facts.os.id is not None      # everything else is still gathered by sh alone
    assert facts.dpkg.present is False  # no dpkg on that PATH: a fact, not an error


def test_missing_interpreter_is_a_fact_and_others_still_run() -> None:
    script = build_probe_script(["/nonexistent/python3", "python3"], discover=False)
    facts = probe_facts(script, path=PCT_PATH)
    assert [(p.interpreter, p.found) for p in facts.pythons] == [
        ("/nonexistent/python3", False), ("python3", True)]


def test_hostile_interpreter_names_are_data_not_code(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    hostile = [f"py'; touch {canary}; '", f"$(touch {canary})", f"`touch {canary}`", 'a"b\\c']
    facts = probe_facts(build_probe_script(hostile, discover=False))
    assert [p.interpreter for p in facts.pythons] == hostile
    assert not any(p.found for p in facts.pythons)
    assert not canary.exists()


def test_empty_pinned_python_list_means_none_inspected() -> None:
    assert probe_facts(build_probe_script([], discover=False)).pythons == []


def test_unparameterised_body_defaults_to_python3_and_discovery() -> None:
    facts = probe_facts(probe_script_body(), path=PCT_PATH)
    assert facts.pythons[0].interpreter == "python3" and facts.pythons[0].discovered is None
    assert all(p.discovered for p in facts.pythons[1:])   # whatever discovery found here, tagged


REAL_TORCH_VENV = Path("/opt/fleetfix-torch-2.14.1")


@pytest.mark.skipif(not (REAL_TORCH_VENV / "bin/python3").exists(), reason="no real torch venv here")
def test_the_real_torch_venv_is_discovered_and_inspected_in_full() -> None:
    # The real torch 2.14.1 cu130 wheel in a venv nobody named: before, a note that it was not inspected;
    # now the same facts a named interpreter gets (its torch read by the interpreter itself).
    facts = probe_facts(build_probe_script(["python3"]), path=PCT_PATH)
    env = next(p for p in facts.pythons if p.interpreter == f"{REAL_TORCH_VENV}/bin/python3")
    assert env.discovered == "venv" and env.found and env.error is None
    assert env.torch is not None and env.torch.version is not None
    assert env.torch.version.startswith("2.14.1") and env.torch.cuda == "13.0"
    assert env.prefix == str(REAL_TORCH_VENV) and env.python_tag is not None
    [found] = [d for d in facts.discovered_pythons if d.prefix == str(REAL_TORCH_VENV)]
    assert found.inspected is True
    pinned = probe_facts(build_probe_script(["python3"], discover=False), path=PCT_PATH)
    assert [p.interpreter for p in pinned.pythons] == ["python3"] and pinned.discovered_pythons == []


def test_children_cannot_eat_the_script_from_stdin(fakebin: FakeBin) -> None:
    # sh -s reads the script from the same pipe children would inherit; a greedy child (here a
    # fake nvidia-smi) must not swallow the rest of it.
    fakebin.script("nvidia-smi", "cat >/dev/null\necho '570.124.06, NVIDIA H200, 9.0'\n")
    facts = probe_facts(build_probe_script([]), path=str(fakebin.path), hermetic=True)
    assert facts.gpu.driver_version == "570.124.06"
    assert facts.build.cpus is not None   # gathered after the greedy child ran


def test_leaves_no_files_behind(tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    done = run_probe(build_probe_script(), env={"HOME": str(work), "TMPDIR": str(work)})
    assert done.returncode == 0
    assert list(work.iterdir()) == []


DEBIAN_PYTHON = Path("/usr/bin/python3")


def debian_python_is_marked() -> bool:
    done = subprocess.run([str(DEBIAN_PYTHON), "-c", "import os, sysconfig; print(os.path.isfile("
                           "os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() == "True"


needs_marked_python = pytest.mark.skipif(not (DEBIAN_PYTHON.exists() and debian_python_is_marked()),
                                         reason="needs Debian 12+'s python3 (its stdlib is marked)")


def pip_refuses(env: dict[str, str]) -> bool:
    """Real pip's answer: does `pip install` into Debian's python3 stop at PEP 668 under this env?"""
    done = subprocess.run([str(DEBIAN_PYTHON), "-m", "pip", "install", "--dry-run", "--no-index",
                           "fleetfix-no-such-distribution"], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", **env}, timeout=120)
    return "externally-managed-environment" in done.stdout + done.stderr


@needs_marked_python
def test_pep668_facts_of_debians_python_agree_with_real_pip(tmp_path: Path) -> None:
    # A torch that pip put into the system site (INSTALLER: pip), seen through PYTHONPATH.
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")
    (site / "torch-2.14.1.dist-info").mkdir()
    (site / "torch-2.14.1.dist-info" / "INSTALLER").write_text("pip\n")
    cases: list[tuple[dict[str, str], str | None]] = [
        ({}, None),
        ({"PIP_BREAK_SYSTEM_PACKAGES": "1"}, "PIP_BREAK_SYSTEM_PACKAGES"),
        ({"PIP_BREAK_SYSTEM_PACKAGES": "0"}, None),
    ]
    for name, text, says in (("global", "[global]\nbreak-system-packages = true\n", True),
                             ("install-no", "[global]\nbreak-system-packages = yes\n"
                                            "[install]\nbreak-system-packages = no\n", False),
                             ("install", "[install]\nbreak_system_packages = on\n", True),
                             ("colon", "[global]\n# break-system-packages = false\n; x\n"
                                       "Break_System_Packages: yes\n", True),
                             ("empty", "[global]\nbreak-system-packages = true\n"
                                       "[install]\nbreak-system-packages =\n", True),
                             ("other", "[freeze]\nbreak-system-packages = true\n", False)):
        conf = tmp_path / f"{name}.conf"
        conf.write_text(text)
        cases.append(({"PIP_CONFIG_FILE": str(conf)}, str(conf) if says else None))
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\nbreak-system-packages = true\n")
    cases.append(({"HOME": str(home)}, f"{home}/.config/pip/pip.conf"))
    for env, source in cases:
        env = {"HOME": str(tmp_path), "PYTHONPATH": str(site), **env}
        facts = probe_facts(build_probe_script([str(DEBIAN_PYTHON)], discover=False), env=env)
        [python] = facts.pythons
        assert python.externally_managed is True and python.torch_installer == "pip", python
        assert (version_tuple(python.pip_version) or ()) >= (23, 0, 1)   # Debian 12 ships 23.0.1
        assert python.pip_break_system_packages == source, env
        assert pip_refuses(env) == (source is None), env


def test_pep668_facts_of_a_venv_and_of_a_distribution_torch(tmp_path: Path) -> None:
    # A venv is never externally managed (PEP 668's exemption); a torch without INSTALLER has None.
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch-2.14.1.dist-info").mkdir()
    venv = tmp_path / "venv"
    base = str(DEBIAN_PYTHON) if DEBIAN_PYTHON.exists() else "python3"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    facts = probe_facts(build_probe_script([str(venv / "bin" / "python3")], discover=False),
                        env={"PYTHONPATH": str(site)})
    [python] = facts.pythons
    assert python.virtualenv is True and python.externally_managed is False
    assert python.torch is not None and python.torch_installer is None
