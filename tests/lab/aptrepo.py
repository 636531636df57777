"""A signed, NVIDIA-shaped apt repository for the test bed, built and served offline on loopback.

Layout and package names follow NVIDIA's flat CUDA repository (see docs/DOMAIN.md sections 1 and 2):

    <root>/compute/cuda/repos/<distro>/<arch>/{Packages,Packages.gz,Release,InRelease,Release.gpg,*.deb}

Two phases, because the keyring package embeds the URL the repository is served at (its ``.list`` names it),
and the port is only known once a server socket is bound:

* :func:`build_repo` builds everything that does not depend on the URL (the throwaway signing key and the
  toolkit/driver ``.deb`` pool plus its ``Packages`` stanzas) into a cache directory keyed by the build
  parameters, so a test session (or several, with a persistent work directory) builds it once.
* :func:`serve_repo` binds a port, publishes the pool plus a ``cuda-keyring`` for that URL into a fresh
  document root, signs the indexes, and serves them from a background thread. Chosen paths can be made to
  answer 404 (``fail_paths``, ``broken``) to play a broken mirror.

:class:`IsolatedApt` runs the host's real ``apt-get``/``apt-cache`` against a private configuration, so the
repository can be checked with real apt without touching this machine's apt state.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.lab.locks import cache_lock

# Bump when the package contents or layout change, so stale caches are not reused.
_CACHE_SCHEMA = 6
# Fixed timestamp for reproducible .debs (dpkg-deb clamps tar mtimes and stamps the ar header with it).
_SOURCE_DATE_EPOCH = "1735689600"  # 2025-01-01T00:00:00Z
_KEYRING_NAME = "cuda-keyring"
_KEYRING_VERSION = "1.1-1"
KEYRING_FILE = "/usr/share/keyrings/cuda-archive-keyring.gpg"
PIN_FILE = "/etc/apt/preferences.d/cuda-repository-pin-600"
_MAINTAINER = "fleetfix test bed <testbed@fleetfix.invalid>"
# NVIDIA's Release carries this label; the keyring's pin file pins on it (l=NVIDIA CUDA).
_RELEASE_ORIGIN = "NVIDIA"
_RELEASE_LABEL = "NVIDIA CUDA"
# NVIDIA's cuda-<distro>.pin / cuda-repository-pin-600 content.
_PIN_CONTENT = """\
Package: nsight-compute
Pin: origin *ubuntu.com*
Pin-Priority: -1

Package: nsight-systems
Pin: origin *ubuntu.com*
Pin-Priority: -1

