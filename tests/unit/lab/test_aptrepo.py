"""The test bed's NVIDIA-style apt repository, checked with the host's real apt, dpkg and gpg.

apt runs with a private configuration (IsolatedApt); nothing is installed into this machine's root: packages
are unpacked with ``dpkg-deb -x`` or installed with ``dpkg --root=<scratch dir>``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.aptrepo import (
    KEYRING_FILE,
    PIN_FILE,
    REAL_CUDA_13_0,
    AptRepo,
    AptRepoError,
    BuiltRepo,
    IsolatedApt,
    build_repo,
    serve_repo,
)
from tests.lab.realtorch import cache_root

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs real apt-get update/dpkg --root; needs root"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BuiltRepo:
    return build_repo(tmp_path_factory.mktemp("aptrepo"))


@pytest.fixture(scope="module")
def repo(built: BuiltRepo) -> Iterator[AptRepo]:
    served = serve_repo(built)
    yield served
    served.stop()


@pytest.fixture()
def apt(tmp_path: Path) -> IsolatedApt:
    return IsolatedApt(tmp_path / "apt")


def _unpack(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    return into


def _configure_like_the_keyring(repo: AptRepo, apt: IsolatedApt, scratch: Path) -> None:
    """Use the served cuda-keyring's own .list, key and pin. Only the signed-by path is moved into scratch,
    since /usr/share/keyrings of this machine must stay untouched."""
    root = _unpack(repo.keyring_deb_path(), scratch / "keyring-root")
    listing = (root / f"etc/apt/sources.list.d/cuda-{repo.distro}-{repo.arch}.list").read_text()
    (apt.sources_dir / "cuda.list").write_text(
        listing.replace(KEYRING_FILE, str(root / KEYRING_FILE.lstrip("/")))
    )
    shutil.copy(root / PIN_FILE.lstrip("/"), apt.home / "preferences.d" / "cuda-repository-pin-600")


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def test_without_the_source_apt_cannot_locate_the_package(repo: AptRepo, apt: IsolatedApt) -> None:
    assert apt.run("apt-get", "update").returncode == 0
    result = apt.run("apt-get", "install", "--simulate", "cuda-nvcc-12-8")
    assert result.returncode == 100
    assert "E: Unable to locate package cuda-nvcc-12-8" in result.stderr


def test_keyring_installs_nvidias_three_files_for_the_served_url(
    repo: AptRepo, built: BuiltRepo, tmp_path: Path
) -> None:
    root = _unpack(repo.keyring_deb_path(), tmp_path / "root")
    assert (root / KEYRING_FILE.lstrip("/")).read_bytes() == built.public_key.read_bytes()
    listing = (root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    assert listing == (
        f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        f"http://127.0.0.1:{repo.port}/compute/cuda/repos/debian12/x86_64/ /\n"
    )
    assert "Pin: release l=NVIDIA CUDA\nPin-Priority: 600" in (root / PIN_FILE.lstrip("/")).read_text()
    # The key is a binary (dearmored) export, as NVIDIA ships it: no ASCII armor header.
    assert not (root / KEYRING_FILE.lstrip("/")).read_bytes().startswith(b"-----BEGIN")


def test_keyring_is_fetchable_where_nvidia_publishes_it(repo: AptRepo) -> None:
    status, body = _fetch(f"{repo.base_url}/debian12/x86_64/cuda-keyring_1.1-1_all.deb")
    assert status == 200
    assert body == repo.keyring_deb_path().read_bytes()
    # Another distro's directory does not exist, as for a distro NVIDIA has no repo for.
    assert _fetch(f"{repo.base_url}/ubuntu2004/x86_64/cuda-keyring_1.1-1_all.deb")[0] == 404


def test_with_keyring_update_succeeds_and_nvcc_has_a_pinned_candidate(
    repo: AptRepo, apt: IsolatedApt, tmp_path: Path
) -> None:
    _configure_like_the_keyring(repo, apt, tmp_path)
    update = apt.run("apt-get", "update")
    assert update.returncode == 0, update.stderr
    assert update.stderr == ""
    policy = apt.run("apt-cache", "policy", "cuda-nvcc-12-8")
    assert "Candidate: 12.8.93-1" in policy.stdout
    assert f"600 {repo.repo_url.rstrip('/')}  Packages" in policy.stdout  # the keyring's pin applies

    plan = apt.run(
        "apt-get",
        "install",
        "--simulate",
        "--no-install-recommends",
        "cuda-nvcc-12-8",
        "cuda-cudart-dev-12-8",
    )
    assert plan.returncode == 0, plan.stderr
    installed = {line.split()[1] for line in plan.stdout.splitlines() if line.startswith("Inst ")}
    assert installed == {"cuda-nvcc-12-8", "cuda-cccl-12-8", "cuda-cudart-12-8", "cuda-cudart-dev-12-8"}


def test_driver_and_meta_packages_exist_so_their_absence_can_be_asserted(
    repo: AptRepo, apt: IsolatedApt, tmp_path: Path
) -> None:
    _configure_like_the_keyring(repo, apt, tmp_path)
    assert apt.run("apt-get", "update").returncode == 0
    plan = apt.run("apt-get", "install", "--simulate", "cuda-12-8")
    assert plan.returncode == 0, plan.stderr
    installed = {line.split()[1] for line in plan.stdout.splitlines() if line.startswith("Inst ")}
    assert {"cuda-drivers", "nvidia-driver-570", "cuda-toolkit-12-8", "libcublas-dev-12-8"} <= installed


def test_source_without_the_key_is_rejected_as_unsigned(
    repo: AptRepo, built: BuiltRepo, apt: IsolatedApt
) -> None:
    # The pre-keyring style line (old cuda.list) with no key trusted anywhere.
    (apt.sources_dir / "cuda.list").write_text(f"deb {repo.repo_url} /\n")
    update = apt.run("apt-get", "update")
    assert update.returncode == 100
    assert f"NO_PUBKEY {built.key_id}" in update.stderr
    assert f"E: The repository '{repo.repo_url.rstrip('/')}  InRelease' is not signed." in update.stderr


@pytest.mark.parametrize(("short", "release"), [("12.8", "V12.8.93"), ("12.4", "V12.4.131")])
def test_nvcc_prints_the_real_banner_shape(
    built: BuiltRepo, tmp_path: Path, short: str, release: str
) -> None:
    package = f"cuda-nvcc-{short.replace('.', '-')}"
    release_line = f"Cuda compilation tools, release {short}, {release}"
    nvcc = _unpack(built.deb_path(package), tmp_path) / f"usr/local/cuda-{short}/bin/nvcc"
    for flag in ("--version", "-V"):
        out = subprocess.run([str(nvcc), flag], capture_output=True, text=True, check=False)
        assert out.returncode == 0
        lines = out.stdout.splitlines()
        assert lines[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
        assert lines[3] == release_line
        assert lines[4].startswith(f"Build cuda_{short}.r{short}/compiler.")
    no_input = subprocess.run([str(nvcc)], capture_output=True, text=True, check=False)
    assert no_input.returncode == 1
    assert "nvcc fatal   : No input files specified" in no_input.stderr


def test_failing_paths_answer_404_and_recover(repo: AptRepo) -> None:
    keyring = repo.keyring_url
    try:
        repo.fail_paths.add(repo.repo_path + repo.keyring_filename)
        assert _fetch(keyring)[0] == 404
        assert _fetch(repo.repo_url + "InRelease")[0] == 200
        repo.fail_paths = {repo.repo_path}  # a prefix: the whole repo directory
        assert _fetch(repo.repo_url + "InRelease")[0] == 404
        repo.fail_paths = set()
        repo.broken = True
        assert _fetch(keyring)[0] == 404
    finally:
        repo.fail_paths = set()
        repo.broken = False
    assert _fetch(keyring)[0] == 200
    assert f"GET {repo.repo_path}{repo.keyring_filename}" in repo.requests


def test_dead_mirror_makes_update_fail_without_a_release_file(
    repo: AptRepo, apt: IsolatedApt, tmp_path: Path
) -> None:
    _configure_like_the_keyring(repo, apt, tmp_path)
    try:
        repo.broken = True
        update = apt.run("apt-get", "update")
    finally:
        repo.broken = False
    assert update.returncode == 100
    expected = f"E: The repository '{repo.repo_url.rstrip('/')}  Release' does not have a Release file."
    assert expected in update.stderr


def test_downloaded_debs_install_with_real_dpkg_into_a_scratch_root(
    repo: AptRepo, apt: IsolatedApt, tmp_path: Path
) -> None:
    _configure_like_the_keyring(repo, apt, tmp_path)
    assert apt.run("apt-get", "update").returncode == 0
    requests_before = len(repo.requests)
    download = apt.run(
        "apt-get",
        "install",
        "-y",
        "--download-only",
        "--no-install-recommends",
        "cuda-nvcc-12-8",
        "cuda-cudart-dev-12-8",
    )
    assert download.returncode == 0, download.stderr  # apt checked Size and SHA256 against Packages
    fetched = repo.requests[requests_before:]
    assert not any("cuda-drivers" in r or "nvidia-driver" in r for r in fetched)

    root = tmp_path / "root"
    for sub in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"):
        (root / sub).mkdir(parents=True)
    (root / "var/lib/dpkg/status").touch()
    downloaded = sorted(str(p) for p in (apt.home / "cache/archives").glob("*.deb"))
    debs = [*downloaded, str(repo.keyring_deb_path())]
    assert len(debs) == 5
    dpkg = ["dpkg", f"--root={root}", "--force-not-root", "--force-script-chrootless"]
    install = subprocess.run([*dpkg, "-i", *debs], capture_output=True, text=True, check=False)
    assert install.returncode == 0, install.stderr

    banner = subprocess.run(
        [str(root / "usr/local/cuda-12.8/bin/nvcc"), "--version"], capture_output=True, text=True, check=True
    )
    assert "release 12.8, V12.8.93" in banner.stdout
    libcudart = root / "usr/local/cuda-12.8/lib64/libcudart.so"
    assert libcudart.is_symlink() and libcudart.resolve().name == "libcudart.so.12.8.93"
    assert (root / "usr/local/cuda-12.8/include/cuda_runtime_api.h").is_file()
    assert (root / "usr/local/cuda-12.8/include/cub/cub.cuh").is_file()
    listed = subprocess.run([*dpkg, "-L", "cuda-keyring"], capture_output=True, text=True, check=True).stdout
    for path in (KEYRING_FILE, PIN_FILE, "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"):
        assert path in listed.splitlines()


def test_keyring_can_name_another_base_url(built: BuiltRepo, tmp_path: Path) -> None:
    upstream = "http://127.0.0.1:9/compute/cuda/repos"  # only written into a file, never contacted
    with serve_repo(built, keyring_base_url=upstream) as mirror:
        root = _unpack(mirror.keyring_deb_path(), tmp_path)
        listing = (root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
        assert listing == f"deb [signed-by={KEYRING_FILE}] {upstream}/debian12/x86_64/ /\n"
        assert mirror.sources_line == listing.strip()


def test_build_is_cached_and_the_pool_is_reproducible(built: BuiltRepo, tmp_path: Path) -> None:
    again = build_repo(built.cache_dir.parent)
    assert again.from_cache and again.key_fingerprint == built.key_fingerprint
    fresh = build_repo(tmp_path)
    assert not fresh.from_cache
    assert fresh.key_fingerprint != built.key_fingerprint  # a new throwaway key per cache
    assert built.package_names() == fresh.package_names()
    for package in built.package_names():
        assert built.deb_path(package).read_bytes() == fresh.deb_path(package).read_bytes(), package


def test_refuses_to_serve_beyond_loopback(built: BuiltRepo) -> None:
    with pytest.raises(AptRepoError, match="loopback only"):
        serve_repo(built, host="0.0.0.0")


@pytest.mark.slow
@pytest.mark.skipif(
    not (REAL_CUDA_13_0 / "bin/nvcc").is_file() or shutil.which("g++") is None,
    reason="needs the real CUDA 13.0 at /usr/local/cuda-13.0 and g++",
)
def test_real_13_0_packages_compile_and_run_a_cuda_program(tmp_path: Path) -> None:
    # The very debs the e2e tests install (their real_repo fixture's cache, the same key), built here when
    # this machine has none yet: building them again in tmp_path would prove nothing more.
    built13 = build_repo(cache_root() / "aptrepo", real_13_0=True)
    assert {"cuda-nvcc-13-0", "cuda-cudart-dev-13-0", "cuda-cccl-13-0"} <= set(built13.package_names())
    root = tmp_path / "root"
    for sub in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"):
        (root / sub).mkdir(parents=True)
    (root / "var/lib/dpkg/status").touch()
    debs = [str(built13.deb_path(p)) for p in ("cuda-cccl-13-0", "cuda-cudart-dev-13-0", "cuda-nvcc-13-0")]
    subprocess.run(
        ["dpkg", f"--root={root}", "--force-not-root", "--force-script-chrootless", "-i", *debs],
        capture_output=True,
        check=True,
    )
    cuda_home = root / "usr/local/cuda-13.0"
    source = tmp_path / "probe.cu"
    source.write_text(
        "#include <cuda_runtime_api.h>\n#include <cub/block/block_reduce.cuh>\n#include <cstdio>\n"
        "__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n"
        'int main() { int v = 0; cudaRuntimeGetVersion(&v); std::printf("runtime %d\\n", v); }\n'
    )
    binary = tmp_path / "probe"
    subprocess.run(
        [str(cuda_home / "bin/nvcc"), "-arch=sm_80", "-o", str(binary), str(source)],
        capture_output=True,
        check=True,
        timeout=240,
    )
    ran = subprocess.run(
        [str(binary)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_LIBRARY_PATH": str(cuda_home / "lib64")},
    )
    assert ran.stdout.strip() == "runtime 13000"
