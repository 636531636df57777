"""build-extensions.yaml and cuda-toolkit-pip.yaml, rendered and run on this machine against stand-ins: a
fake interpreter (answers torch's CUDA, imports from a state dir, records what `pip install` got) and fake
toolkits (an nvcc that prints the real banner). The real builds are in tests/e2e/test_build_extensions.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetfix.playbook.load import load_playbook
from fleetfix.playbook.render import compile_playbook
from fleetfix.playbook.runner import RunContext, TargetPlan, TargetRun, plan_target, run_target
from fleetfix.transport.base import Transport
from tests.lab.aptrepo import CudaRelease
from tests.unit.playbook.conftest import REPO, SubprocessTransport, make_target

BUILD = REPO / "playbooks" / "build-extensions.yaml"
TOOLKIT_PIP = REPO / "playbooks" / "cuda-toolkit-pip.yaml"
US = "\x1f"

FAKE_PYTHON = """#!/bin/sh
# Stand-in interpreter: torch is CUDA $FAKE_TORCH_CUDA; a module imports once $STATE/built-<module> exists;
# `-m pip wheel` records its argv and environment, then writes a wheel for $FAKE_DIST into -w DIR (a copy
# of $FAKE_WHEEL_FROM, else an empty file);
# `-m pip install WHEEL` "installs" the modules in $FAKE_PROVIDES; `--dry-run --report F` resolves.
# The PEP 668 decision (its code reads EXTERNALLY-MANAGED, and `pip config list`) runs in the real
# interpreter $FAKE_PEP668_PYTHON: this test's own venv (never externally managed), or Debian's python3.
state={state}
case "$1" in
  -c)
    code=$2; shift 2
    case "$code" in
      *torch.version.cuda*) echo "$FAKE_TORCH_CUDA" ;;
      *EXTERNALLY-MANAGED*) exec "$FAKE_PEP668_PYTHON" -c "$code" "$@" ;;
      *sys.prefix*) echo "" ;;
      *import_module*)
        for m in "$@"; do
          [ -e "$state/built-$m" ] || {{ echo "ModuleNotFoundError: No module named '$m'" >&2; exit 1; }}
        done ;;
      *"import setuptools"*) exit 0 ;;
      *metadata*) echo "$FAKE_DIST 1.7.0" ;;
      *) echo "fake python: unexpected -c $code" >&2; exit 2 ;;
    esac ;;
  -m)
    case "$*" in
      *"pip config list"*) exec "$FAKE_PEP668_PYTHON" -m pip config list ;;
      *--dry-run*) printf '%s\\n' "$@" > "$state/pip-dry-run-args" ;;
      *" wheel "*)
        printf '%s\\n' "$@" > "$state/pip-args"
        env > "$state/pip-env"
        if [ -n "${{FAKE_PIP_FAIL:-}}" ]; then echo "nvcc fatal : fake failure" >&2; exit 1; fi
        dir=; prev=
        for a in "$@"; do [ "$prev" = -w ] && dir=$a; prev=$a; done
        out="$dir/$(echo "$FAKE_DIST" | tr - _)-1.7.0-cp311-cp311-linux_x86_64.whl"
        if [ -n "${{FAKE_WHEEL_FROM:-}}" ]; then cp "$FAKE_WHEEL_FROM" "$out"; else : > "$out"; fi
        echo "Successfully built fake" ;;
      *)
        printf '%s\\n' "$@" > "$state/pip-install-args"
        case "$*" in *.whl*) for m in $FAKE_PROVIDES; do : > "$state/built-$m"; done ;; esac
        echo "Successfully installed fake" ;;
    esac ;;
  *) echo "fake python: unexpected $*" >&2; exit 2 ;;