Package: *
Pin: release l=NVIDIA CUDA
Pin-Priority: 600
"""
# Real nvcc banners for the default releases: (copyright years, "Built on" stamp, compiler build id).
# Copyright years, the release line and the build id are what NVIDIA's ptxas of the same release prints
# (nvidia-cuda-nvcc-cu12 12.8.93 and 12.4.131 wheels; nvcc and ptxas share them, as 13.0's do) and are
# checked against those wheels by tests/e2e/test_standin_ground_truth.py. The "Built on" stamps of 12.x are
# nvcc's own (ptxas's differ by seconds) and come from `nvcc -V` output quoted in public READMEs (GitHub
# code search, several independent repositories each); no test can reach a real 12.x nvcc here.
_KNOWN_NVCC_BANNERS: dict[str, tuple[str, str, str]] = {
    "V12.8.93": ("2005-2025", "Fri_Feb_21_20:23:50_PST_2025", "cuda_12.8.r12.8/compiler.35583870_0"),
    "V12.4.131": ("2005-2024", "Thu_Mar_28_02:18:24_PDT_2024", "cuda_12.4.r12.4/compiler.34097967_0"),
    # What this machine's real /usr/local/cuda-13.0/bin/nvcc prints.
    "V13.0.88": ("2005-2025", "Wed_Aug_20_01:58:59_PM_PDT_2025", "cuda_13.0.r13.0/compiler.36424714_0"),
}
# How the repository key's self-signatures are bound. NVIDIA's 3bf863cc (every Debian-family repo but
# debian13) is bound with SHA-1, which apt 3's sqv rejects since 2026-02-01; debian13's key uses SHA-256.
KEY_BINDINGS = ("sha256", "sha1")
REAL_CUDA_13_0 = Path("/usr/local/cuda-13.0")
_DEB_ARCH = {"x86_64": "amd64", "sbsa": "arm64"}


class AptRepoError(RuntimeError):
    """The test repository could not be built or served (a missing tool, a failed gpg/dpkg call)."""


@dataclass(frozen=True)
class CudaRelease:
    """One CUDA toolkit line of the repository, e.g. ``CudaRelease("12.8", "V12.8.93")``."""

    version: str  # major.minor, e.g. "12.8"
    release: str  # what nvcc prints after the comma, e.g. "V12.8.93"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+\.\d+", self.version):
            raise AptRepoError(f"CUDA version must be MAJOR.MINOR, got {self.version!r}")
        if not re.fullmatch(rf"V{re.escape(self.version)}\.\d+", self.release):
            raise AptRepoError(f"nvcc release must look like V{self.version}.N, got {self.release!r}")

    @property
    def dashed(self) -> str:
        """The package-name suffix NVIDIA uses: 12.8 -> 12-8."""
        return self.version.replace(".", "-")

    @property
    def deb_version(self) -> str:
        return f"{self.release[1:]}-1"

    @property
    def prefix(self) -> str:
        return f"/usr/local/cuda-{self.version}"

    def nvcc_banner(self) -> str:
        """The text real nvcc prints for ``--version`` (same five lines, same order)."""
        years, built_on, build = _KNOWN_NVCC_BANNERS.get(
            self.release,
            (
                "2005-2025",
                "Mon_Jan_01_00:00:00_UTC_2025",
                f"cuda_{self.version}.r{self.version}/compiler.00000000_0",
            ),
        )
        return (
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            f"Copyright (c) {years} NVIDIA Corporation\n"
            f"Built on {built_on}\n"
            f"Cuda compilation tools, release {self.version}, {self.release}\n"
            f"Build {build}\n"
        )


DEFAULT_CUDA_RELEASES: tuple[CudaRelease, ...] = (
    CudaRelease("12.8", "V12.8.93"),
    CudaRelease("12.4", "V12.4.131"),
)


# --- package specifications ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass(frozen=True)
class HostTree:
    """Copy a directory (or file) of this machine into the package; hard-linked when possible (no copy)."""

    source: Path
    exclude: tuple[str, ...] = ()  # names relative to source, skipped


@dataclass(frozen=True)
class FileContent:
    data: bytes
    mode: int = 0o644


Payload = FileContent | Symlink | HostTree


@dataclass(frozen=True)
class DebSpec:
    name: str
    version: str
    arch: str  # a Debian architecture: "amd64", "arm64" or "all"
    description: str
    files: Mapping[str, Payload] = field(default_factory=dict)  # absolute install path -> payload
    depends: tuple[str, ...] = ()
    section: str = "devel"

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_{self.arch}.deb"

    def control(self, installed_size_kib: int) -> str:
        lines = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            f"Architecture: {self.arch}",
            f"Maintainer: {_MAINTAINER}",
            f"Installed-Size: {installed_size_kib}",
            f"Section: {self.section}",
            "Priority: optional",
        ]
        if self.depends:
            lines.append(f"Depends: {', '.join(self.depends)}")
        lines.append(f"Description: {self.description}")
        lines.append(" Dummy package of the fleetfix test bed, shaped like NVIDIA's CUDA repository.")
        return "\n".join(lines) + "\n"


def _text(data: str, mode: int = 0o644) -> FileContent:
    return FileContent(data.encode(), mode)


def nvcc_stand_in_script(release: CudaRelease) -> FileContent:
    # Same banner and exit codes as the real driver; anything but a version query fails, as a dummy must.
    # Sources: the banner, above; "nvcc fatal   : No input files specified; use option --help for more
    # information" and exit 1 are what the real nvcc 13.0 of this machine prints with no argument.
    return _text(
        "#!/bin/sh\n"
        "# fleetfix test bed: stand-in for NVIDIA's nvcc (prints the real banner, compiles nothing)\n"
        'for arg in "$@"; do\n'
        '  case "$arg" in\n'
        "    --version|-V)\n"
        "      cat <<'EOF'\n"
        f"{release.nvcc_banner()}"
        "EOF\n"
        "      exit 0;;\n"
        "  esac\n"
        "done\n"
        'if [ "$#" -eq 0 ]; then\n'
        "  echo 'nvcc fatal   : No input files specified; use option --help for more information' >&2\n"
        "else\n"
        "  echo 'nvcc fatal   : fleetfix test bed nvcc stand-in cannot compile' >&2\n"
        "fi\n"
        "exit 1\n",
        0o755,
    )


def _header(name: str, release: CudaRelease) -> FileContent:
    guard = re.sub(r"\W", "_", name).upper()
    return _text(
        f"/* fleetfix test bed: dummy {name} of CUDA {release.version} ({release.release}) */\n"
        f"#ifndef FLEETFIX_DUMMY_{guard}\n#define FLEETFIX_DUMMY_{guard}\n#endif\n"
    )


def toolkit_specs(release: CudaRelease, deb_arch: str) -> list[DebSpec]:
    """The minimal-build package set of one CUDA release (DOMAIN 2.1/2.3), plus its meta-packages.

    Stand-ins (docs/testbed.md): the package names follow NVIDIA's pattern as DOMAIN.md 2.1 gives it,
    the meta-packages and cuda-X-Y's pull of cuda-drivers as 2.2 and 5.3 do; the deb version (V12.8.93 ->
    12.8.93-1), the sections and the other Depends are ours, not read from NVIDIA's Packages index. The
    install prefix /usr/local/cuda-X.Y and libcudart.so.MAJOR are those of the real 13.0 files
    (real_13_0_specs). Payloads are placeholders: only nvcc --version and the files' paths are real."""
    d, v, p = release.dashed, release.deb_version, release.prefix
    major = release.version.split(".")[0]
    lib_real = f"libcudart.so.{release.release[1:]}"
    return [
        DebSpec(
            f"cuda-nvcc-{d}",
            v,
            deb_arch,
            f"CUDA nvcc {release.version}",
            {f"{p}/bin/nvcc": nvcc_stand_in_script(release)},
            # Real cuda-nvcc also Depends: build-essential; left out because containers have no Debian mirror.
            depends=(f"cuda-cccl-{d}",),
        ),
        DebSpec(
            f"cuda-cudart-{d}",
            v,
            deb_arch,
            f"CUDA Runtime native Libraries {release.version}",
            {
                f"{p}/lib64/{lib_real}": _text(f"fleetfix dummy libcudart {release.release}\n"),
                f"{p}/lib64/libcudart.so.{major}": Symlink(lib_real),
            },
            section="libs",
        ),
        DebSpec(
            f"cuda-cudart-dev-{d}",
            v,
            deb_arch,
            f"CUDA Runtime native dev links, headers {release.version}",
            {
                f"{p}/include/cuda_runtime_api.h": _header("cuda_runtime_api.h", release),
                f"{p}/include/cuda_runtime.h": _header("cuda_runtime.h", release),
                f"{p}/include/cuda_fp16.h": _header("cuda_fp16.h", release),
                f"{p}/include/cuda_bf16.h": _header("cuda_bf16.h", release),
                f"{p}/lib64/libcudart.so": Symlink(f"libcudart.so.{major}"),
            },
            depends=(f"cuda-cudart-{d}",),
        ),
        DebSpec(
            f"cuda-cccl-{d}",
            v,
            deb_arch,
            f"CUDA CCCL {release.version}",
            {
                f"{p}/include/cub/cub.cuh": _header("cub.cuh", release),
                f"{p}/include/cub/block/block_load.cuh": _header("block_load.cuh", release),
                f"{p}/include/thrust/version.h": _header("thrust_version.h", release),
            },
        ),
        DebSpec(
            f"libcublas-dev-{d}",
            v,
            deb_arch,
            f"CUBLAS native dev links, headers {release.version}",
            {
                f"{p}/include/cublas_v2.h": _header("cublas_v2.h", release),
                f"{p}/include/cublasLt.h": _header("cublasLt.h", release),
            },
        ),
        DebSpec(
            f"libcusparse-dev-{d}",
            v,
            deb_arch,
            f"CUSPARSE native dev links, headers {release.version}",
            {f"{p}/include/cusparse.h": _header("cusparse.h", release)},
        ),
        DebSpec(
            f"libcusolver-dev-{d}",
            v,
            deb_arch,
            f"CUSOLVER native dev links, headers {release.version}",
            {f"{p}/include/cusolverDn.h": _header("cusolverDn.h", release)},
        ),
        # Meta-packages fleetfix must never pick: the full toolkit, and cuda-X-Y which drags in the driver.
        DebSpec(
            f"cuda-toolkit-{d}",
            v,
            deb_arch,
            f"CUDA Toolkit {release.version} meta-package",
            depends=tuple(
                f"{n}-{d}"
                for n in (
                    "cuda-nvcc",
                    "cuda-cudart-dev",
                    "cuda-cccl",
                    "libcublas-dev",
                    "libcusparse-dev",
                    "libcusolver-dev",
                )
            ),
            section="metapackages",
        ),
        DebSpec(
            f"cuda-{d}",
            v,
            deb_arch,
            f"CUDA {release.version} meta-package (toolkit and driver)",
            depends=(f"cuda-toolkit-{d}", "cuda-drivers"),
            section="metapackages",
        ),
    ]


