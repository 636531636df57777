"""Shared pytest set-up: the `e2e` marker, the test bed's prerequisites, and the test-bed fixtures.

Every test under tests/e2e gets the `e2e` marker. An e2e test needs root, OpenSSH (server and client),
util-linux's unshare/nsenter and overlayfs; without them it is skipped with the reason - except in CI
(`CI=true`), where a missing prerequisite is an error, so a pipeline cannot go green by skipping.

Fixtures:
    lab        session-scoped `Lab` with one node, "pve1", and no containers
    make_ct    function-scoped factory: make_ct(ctid=None, *, node=None, name=None, running=True, tags=(),
               setup=None, config=None) -> Container; every container it made is destroyed afterwards
    make_vm    the same for VMs (tests/lab/vm.py): make_vm(vmid=None, *, node=None, name=None, running=True,
               agent=True, agent_installed=True, tags=(), setup=None, config=None) -> VirtualMachine
    lab_factory function-scoped factory for a private Lab: lab_factory(nodes=2) -> Lab, closed afterwards
    stub_cache session-scoped directory for compiled test artefacts (torch_stub's extension module)
    pg_server  session-scoped throwaway PostgreSQL cluster (tests/lab/pgserver.py); skipped without the
               server binaries, an error in CI
    history    (history_factory: makes more) a new, empty audit history, once per backend: an SQLite
               file's path, then a PostgreSQL URL (its own schema in pg_server's cluster); the store
               tests run against both
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import pgserver
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.vm import VirtualMachine

E2E_DIR = (Path(__file__).parent / "e2e").resolve()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@functools.cache
def e2e_prerequisite_problem() -> str | None:
    """Why the test bed cannot run here, or None when it can (checked once per session)."""
    if os.geteuid() != 0:
        return "the e2e test bed needs root (sshd on loopback, mount/pid namespaces, overlayfs)"
    missing = [
        path
        for path in ("/usr/sbin/sshd", "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/python3")
        if not os.access(path, os.X_OK)
    ]
    missing += [tool for tool in ("ssh", "ssh-keygen", "mount", "cp") if shutil.which(tool) is None]
    if missing:
        return f"the e2e test bed needs {', '.join(missing)} (apt-get install openssh-server openssh-client)"
    # The honest check for namespaces + overlayfs: mount an overlay of / in a throwaway mount namespace.
    with tempfile.TemporaryDirectory(prefix="fleetfix-overlay-check-") as scratch:
        for sub in ("u", "w", "m"):
            os.mkdir(os.path.join(scratch, sub))
        probe = subprocess.run(
            [
                "/usr/bin/unshare",
                "--mount",
                "--propagation",
                "private",
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir=/,upperdir={scratch}/u,workdir={scratch}/w",
                f"{scratch}/m",
            ],
            capture_output=True,
            text=True,
        )
    if probe.returncode != 0:
        return f"cannot mount an overlay of / in a private mount namespace: {probe.stderr.strip()}"
    return None


# Run in parallel (README's test command: `-n 4 --dist loadfile`), pytest-xdist hands whole test files to
# its workers in collection order, each worker holding the one it runs and the next. These files take the
# longest (CI's --durations, on 2 cores), longest first: started first, none of them is the last to end
# while the other workers idle. A file missing here only starts later; order changes nothing else.
LONGEST_FIRST = (
    "tests/e2e/test_real_vm.py",
    "tests/e2e/test_upstream_release_wheels.py",
    "tests/e2e/test_build_extensions.py",
    "tests/e2e/test_wheel_cache.py",
    "tests/e2e/test_benchmark_smoke.py",
    "tests/e2e/test_wheel_builder.py",
    "tests/e2e/test_wheel_trust.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_debian13_real.py",
    "tests/e2e/test_lab_script.py",
    "tests/e2e/test_build_extensions_pep668.py",
    "tests/e2e/test_docs_tutorial.py",
    "tests/e2e/test_apt_sources.py",
    "tests/e2e/test_cli_apply.py",
    "tests/e2e/test_cli_vm.py",
    "tests/e2e/test_debian13.py",
)


def in_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_PARALLEL_BASETEMP = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown with -p no:xdist
def pytest_configure_node(node: Any) -> None:  # in the controller, per worker
    node.workerinput["fleetfix_columns"] = os.environ.get("COLUMNS")


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    if in_xdist_worker(config):
        # A worker starts with COLUMNS set to its terminal's width (80 without one), which the controller's
        # environment may not have; fleetfix's tables are 200 wide without a terminal or COLUMNS, so a
        # worker takes the controller's COLUMNS, or none, as a plain run would.
        columns = config.workerinput.get("fleetfix_columns")  # type: ignore[attr-defined]
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
        return
    if not getattr(config.option, "numprocesses", None):
        return
    # xdist's default for --dist loadfile/loadscope sorts files by their number of tests, most first; the
    # longest files here have one or two tests, so keep LONGEST_FIRST's order instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # Each worker's temporary directory is the session's plus "/popen-gwN". Unix socket paths under it (a
    # VM's qga.sock and qmp.sock, deep in a lab's node directory) would pass the 107 bytes a socket path may
    # have where a plain run's fit, so a parallel session's base is shorter than a plain run's
    # (/tmp/pytest-of-root/pytest-N): /tmp/fft-XXXXXXXX, removed at the end when everything passed.
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="fft-", dir="/tmp")
        config.stash[_PARALLEL_BASETEMP] = config.option.basetemp



def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    base = session.config.stash.get(_PARALLEL_BASETEMP, None)
    if base is not None and exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
    if in_xdist_worker(config):  # a plain run keeps pytest's own order
        rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("e2e") is None:
        return
    problem = e2e_prerequisite_problem()
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and the e2e prerequisites are missing: {problem}", pytrace=False)
    pytest.skip(problem)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.PgServer]:
    why = pgserver.problem()
    if why is not None:
        if in_ci():
            pytest.fail(f"PostgreSQL tests cannot run: {why}")
        pytest.skip(why)
    with pgserver.running_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def history_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str | Path]:
    """Makes new, empty histories of one backend (each test runs once per backend)."""
    if request.param == "sqlite":
        names = itertools.count(1)
        return lambda: tmp_path / f"history{next(names)}.db"
    server: pgserver.PgServer = request.getfixturevalue("pg_server")
    return server.fresh_url


@pytest.fixture
def history(history_factory: Callable[[], str | Path]) -> str | Path:
    return history_factory()


@pytest.fixture(scope="session")
def stub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stub-cache")


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    bed = Lab(tmp_path_factory.mktemp("lab") / "bed", nodes=1)
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def make_ct(lab: Lab) -> Iterator[Callable[..., Container]]:
    made: list[Container] = []
    fresh_ids = itertools.count(300)

    def factory(ctid: int | None = None, *, node: str | None = None, **options: Any) -> Container:
        if ctid is None:  # containers and VMs share one id space per node
            ctid = next(ctid for ctid in fresh_ids if lab.node(node).state.id_owner(ctid) is None)
        ct = lab.add_container(node, ctid, **options)
        made.append(ct)
        return ct

    yield factory
    for ct in made:
        ct.destroy()


@pytest.fixture
def make_vm(lab: Lab) -> Iterator[Callable[..., VirtualMachine]]:
    made: list[VirtualMachine] = []
    fresh_ids = itertools.count(700)

    def factory(vmid: int | None = None, *, node: str | None = None, **options: Any) -> VirtualMachine:
        if vmid is None:
            vmid = next(vmid for vmid in fresh_ids if lab.node(node).state.id_owner(vmid) is None)
        machine = lab.add_vm(node, vmid, **options)
        made.append(machine)
        return machine

    yield factory
    for machine in made:
        machine.destroy()


@pytest.fixture
def lab_factory(tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    labs: list[Lab] = []

    def factory(nodes: int = 1) -> Lab:
        bed = Lab(tmp_path / f"lab{len(labs)}", nodes=nodes)
        labs.append(bed)
        return bed

    yield factory
    for bed in labs:
        bed.close()