esac
"""


def nvcc_banner(version: str) -> str:
    # The real banner's five lines (the stand-ins' banner code, held to the real nvcc 13.0 and NVIDIA's
    # 12.x ptxas by tests/e2e/test_standin_ground_truth.py), not a shape written here.
    return CudaRelease(version, f"V{version}.88").nvcc_banner()


def fake_toolkit(root: Path, version: str, *, headers: bool = True, libcudart: bool = True) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat <<'EOF'\n{nvcc_banner(version)}EOF\n")
    nvcc.chmod(0o755)
    if headers:
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime_api.h").write_text("/* fake */\n")
    if libcudart:
        (root / "lib64").mkdir()
        (root / "lib64" / "libcudart.so.13").write_text("fake\n")
        (root / "lib64" / "libcudart.so").symlink_to("libcudart.so.13")
    return root


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON.format(state=state))
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_TORCH_CUDA", "13.0")
    monkeypatch.setenv("FAKE_PROVIDES", "causal_conv1d_cuda causal_conv1d")
    monkeypatch.setenv("FAKE_DIST", "causal-conv1d")
    monkeypatch.delenv("FAKE_PIP_FAIL", raising=False)
    monkeypatch.setenv("FAKE_PEP668_PYTHON", sys.executable)
    return python


def plan(path: Path, facts: dict[str, Any], **cli_vars: Any) -> TargetPlan:
    book = load_playbook(path)
    return plan_target([compile_playbook(b) for b in book.chain()], make_target("pve1/101"), facts, cli_vars)


def cu130(facts: dict[str, Any], python: Path | str = "/usr/bin/python3") -> dict[str, Any]:
    facts["torch"] = {"version": "2.14.1+cu130", "cuda": "13.0", "interpreter": str(python),
                      "python_tag": "cp311", "cxx11_abi": True, "libc": "glibc 2.36"}
    return facts


def run_build(facts: dict[str, Any], tmp_path: Path, *, check: bool = False, **cli_vars: Any) -> TargetRun:
    transport: Transport = SubprocessTransport(tmp_path)
    return run_target(plan(BUILD, facts, **cli_vars), transport, RunContext(check_mode=check))


def plan_lines(facts: dict[str, Any], **cli_vars: Any) -> list[list[str]]:
    """SPEC, MODULES, ENV of each line (release_lines: the fourth field, source_lines: the last two)."""
    return [fields[:3] for fields in plan_fields(facts, **cli_vars)]


def plan_fields(facts: dict[str, Any], **cli_vars: Any) -> list[list[str]]:
    text = plan(BUILD, facts, **cli_vars).plays[0].vars["extension_plan"]
    lines = [line.split(US) for line in text.splitlines()]
    assert all(len(fields) == 6 for fields in lines), lines
    return lines


def source_lines(facts: dict[str, Any], **cli_vars: Any) -> list[list[str]]:
    """SOURCE, SOURCE_SHA256 of each line (extension_sources)."""
    return [fields[4:] for fields in plan_fields(facts, **cli_vars)]


def release_lines(facts: dict[str, Any], **cli_vars: Any) -> list[str]:
    return [fields[3] for fields in plan_fields(facts, **cli_vars)]


def sh(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-s"], input=script, text=True, capture_output=True, cwd=cwd,
                          check=False)


# ---------------------------------------------------------------- vars


def test_defaults_come_from_the_facts(facts: dict[str, Any]) -> None:
    found = plan(BUILD, facts).plays[0].vars
    assert found["python"] == "/usr/bin/python3" and found["cuda_xy"] == "12.8"
    assert found["max_jobs"] == "3"          # 8 cpus, 16 GiB: one job per 5 GiB (docs/extensions.md)
    assert found["cuda_arch_list"] == "8.9"  # the L40S
    assert plan_lines(facts) == [["causal-conv1d", "causal_conv1d_cuda causal_conv1d",
                                  "CAUSAL_CONV1D_FORCE_BUILD=TRUE"]]


@pytest.mark.parametrize(("cpus", "mem_mb", "jobs"), [(2, 2048, "1"), (2, 65536, "2"), (64, 32768, "6"),
                                                      (None, None, "1")])
def test_max_jobs_is_bounded_by_cores_and_memory(facts: dict[str, Any], cpus: int | None, mem_mb: int | None,
                                                 jobs: str) -> None:
    facts["build"].update(cpus=cpus, mem_total_mb=mem_mb)
    assert plan(BUILD, facts).plays[0].vars["max_jobs"] == jobs


def test_extension_entries_from_the_command_line(facts: dict[str, Any]) -> None:
    facts["gpu"]["compute_caps"] = ["8.0", "9.0", "9.0"]
    given = "causal_conv1d==1.7.0, flash-attn MAMBA_SSM /src/tiny=tiny_cuda+tiny"
    lines = plan_lines(facts, extensions=given)
    assert lines == [
        ["causal_conv1d==1.7.0", "causal_conv1d_cuda causal_conv1d", "CAUSAL_CONV1D_FORCE_BUILD=TRUE"],
        ["flash-attn", "flash_attn_2_cuda flash_attn",
         "FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=80;90 MAX_JOBS=1"],
        ["mamba-ssm", "selective_scan_cuda mamba_ssm", "MAMBA_FORCE_BUILD=TRUE MAMBA_KEEP_CUDA_BUILD=TRUE"],
        ["/src/tiny", "tiny_cuda tiny", ""],
    ]


def test_release_wheel_templates_come_from_the_catalog(facts: dict[str, Any]) -> None:
    given = "causal-conv1d==1.6.1 flash-attn mamba-ssm /src/tiny=tiny_cuda"
    assert release_lines(facts, extensions=given) == [
        "https://github.com/Dao-AILab/causal-conv1d/releases/download/v{version}/causal_conv1d-{version}"
        "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl",
        "https://github.com/Dao-AILab/flash-attention/releases/download/v{version}/flash_attn-{version}"
        "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl",
        "https://github.com/state-spaces/mamba/releases/download/v{version}/mamba_ssm-{version}"
        "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl",
        "",  # a custom SPEC=MODULE entry has no upstream
    ]
    mirrored = release_lines(facts, release_wheels_url="http://127.0.0.1:8080/gh/")
    assert mirrored[0].startswith("http://127.0.0.1:8080/gh/Dao-AILab/causal-conv1d/releases/download/")
    for off in (False, "false", "no", "0"):  # --var gives a string
        assert release_lines(facts, extensions=given, upstream_wheels=off) == ["", "", "", ""]


def test_extension_sources_name_each_items_sdist_by_its_entry_spec_or_catalog_name(
        facts: dict[str, Any]) -> None:
    given = "causal-conv1d mamba_ssm /src/tiny=tiny_cuda flash-attn"
    pin = "a" * 64
    sources = {"causal-conv1d": {"url": "https://example.test/causal_conv1d-1.6.1.tar.gz", "sha256": pin},
               "/src/tiny": "file:///srv/sdists/tiny-0.1.tar.gz",  # a custom entry: by its SPEC
               "mamba-ssm": {"url": "/srv/sdists/mamba_ssm-2.2.4.tar.gz"}}  # by the catalog's name
    assert source_lines(facts, extensions=given, extension_sources=sources) == [
        ["https://example.test/causal_conv1d-1.6.1.tar.gz", pin],
        ["/srv/sdists/mamba_ssm-2.2.4.tar.gz", ""],
        ["file:///srv/sdists/tiny-0.1.tar.gz", ""],
        ["", ""],  # none named: the target's pip fetches it, as before
    ]
    assert source_lines(facts, extensions=given) == [["", ""]] * 4


def test_probe_fix_vars_are_accepted(facts: dict[str, Any]) -> None:
    # EXTENSION_MISSING's fix: module spelling, a list, the interpreter and torch's CUDA.
    lines = plan_lines(facts, extensions=["causal_conv1d"], python="/opt/venv/bin/python",
                       cuda_version="12.8")
    assert lines[0][:2] == ["causal-conv1d", "causal_conv1d_cuda causal_conv1d"]


def test_unknown_extension_is_refused_and_values_stay_data(facts: dict[str, Any], tmp_path: Path) -> None:
    hostile = "/tmp/x`touch${IFS}PWNED`;$(touch${IFS}PWNED)=m"
    planned = plan(BUILD, facts, extensions=f"causal-conv1d,left-pad,{hostile}")
    check = planned.plays[0].steps[0].rendered
    assert check is not None and check.check is not None
    done = sh(check.check, tmp_path)
    assert done.returncode == 1
    assert "unknown extension(s): left-pad:" in done.stderr and "SPEC=MODULE" in done.stderr
    assert not (tmp_path / "PWNED").exists()


# ---------------------------------------------------------------- toolkit assertion


def test_major_mismatch_is_refused_with_the_finding(facts: dict[str, Any], fake_python: Path,
                                                    tmp_path: Path) -> None:
    home = fake_toolkit(tmp_path / "cuda-12.8", "12.8")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    failed = [s for s in run.steps if s.status == "failed"]
    assert [s.name for s in failed] == ["toolkit matches torch"]
    assert "CUDA_TOOLKIT_MAJOR_MISMATCH: " in failed[0].reason
    assert "CUDA 12.8 but torch was built with CUDA 13.0" in failed[0].reason
    assert "run playbooks/cuda-toolkit.yaml first" in failed[0].reason
    assert [s.name for s in run.steps][-1] == "toolkit matches torch"   # nothing after it ran
    assert not (fake_python.parent.parent / "state" / "pip-args").exists()


def test_toolkit_without_cudart_dev_is_refused(facts: dict[str, Any], fake_python: Path,
                                               tmp_path: Path) -> None:
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0", libcudart=False)
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "failed"
    assert "no lib64/libcudart.so" in run.steps[-1].reason


# ---------------------------------------------------------------- the host compiler


def host_config(home: Path, newest_gcc: int) -> None:
    """crt/host_config.h's version check, as NVIDIA's headers spell it (nvidia-cuda-crt 13.0.88 line 135)."""
    (home / "include" / "crt").mkdir(parents=True, exist_ok=True)
    (home / "include" / "crt" / "host_config.h").write_text(
        f"#if __GNUC__ > {newest_gcc}\n\n#error -- unsupported GNU version! gcc versions later than "
        f"{newest_gcc} are not supported!\n\n#endif /* __GNUC__ > {newest_gcc} */\n")


def default_gxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """A default g++ of another version first on PATH (the versioned /usr/bin/g++-N stay real)."""
    bindir = tmp_path / "default-gxx"
    bindir.mkdir()
    (bindir / "g++").write_text(f"#!/bin/sh\necho {version}\n")
    (bindir / "g++").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")


@pytest.mark.skipif(not Path("/usr/bin/g++-12").exists(), reason="needs /usr/bin/g++-12 (Debian 12's g++)")
def test_a_default_gxx_the_toolkit_refuses_builds_with_an_installed_gxx_n(
        facts: dict[str, Any], fake_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # g++ 14 by default, a toolkit that takes gcc <= 12: torch would refuse g++ 14 before nvcc runs, so
    # the build gets CC/CXX pointing at the installed g++-12 (what torch and nvcc both obey).
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    host_config(home, 12)
    default_gxx(tmp_path, monkeypatch, "14.2.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "changed", [(s.name, s.status, s.reason, s.stderr) for s in run.steps]
    compiler = next(s for s in run.steps if s.name == "host compiler accepted")
    assert "building with g++-12" in compiler.stdout
    state = fake_python.parent.parent / "state"
    env = dict(line.split("=", 1) for line in (state / "pip-env").read_text().splitlines() if "=" in line)
    assert (env["CC"], env["CXX"]) == ("/usr/bin/gcc-12", "/usr/bin/g++-12")


def test_no_accepted_gxx_is_refused_before_building(facts: dict[str, Any], fake_python: Path,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    host_config(home, 9)   # no g++-9 or older is installed on any machine this runs on
    default_gxx(tmp_path, monkeypatch, "14.2.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "failed"
    assert run.steps[-1].name == "host compiler accepted"
    assert "HOST_COMPILER_TOO_NEW" in run.steps[-1].reason and "install g++-9" in run.steps[-1].reason
    assert not (fake_python.parent.parent / "state" / "pip-args").exists()   # pip never ran


def test_the_real_cuda_13_0_header_accepts_this_gxx(facts: dict[str, Any], fake_python: Path,
                                                    tmp_path: Path) -> None:
    real = Path("/usr/local/cuda-13.0/include/crt/host_config.h")
    if not real.exists():
        pytest.skip("no /usr/local/cuda-13.0 here")
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    (home / "include" / "crt").mkdir()
    (home / "include" / "crt" / "host_config.h").symlink_to(real)
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    compiler = next(s for s in run.steps if s.name == "host compiler accepted")
    assert compiler.status == "ok" and "accepts gcc <= 15" in compiler.stdout


# ---------------------------------------------------------------- the build step


def test_build_sets_cuda_home_jobs_arch_and_switches(facts: dict[str, Any], fake_python: Path,
                                                     tmp_path: Path) -> None:
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home),
                    pip_args="--no-index --find-links /srv/wheels")
    assert run.status == "changed", [(s.name, s.status, s.reason, s.stderr) for s in run.steps]
    assert [s.status for s in run.steps] == ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "changed"]
    state = fake_python.parent.parent / "state"
    env = dict(line.split("=", 1) for line in (state / "pip-env").read_text().splitlines() if "=" in line)
    assert env["CUDA_HOME"] == str(home) and env["PATH"].startswith(f"{home}/bin:{fake_python.parent}:")
    assert env["MAX_JOBS"] == "3" and env["TORCH_CUDA_ARCH_LIST"] == "8.9"
    assert env["CAUSAL_CONV1D_FORCE_BUILD"] == "TRUE"
    argv = (state / "pip-args").read_text().split()
    assert argv[:3] == ["-m", "pip", "wheel"]
    assert "--no-build-isolation" in argv and "--no-cache-dir" in argv and "--no-deps" in argv
    assert argv[-4:] == ["--no-index", "--find-links", "/srv/wheels", "causal-conv1d"]
    assert (state / "pip-dry-run-args").read_text().split()[-1] == "causal-conv1d"  # describe resolved it
    installed = (state / "pip-install-args").read_text().split()
    assert installed[:6] == ["-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall"]
    assert installed[-1].endswith("/causal_conv1d-1.7.0-cp311-cp311-linux_x86_64.whl")
    # No wheel cache given to run_target: built as before, and said so.
    assert run.steps[-1].reason.startswith("causal-conv1d 1.7.0: built in")
    assert "not cached (no wheel cache)" in run.steps[-1].reason

    again = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert again.status == "ok"


def test_the_cache_key_of_an_extension(facts: dict[str, Any], fake_python: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetfix.guests.node import NodeGuest
    from fleetfix.playbook.wheels import WheelOptions
    from fleetfix.transport.local import LocalTransport
    from fleetfix.wheels.cache import WheelCache
    from tests.lab.releases import make_wheel

    # What the cache keeps is a compiled extension: an x86_64 ELF header stands in for the module.
    so = b"\x7fELF\x02\x01\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(44)
    wheel = tmp_path / "built.whl"
    wheel.write_bytes(make_wheel("causal_conv1d", "1.7.0", "cp311-cp311-linux_x86_64",
                                 {"causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": so}))
    monkeypatch.setenv("FAKE_WHEEL_FROM", str(wheel))

    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    cache = WheelCache(tmp_path / "cache")
    planned = plan(BUILD, cu130(facts, fake_python), cuda_home=str(home))
    context = RunContext(wheels=WheelOptions(cache),
                         guest_for=lambda target: NodeGuest(target, LocalTransport()))
    run = run_target(planned, SubprocessTransport(tmp_path), context)
    assert run.status == "changed", run.steps[-1].reason
    (entry,) = cache.entries()
    assert entry.key == {
        "name": "causal-conv1d", "version": "1.7.0", "python_tag": "cp311", "torch": "2.14.1+cu130",
        "torch_cuda": "13.0", "cxx11_abi": "1", "cuda_toolkit": "13.0", "arch_list": "8.9",
        "build_env": "CAUSAL_CONV1D_FORCE_BUILD=TRUE", "machine": "x86_64", "libc": "glibc 2.36"}
    assert entry.built_on == "pve1/101" and entry.wheel == "causal_conv1d-1.7.0-cp311-cp311-linux_x86_64.whl"
    assert "cached as causal-conv1d-1.7.0-" in run.steps[-1].reason


def test_a_pure_python_install_fails_verification(facts: dict[str, Any], fake_python: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # pip "succeeds" but only the python package appears (the SKIP_CUDA_BUILD trap, DOMAIN.md 3.1).
    monkeypatch.setenv("FAKE_PROVIDES", "causal_conv1d")
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "failed" and run.steps[-1].name == "extensions built"
    assert "causal_conv1d_cuda" in run.steps[-1].stdout + run.steps[-1].reason


def test_failed_build_names_the_extension(facts: dict[str, Any], fake_python: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_PIP_FAIL", "1")
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "failed"
    assert run.steps[-1].reason.startswith("causal-conv1d: build failed: exit 1")
    assert "nvcc fatal : fake failure" in run.steps[-1].stderr   # the build log is kept


def test_check_mode_builds_nothing(facts: dict[str, Any], fake_python: Path, tmp_path: Path) -> None:
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    run = run_build(cu130(facts, fake_python), tmp_path, check=True, cuda_home=str(home))
    assert run.status == "would-change" and run.steps[-1].status == "would-change"
    assert not (fake_python.parent.parent / "state" / "pip-args").exists()


# ---------------------------------------------------------------- PEP 668: an externally managed python

DEBIAN_PYTHON = "/usr/bin/python3"
PEP668_STEP = "pip may install into the env"


def debian_python_is_marked() -> bool:
    done = subprocess.run([DEBIAN_PYTHON, "-c", "import os, sys, sysconfig; sys.exit(0 if os.path.isfile("
                           "os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')) else 1)"],
                          check=False)
    return done.returncode == 0


needs_marked_python = pytest.mark.skipif(
    not (os.path.exists(DEBIAN_PYTHON) and debian_python_is_marked()),
    reason="needs Debian 12+'s system python3, whose stdlib holds EXTERNALLY-MANAGED")


def torch_site(root: Path, installer: str | None) -> Path:
    """A site directory with a torch package and its .dist-info, INSTALLER as given (None: no file, as
    Debian's own packages have none: /usr/lib/python3/dist-packages/*.dist-info on Debian 12)."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    info = root / "torch-2.14.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n")
    if installer is not None:
        (info / "INSTALLER").write_text(installer + "\n")
    return root


def pep668_check(facts: dict[str, Any], tmp_path: Path, installer: str | None, *, python: str = DEBIAN_PYTHON,
                 env: dict[str, str] | None = None, **cli_vars: Any) -> subprocess.CompletedProcess[str]:
    """The decision step's check, rendered and run with the real interpreter (it installs nothing)."""
    planned = plan(BUILD, facts, python=python, **cli_vars)
    step = next(p for p in planned.plays[0].steps if p.compiled.step.name == PEP668_STEP)
    assert step.rendered is not None and step.rendered.check is not None
    site = torch_site(tmp_path / f"site-{installer}", installer)
    clean = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(site),
             "PIP_CONFIG_FILE": os.devnull, **(env or {})}
    return subprocess.run(["/bin/sh", "-s"], input=step.rendered.check, text=True, capture_output=True,
                          cwd=tmp_path, env=clean, check=False)