def driver_specs(deb_arch: str) -> list[DebSpec]:
    """Driver packages that exist in NVIDIA's repo and must never be installed in a GPU LXC (DOMAIN 5.3).
    Stand-ins: the names (cuda-drivers, nvidia-driver-N) as DOMAIN.md 1.3 and 5.3 name NVIDIA's; the
    version number and the cuda-drivers -> nvidia-driver-570 dependency are not checked against NVIDIA's
    index, and the payload is a placeholder."""
    return [
        DebSpec(
            "nvidia-driver-570",
            "570.172.08-1",
            deb_arch,
            "NVIDIA driver metapackage",
            {"/usr/share/doc/nvidia-driver-570/README.fleetfix": _text("fleetfix dummy driver package\n")},
            section="non-free/libs",
        ),
        DebSpec(
            "cuda-drivers",
            "570.172.08-1",
            deb_arch,
            "CUDA Driver meta-package",
            depends=("nvidia-driver-570",),
            section="metapackages",
        ),
    ]


def real_13_0_specs(source: Path = REAL_CUDA_13_0) -> list[DebSpec]:
    """Packages carrying the real CUDA 13.0 files of this machine, so a real extension can be compiled."""
    if not (source / "bin" / "nvcc").is_file():
        raise AptRepoError(f"real CUDA 13.0 requested but {source}/bin/nvcc does not exist")
    banner = _run([str(source / "bin" / "nvcc"), "--version"]).decode()
    found = re.search(r"release (13\.0), (V13\.0\.\d+)", banner)
    if not found:
        raise AptRepoError(f"{source}/bin/nvcc --version did not report release 13.0: {banner!r}")
    release = CudaRelease(found.group(1), found.group(2))
    d, v, p = release.dashed, release.deb_version, release.prefix
    lib = source / "lib"
    nvvm_libs = tuple(x.name for x in lib.glob("libnvvm*"))
    files_nvcc: dict[str, Payload] = {
        f"{p}/bin": HostTree(source / "bin"),
        f"{p}/nvvm": HostTree(source / "nvvm"),
    }
    files_nvcc.update({f"{p}/lib/{name}": HostTree(lib / name) for name in nvvm_libs})
    files_cudart: dict[str, Payload] = {
        f"{p}/include": HostTree(source / "include", exclude=("cccl",)),
        f"{p}/lib": HostTree(lib, exclude=("cmake", *nvvm_libs)),
    }
    for link in ("lib64", "targets"):
        if (source / link).exists() or (source / link).is_symlink():
            files_cudart[f"{p}/{link}"] = HostTree(source / link)
    return [
        DebSpec(
            f"cuda-nvcc-{d}",
            v,
            "amd64",
            "CUDA nvcc 13.0 (real files)",
            files_nvcc,
            depends=(f"cuda-cccl-{d}",),
        ),
        DebSpec(
            f"cuda-cudart-dev-{d}",
            v,
            "amd64",
            "CUDA Runtime dev 13.0 (real files)",
            files_cudart,
            depends=(f"cuda-cccl-{d}",),
        ),
        DebSpec(
            f"cuda-cccl-{d}",
            v,
            "amd64",
            "CUDA CCCL 13.0 (real files)",
            {
                f"{p}/include/cccl": HostTree(source / "include" / "cccl"),
                f"{p}/lib/cmake": HostTree(lib / "cmake"),
            },
        ),
    ]