@needs_marked_python
def test_torch_installed_by_pip_into_a_marked_python_is_built_with_break_system_packages(
        facts: dict[str, Any], tmp_path: Path) -> None:
    done = pep668_check(facts, tmp_path, "pip")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "PIP_INSTALL_FLAGS=--break-system-packages"
    assert "is externally managed (PEP 668, /usr/lib/python3." in lines[-1]
    assert lines[-1].endswith("torch was installed there by pip, so this build does the same: "
                              "--break-system-packages")


@needs_marked_python
@pytest.mark.parametrize(("installer", "choice"), [(None, "auto"), ("conda", "auto"), ("pip", "false")])
def test_torch_not_installed_by_pip_into_a_marked_python_is_refused_with_the_venv_route(
        facts: dict[str, Any], tmp_path: Path, installer: str | None, choice: str) -> None:
    done = pep668_check(facts, tmp_path, installer, break_system_packages=choice)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"EXTERNALLY_MANAGED: {DEBIAN_PYTHON} is externally managed (PEP 668")
    assert "nothing was changed" in done.stderr
    assert f"{DEBIAN_PYTHON} -m venv --system-site-packages /opt/torch-venv" in done.stderr
    assert "--var python=/opt/torch-venv/bin/python" in done.stderr
    said = "no INSTALLER (a distribution package)" if installer is None else f"its INSTALLER says {installer}"
    assert said in done.stderr


@needs_marked_python
def test_break_system_packages_true_and_pips_own_configuration_are_honoured(
        facts: dict[str, Any], tmp_path: Path) -> None:
    forced = pep668_check(facts, tmp_path, None, break_system_packages="true")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[0] == "PIP_INSTALL_FLAGS=--break-system-packages"
    assert "break_system_packages=true (torch there: installer not recorded)" in forced.stdout
    # What the team configured pip with (read back through the real pip's `pip config list`): pip will
    # not refuse, so no flag is added and the step says why.
    conf = tmp_path / "pip.conf"
    conf.write_text("[install]\nbreak-system-packages = true\n")
    for name, env in (("var", {"PIP_BREAK_SYSTEM_PACKAGES": "1"}), ("file", {"PIP_CONFIG_FILE": str(conf)})):
        done = pep668_check(facts, tmp_path / name, None, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == "PIP_INSTALL_FLAGS="
        assert "pip is configured to install there anyway" in done.stdout
    # ... unless it says false: [install] overrides [global] in pip, and so here.
    conf.write_text("[global]\nbreak-system-packages = true\n[install]\nbreak-system-packages = no\n")
    done = pep668_check(facts, tmp_path / "no", None, env={"PIP_CONFIG_FILE": str(conf)})
    assert done.returncode == 1 and "EXTERNALLY_MANAGED:" in done.stderr


def test_a_venv_is_never_externally_managed_and_a_bad_choice_is_refused(facts: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    done = pep668_check(facts, tmp_path, None, python=sys.executable)   # this test's own venv
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PIP_INSTALL_FLAGS=",
                                        f"{sys.executable} is not externally managed (PEP 668): pip installs "
                                        "into it as it is"]
    bad = pep668_check(facts, tmp_path / "bad", None, python=sys.executable, break_system_packages="maybe")
    assert bad.returncode == 1 and "break_system_packages=maybe: use auto, true or false" in bad.stderr


@needs_marked_python
def test_the_flag_reaches_the_wheel_install(facts: dict[str, Any], fake_python: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The decision runs in Debian's real python3 (marked) seeing a torch that pip installed; the rest of
    # the build in the stand-in, which records what `pip install` got.
    monkeypatch.setenv("FAKE_PEP668_PYTHON", DEBIAN_PYTHON)
    monkeypatch.setenv("PYTHONPATH", str(torch_site(tmp_path / "site", "pip")))
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    run = run_build(cu130(facts, fake_python), tmp_path, cuda_home=str(home))
    assert run.status == "changed", [(s.name, s.status, s.reason, s.stderr) for s in run.steps]
    decided = next(s for s in run.steps if s.name == PEP668_STEP)
    assert decided.reason.endswith("so this build does the same: --break-system-packages")
    installed = (fake_python.parent.parent / "state" / "pip-install-args").read_text().split()
    assert "--break-system-packages" in installed and installed[-1].endswith(".whl")


# ---------------------------------------------------------------- cuda-toolkit-pip


def test_pip_playbook_refuses_cuda_12_before_changing_anything(facts: dict[str, Any], tmp_path: Path) -> None:
    # NVIDIA's cu12 nvcc wheels hold only ptxas (tests/unit/groundtruth reads them): no 12.x pip toolkit.
    first = plan(TOOLKIT_PIP, facts).plays[0].steps[0]
    assert first.compiled.step.name == "cuda version known" and first.rendered is not None
    assert first.rendered.apply is None and first.rendered.check is not None   # a check: changes nothing
    refused = sh(first.rendered.check, tmp_path)
    assert refused.returncode == 1
    assert "CUDA 12.8: NVIDIA's PyPI wheels carry no nvcc before 13.0" in refused.stderr
    assert "nothing was changed" in refused.stderr and "whl/cu130" in refused.stderr
    assert "cuda-toolkit.yaml" in refused.stderr
    accepted = plan(TOOLKIT_PIP, cu130(facts)).plays[0]
    assert accepted.vars["pip_packages"] == "cuda-toolkit[nvcc,cudart,cccl,crt]==13.0.*"
    step = accepted.steps[0].rendered
    assert step is not None and step.check is not None
    assert sh(step.check, tmp_path).returncode == 0


def wheel_tree(site: Path) -> None:
    """What NVIDIA's 13.x wheels put under site-packages/nvidia: one merged cu13/ tree (the real layout,
    read in nvidia-cuda-nvcc 13.0.88 by tests/unit/groundtruth; the real install is tests/e2e)."""
    root = site / "nvidia" / "cu13"
    fake_toolkit(root, "13.0", headers=False, libcudart=False)
    (root / "nvvm" / "bin").mkdir(parents=True)
    for name in ("cuda_runtime_api.h", "cub/cub.cuh"):
        (root / "include" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "include" / name).write_text("/* fake */\n")
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib" / "libcudart.so.13").write_text("fake\n")


def test_cuda_home_farm_from_the_wheel_layout(facts: dict[str, Any], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    version = "13.0"
    site = tmp_path / "site"
    wheel_tree(site)
    monkeypatch.setenv("PYTHONPATH", str(site))
    home = tmp_path / f"cuda-{version}"
    facts["torch"] = {"version": "x", "cuda": version, "interpreter": sys.executable}
    planned = plan(TOOLKIT_PIP, facts, cuda_home=str(home)).plays[0].steps
    steps = {p.compiled.step.name: p.rendered for p in planned}
    farm = steps["CUDA_HOME assembled"]
    assert farm is not None and farm.check is not None and farm.apply is not None
    assert sh(farm.check, tmp_path).returncode == 1                 # not there yet: would change
    applied = sh(farm.apply, tmp_path)
    assert applied.returncode == 0, applied.stderr
    checked = sh(farm.check, tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.strip().endswith(f"CUDA_HOME={home} (nvcc release {version})")
    assert os.readlink(home / "lib64" / "libcudart.so") == "libcudart.so.13"
    assert (home / "include" / "cub" / "cub.cuh").is_file() and (home / "nvvm" / "bin").is_dir()
    nvcc = steps["nvcc wheels installed"]
    assert nvcc is not None and nvcc.check is not None
    found = sh(nvcc.check, tmp_path)
    assert found.returncode == 0 and f"nvcc {version}:" in found.stdout
    # Re-assembling replaces the farm in place (idempotent apply).
    assert sh(farm.apply, tmp_path).returncode == 0 and sh(farm.check, tmp_path).returncode == 0


@pytest.mark.parametrize(("caps", "tokens"), [
    (["8.6"], "80"), (["8.9", "9.0"], "80;90"), (["10.3"], "100"), (["12.1", "12.0"], "120"),
    (["7.5"], None),   # flash-attn 2 has no sm_75 build: no token, so its own default applies
])
def test_flash_attn_gets_the_family_tokens_its_setup_py_knows(
    facts: dict[str, Any], caps: list[str], tokens: str | None
) -> None:
    facts["gpu"]["compute_caps"] = caps
    facts["build"].update(cpus=64, mem_total_mb=65536)
    [[_, _, words]] = plan_lines(facts, extensions="flash-attn")
    found = dict(word.split("=", 1) for word in words.split())
    assert found.get("FLASH_ATTN_CUDA_ARCHS") == tokens
    assert found["MAX_JOBS"] == "3"   # 64 GiB at 20 GiB per job (its setup.py's 5 GB x 4 nvcc threads)