def keyring_spec(public_key: bytes, base_url: str, distro: str, arch: str) -> DebSpec:
    """NVIDIA's cuda-keyring 1.1-1: the archive key, the source .list for BASE, and the priority-600 pin.
    Stand-in: the file paths and the .list line are those of NVIDIA's cuda-keyring_1.1-1_all.deb as
    DOMAIN.md section 1 lists them; the key is a throwaway one of ours (NVIDIA's private key is not)."""
    repo_url = f"{base_url.rstrip('/')}/{distro}/{arch}/"
    return DebSpec(
        _KEYRING_NAME,
        _KEYRING_VERSION,
        "all",
        "GPG keyring for the CUDA repository",
        {
            KEYRING_FILE: FileContent(public_key),
            f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list": _text(
                f"deb [signed-by={KEYRING_FILE}] {repo_url} /\n"
            ),
            PIN_FILE: _text(_PIN_CONTENT),
        },
        section="admin",
    )


# --- building ------------------------------------------------------------------------------------------


def _run(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> bytes:
    try:
        done = subprocess.run(
            list(argv), cwd=cwd, env=None if env is None else dict(env), capture_output=True, check=False
        )
    except FileNotFoundError as exc:
        raise AptRepoError(f"{argv[0]} is not installed (needed by the test apt repository)") from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        raise AptRepoError(f"{' '.join(argv)} failed with exit {done.returncode}: {err}")
    return done.stdout


def _link_or_copy(src: str, dst: str) -> None:
    # Hard links make staging the real 300 MB toolkit free; dpkg-deb only reads the files.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _stage_payload(dest: Path, payload: Payload) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(payload, FileContent):
        dest.write_bytes(payload.data)
        dest.chmod(payload.mode)
    elif isinstance(payload, Symlink):
        dest.symlink_to(payload.target)
    elif payload.source.is_symlink():
        dest.symlink_to(os.readlink(payload.source))
    elif payload.source.is_dir():
        excluded = set(payload.exclude)
        shutil.copytree(
            payload.source,
            dest,
            symlinks=True,
            copy_function=_link_or_copy,
            ignore=lambda d, names: [n for n in names if Path(d) == payload.source and n in excluded],
        )
    else:
        _link_or_copy(str(payload.source), str(dest))


def _installed_size_kib(stage: Path) -> int:
    # What dpkg-gencontrol would write: regular files rounded up to whole KiB, anything else counts 1.
    total = 0
    for path in stage.rglob("*"):
        total += -(-path.lstat().st_size // 1024) if path.is_file() and not path.is_symlink() else 1
    return total


def build_deb(
    spec: DebSpec, out_dir: Path, *, scratch: Path, compression: str = "gzip", level: int = 9
) -> Path:
    """Build one .deb with dpkg-deb into out_dir; returns its path."""
    stage = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=scratch))
    try:
        for install_path, payload in spec.files.items():
            _stage_payload(stage / install_path.lstrip("/"), payload)
        (stage / "DEBIAN").mkdir()
        (stage / "DEBIAN" / "control").write_text(spec.control(_installed_size_kib(stage)))
        out = out_dir / spec.filename
        env = {**os.environ, "SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH}
        _run(
            [
                "dpkg-deb",
                "--root-owner-group",
                f"-Z{compression}",
                f"-z{level}",
                "--build",
                str(stage),
                str(out),
            ],
            env=env,
        )
        return out
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@dataclass(frozen=True)
class BuiltRepo:
    """The URL-independent part of the repository, cached on disk (see :func:`build_repo`)."""

    cache_dir: Path
    distro: str
    arch: str
    cuda_releases: tuple[CudaRelease, ...]
    real_13_0: bool
    key_fingerprint: str
    build_seconds: float  # how long the build that produced this cache took
    from_cache: bool  # True when this call reused an earlier build
    key_binding: str = "sha256"

    @property
    def pool_dir(self) -> Path:
        return self.cache_dir / "pool"

    @property
    def gnupg_home(self) -> Path:
        return self.cache_dir / "gnupg"

    @property
    def public_key(self) -> Path:
        """The signing key as a binary (dearmored) export: cuda-keyring's cuda-archive-keyring.gpg."""
        return self.cache_dir / "cuda-archive-keyring.gpg"

    @property
    def key_id(self) -> str:
        """The long key id apt prints in NO_PUBKEY messages."""
        return self.key_fingerprint[-16:]

    @property
    def deb_arch(self) -> str:
        return _DEB_ARCH.get(self.arch, "amd64")

    def deb_path(self, package: str) -> Path:
        """The pool .deb of a package name (not cuda-keyring: that one is built per served URL)."""
        matches = sorted(self.pool_dir.glob(f"{package}_*.deb"))
        if len(matches) != 1:
            raise AptRepoError(f"expected one .deb for {package} in {self.pool_dir}, found {len(matches)}")
        return matches[0]

    def package_names(self) -> list[str]:
        return sorted(p.name.split("_", 1)[0] for p in self.pool_dir.glob("*.deb"))


@contextlib.contextmanager
def _gnupg_session(keys: Path | None) -> Iterator[Path]:
    """A short-lived GNUPGHOME holding a copy of ``keys`` (or nothing, to generate a key).

    The agent's socket lives in GNUPGHOME and a Unix socket path is limited to 108 bytes, so pytest's deep
    temporary paths make gpg fail with "can't connect to the agent"; the session therefore lives in a short
    directory below /tmp, and its agent is stopped so nothing outlives the call.
    """
    home = Path(tempfile.mkdtemp(prefix="ffgpg-", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        if keys is not None:
            shutil.copytree(keys, home, dirs_exist_ok=True)
        home.chmod(0o700)
        yield home
    finally:
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(home)},
            capture_output=True,
            check=False,
        )
        shutil.rmtree(home, ignore_errors=True)


def _gpg(home: Path, *args: str) -> bytes:
    env = {**os.environ, "GNUPGHOME": str(home)}
    return _run(["gpg", "--batch", "--yes", "--no-tty", *args], env=env)


def _generate_key(keys_out: Path, binding: str = "sha256") -> tuple[str, bytes]:
    """Generate the throwaway signing key into keys_out (a GNUPGHOME); returns (fingerprint, public key).

    binding "sha1": an RSA key whose user-ID self-signature (the binding apt's sqv checks) uses SHA-1,
    like NVIDIA's 3bf863cc; "sha256": an ed25519 key bound with SHA-256, like debian13's 8793F200."""
    if binding not in KEY_BINDINGS:
        raise AptRepoError(f"key binding must be one of {KEY_BINDINGS}, got {binding!r}")
    algorithm, digest = ("rsa3072", "SHA1") if binding == "sha1" else ("ed25519", "SHA256")
    with _gnupg_session(None) as home:
        _gpg(
            home,
            "--passphrase",
            "",
            "--cert-digest-algo",
            digest,
            "--quick-gen-key",
            "fleetfix test CUDA repository <cuda-repo@fleetfix.invalid>",
            algorithm,
            "sign",
            "never",
        )
        listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
        fingerprints = re.findall(r"^fpr:(?:[^:]*:){8}([0-9A-F]{40}):", listing, flags=re.MULTILINE)
        if not fingerprints:
            raise AptRepoError(f"no key fingerprint in gpg output: {listing!r}")
        public_key = _gpg(home, "--export", fingerprints[0])
        shutil.copytree(home, keys_out, ignore=shutil.ignore_patterns("S.*"))  # not the agent's sockets
    return fingerprints[0], public_key


def _scan_packages(directory: Path) -> bytes:
    """dpkg-scanpackages stanzas with Filename: ./NAME.deb (a flat repository)."""
    return _run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=directory)


def _cache_key(
    releases: Sequence[CudaRelease], distro: str, arch: str, real_13_0: bool, key_binding: str
) -> str:
    blob = json.dumps(
        [_CACHE_SCHEMA, [[r.version, r.release] for r in releases], distro, arch, real_13_0, key_binding]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _as_release(item: CudaRelease | tuple[str, str]) -> CudaRelease:
    return item if isinstance(item, CudaRelease) else CudaRelease(item[0], item[1])


def build_repo(
    workdir: Path,
    *,
    cuda_versions: Sequence[CudaRelease | tuple[str, str]] = DEFAULT_CUDA_RELEASES,
    distro: str = "debian12",
    arch: str = "x86_64",
    real_13_0: bool = False,
    key_binding: str = "sha256",
) -> BuiltRepo:
    """Build (or reuse from ``workdir``) the signing key and the .deb pool.

    ``key_binding="sha1"`` signs with a key bound the way NVIDIA's pre-debian13 key is, which apt 3
    (sqv) rejects: the way to reproduce "SHA1 is not considered secure since 2026-02-01".

    The cache directory is ``workdir/aptrepo-<hash of the parameters>``; it is built under a temporary name
    and renamed into place, so an interrupted build is never reused.
    """
    releases = tuple(_as_release(r) for r in cuda_versions)
    if not re.fullmatch(r"[a-z]+[0-9]+", distro) or not re.fullmatch(r"[a-z0-9_]+", arch):
        raise AptRepoError(f"distro/arch must look like debian12/x86_64, got {distro!r}/{arch!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    cache_dir = workdir / f"aptrepo-{_cache_key(releases, distro, arch, real_13_0, key_binding)}"
    common: dict[str, Any] = {
        "distro": distro,
        "arch": arch,
        "cuda_releases": releases,
        "real_13_0": real_13_0,
        "key_binding": key_binding,
    }
    # Parallel test workers on a fresh machine: one builds, the others wait and then reuse its key and pool
    # (a second build would sign with a key of its own that the cached directory does not hold).
    with cache_lock(cache_dir):
        return _build_repo_locked(cache_dir, releases, common)


def _cached_repo(cache_dir: Path, common: dict[str, Any]) -> BuiltRepo | None:
    manifest = cache_dir / "manifest.json"
    if not manifest.is_file():
        return None
    saved = json.loads(manifest.read_text())
    return BuiltRepo(cache_dir=cache_dir, key_fingerprint=saved["key_fingerprint"],
                     build_seconds=saved["build_seconds"], from_cache=True, **common)


def _build_repo_locked(cache_dir: Path, releases: tuple[CudaRelease, ...],
                       common: dict[str, Any]) -> BuiltRepo:
    cached = _cached_repo(cache_dir, common)
    if cached is not None:
        return cached
    workdir, arch, real_13_0 = cache_dir.parent, common["arch"], common["real_13_0"]

    started = time.monotonic()
    deb_arch = _DEB_ARCH.get(arch, "amd64")
    staging = Path(tempfile.mkdtemp(prefix=".aptrepo-build-", dir=workdir))
    try:
        fingerprint, public_key = _generate_key(staging / "gnupg", common["key_binding"])
        (staging / "cuda-archive-keyring.gpg").write_bytes(public_key)
        pool = staging / "pool"
        pool.mkdir()
        specs = [spec for r in releases for spec in toolkit_specs(r, deb_arch)] + driver_specs(deb_arch)
        for spec in specs:
            build_deb(spec, pool, scratch=staging)
        if real_13_0:
            # gzip -1: for nvcc+nvvm (185 MB) gzip -9 took 27 s, xz -1 17 s, gzip -1 3.3 s (77 MB) here.
            for spec in real_13_0_specs():
                build_deb(spec, pool, scratch=staging, compression="gzip", level=1)
        (staging / "Packages.pool").write_bytes(_scan_packages(pool))
        elapsed = time.monotonic() - started
        (staging / "manifest.json").write_text(
            json.dumps({"key_fingerprint": fingerprint, "build_seconds": elapsed})
        )
        try:
            staging.rename(cache_dir)
        except OSError:
            # A builder that takes no lock (an older checkout's session) won the race: use what it built,
            # whose key is not the one generated here.
            cached = _cached_repo(cache_dir, common)
            if cached is None:
                raise
            return cached
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuiltRepo(
        cache_dir=cache_dir, key_fingerprint=fingerprint, build_seconds=elapsed, from_cache=False, **common
    )


# --- publishing and serving ----------------------------------------------------------------------------


def _publish(built: BuiltRepo, root: Path, keyring_base_url: str) -> Path:
    """Lay out the flat repo under root for one base URL, and sign it. Returns the repo directory."""
    repo_dir = root / "compute" / "cuda" / "repos" / built.distro / built.arch
    repo_dir.mkdir(parents=True)
    for deb in built.pool_dir.glob("*.deb"):
        (repo_dir / deb.name).symlink_to(deb)  # http.server follows symlinks; no 300 MB copies
    keyring_stage = root / ".keyring"
    keyring_stage.mkdir()
    spec = keyring_spec(built.public_key.read_bytes(), keyring_base_url, built.distro, built.arch)
    keyring_deb = build_deb(spec, keyring_stage, scratch=keyring_stage)
    keyring_stanza = _scan_packages(keyring_stage)
    keyring_deb.rename(repo_dir / keyring_deb.name)
    shutil.rmtree(keyring_stage)

    packages = (built.cache_dir / "Packages.pool").read_bytes() + keyring_stanza
    (repo_dir / "Packages").write_bytes(packages)
    (repo_dir / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    release = _run(
        [
            "apt-ftparchive",
            "-o",
            f"APT::FTPArchive::Release::Origin={_RELEASE_ORIGIN}",
            "-o",
            f"APT::FTPArchive::Release::Label={_RELEASE_LABEL}",
            "release",
            ".",
        ],
        cwd=repo_dir,
    )
    (repo_dir / "Release").write_bytes(release)
    with _gnupg_session(built.gnupg_home) as home:
        signer = ["--local-user", built.key_fingerprint, "--digest-algo", "SHA256"]
        _gpg(home, *signer, "--clearsign", "--output", str(repo_dir / "InRelease"), str(repo_dir / "Release"))
        _gpg(
            home,
            *signer,
            "--armor",
            "--detach-sign",
            "--output",
            str(repo_dir / "Release.gpg"),
            str(repo_dir / "Release"),
        )
    return repo_dir


def _normalise_url_path(url_path: str) -> str:
    # apt asks for "<repo>/./NAME.deb" (Filename: ./NAME.deb in a flat repo); drop the "./" before matching.
    while "/./" in url_path:
        url_path = url_path.replace("/./", "/")
    return url_path


class _RepoHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Set before serving starts; read by the handler threads.
    document_root: str
    state: AptRepo


class _RepoRequestHandler(http.server.SimpleHTTPRequestHandler):
    server: _RepoHTTPServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, directory=self.server_root(args), **kwargs)

    @staticmethod
    def server_root(args: tuple[Any, ...]) -> str:
        # SimpleHTTPRequestHandler(request, client_address, server): the root lives on the server object.
        server = args[2]
        assert isinstance(server, _RepoHTTPServer)
        return server.document_root

    def _refuse_if_failing(self) -> bool:
        url_path = _normalise_url_path(self.path.split("?", 1)[0].split("#", 1)[0])
        state = self.server.state
        state.requests.append(f"{self.command} {url_path}")
        if state.is_failing(url_path):
            self.send_error(404, "File not found")
            return True
        return False

    def do_GET(self) -> None:
        if not self._refuse_if_failing():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._refuse_if_failing():
            super().do_HEAD()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded in AptRepo.requests instead of cluttering test output


@dataclass
class AptRepo:
    """A served repository. ``fail_paths``/``broken`` may be changed while it runs."""

    built: BuiltRepo
    root: Path  # the document root; the flat repo is root/compute/cuda/repos/<distro>/<arch>/
    host: str
    port: int
    keyring_base_url: str
    # URL paths answering 404: an exact path, or a prefix when the entry ends with "/".
    fail_paths: set[str] = field(default_factory=set)
    broken: bool = False  # every request answers 404 (a dead mirror)
    requests: list[str] = field(default_factory=list)  # "GET /compute/..." in arrival order
    trees: tuple[BuiltRepo, ...] = ()  # every distro/arch tree this server publishes (built first)
    _server: _RepoHTTPServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def distro(self) -> str:
        return self.built.distro

    @property
    def arch(self) -> str:
        return self.built.arch

    @property
    def base_url(self) -> str:
        """What a playbook's cuda_repo_base is: NVIDIA's https://developer.download.nvidia.com/compute/cuda/repos."""
        return f"http://{self.host}:{self.port}/compute/cuda/repos"

    @property
    def repo_url(self) -> str:
        return f"{self.base_url}/{self.distro}/{self.arch}/"

    @property
    def repo_path(self) -> str:
        """URL path of the flat repo directory, e.g. for ``fail_paths``."""
        return f"/compute/cuda/repos/{self.distro}/{self.arch}/"

    @property
    def repo_dir(self) -> Path:
        return self.root / "compute" / "cuda" / "repos" / self.distro / self.arch

    @property
    def keyring_filename(self) -> str:
        return f"{_KEYRING_NAME}_{_KEYRING_VERSION}_all.deb"

    @property
    def keyring_url(self) -> str:
        return self.repo_url + self.keyring_filename

    @property
    def sources_line(self) -> str:
        """The exact line the served keyring installs as /etc/apt/sources.list.d/cuda-<distro>-<arch>.list."""
        return (
            f"deb [signed-by={KEYRING_FILE}] {self.keyring_base_url.rstrip('/')}/{self.distro}/{self.arch}/ /"
        )

    def keyring_deb_path(self) -> Path:
        return self.repo_dir / self.keyring_filename

    def tree(self, distro: str, arch: str = "x86_64") -> AptRepo:
        """The same server seen through another of its trees (``serve_repo(..., more=...)``): repo_url,
        keyring and sources_line of that distro/arch. Stopping the view stops the server."""
        for built in self.trees:
            if (built.distro, built.arch) == (distro, arch):
                view = AptRepo(built=built, root=self.root, host=self.host, port=self.port,
                               keyring_base_url=self.keyring_base_url, trees=self.trees)
                view.fail_paths, view.requests = self.fail_paths, self.requests
                view._server, view._thread = self._server, self._thread
                return view
        raise AptRepoError(f"this server has no {distro}/{arch} tree")

    def deb_path(self, package: str) -> Path:
        return self.built.deb_path(package)

    def is_failing(self, url_path: str) -> bool:
        if self.broken:
            return True
        return any(url_path == p or (p.endswith("/") and url_path.startswith(p)) for p in self.fail_paths)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> AptRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_repo(
    built: BuiltRepo,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    keyring_base_url: str | None = None,
    more: Sequence[BuiltRepo] = (),
) -> AptRepo:
    """Publish ``built`` (and the ``more`` trees, e.g. a debian13/x86_64 one, each with its own key and
    keyring) for a freshly bound loopback port and serve it from a background thread.

    ``keyring_base_url`` is the BASE the served cuda-keyring's .list points at; by default this server's own
    ``base_url`` (pass another server's URL to play a mirror whose keyring names the upstream).
    """
    trees = (built, *more)
    if len({(tree.distro, tree.arch) for tree in trees}) != len(trees):
        raise AptRepoError("two trees for the same distro/arch")
    try:
        loopback = ipaddress.IPv4Address(host) in ipaddress.IPv4Network("127.0.0.0/8")
    except ValueError:
        loopback = False
    if not loopback:
        raise AptRepoError(f"the test repository serves on loopback only (127.0.0.0/8), not {host!r}")
    server = _RepoHTTPServer((host, port), _RepoRequestHandler, bind_and_activate=True)
    try:
        bound_port = int(server.server_address[1])
        root = Path(tempfile.mkdtemp(prefix=f"served-{bound_port}-", dir=built.cache_dir.parent))
        repo = AptRepo(built=built, root=root, host=host, port=bound_port, keyring_base_url="", trees=trees)
        repo.keyring_base_url = keyring_base_url or repo.base_url
        for tree in trees:
            _publish(tree, root, repo.keyring_base_url)
    except BaseException:
        server.server_close()
        raise
    server.document_root = str(root)
    server.state = repo
    thread = threading.Thread(target=server.serve_forever, name=f"aptrepo-{bound_port}", daemon=True)
    thread.start()
    repo._server, repo._thread = server, thread
    return repo


# --- running the host's real apt against a private configuration -----------------------------------------


@dataclass
class IsolatedApt:
    """Real apt-get/apt-cache with every path that matters moved under ``home``.

    Nothing of this machine's apt configuration is read (APT_CONFIG replaces apt.conf, ``Dir::Etc::parts``
    points at an empty directory) and nothing of its state is written. Sandboxing as ``_apt`` is disabled
    because ``home`` is usually below a 0700 pytest directory the ``_apt`` user cannot enter.
    """

    home: Path

    def __post_init__(self) -> None:
        h = self.home
        for sub in (
            "apt.conf.d",
            "sources.list.d",
            "trusted.gpg.d",
            "preferences.d",
            "state/lists/partial",
            "cache/archives/partial",
            "log",
            "dpkg",
        ):
            (h / sub).mkdir(parents=True, exist_ok=True)
        (h / "dpkg" / "status").touch()
        settings = {
            "Dir::Etc::main": h / "apt.conf",
            "Dir::Etc::parts": h / "apt.conf.d",
            "Dir::Etc::sourcelist": h / "sources.list",
            "Dir::Etc::sourceparts": h / "sources.list.d",
            "Dir::Etc::trusted": h / "trusted.gpg",
            "Dir::Etc::trustedparts": h / "trusted.gpg.d",
            "Dir::Etc::preferences": h / "preferences",
            "Dir::Etc::preferencesparts": h / "preferences.d",
            "Dir::State": h / "state",
            "Dir::State::status": h / "dpkg" / "status",
            "Dir::Cache": h / "cache",
            "Dir::Log": h / "log",
            "APT::Sandbox::User": "root",
            "Acquire::http::Proxy": "DIRECT",  # never route loopback traffic through an environment proxy
            "Acquire::Languages": "none",
            "Acquire::Retries": "0",
        }
        self.config_file.write_text("".join(f'{k} "{v}";\n' for k, v in settings.items()))

    @property
    def config_file(self) -> Path:
        return self.home / "isolated-apt.conf"

    @property
    def sources_dir(self) -> Path:
        return self.home / "sources.list.d"

    @property
    def trusted_dir(self) -> Path:
        return self.home / "trusted.gpg.d"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("APT_")}
        env.update(APT_CONFIG=str(self.config_file), LANG="C", LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
        return env

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run e.g. ``("apt-get", "update")``; returns the completed process (never raises on exit status)."""
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )


@contextlib.contextmanager
def served_repo(workdir: Path, **build_options: Any) -> Iterator[AptRepo]:
    """``with served_repo(tmp) as repo:`` — build (cached) and serve, stopping the server afterwards."""
    repo = serve_repo(build_repo(workdir, **build_options))
    try:
        yield repo
    finally:
        repo.stop()
