"""Container templates built from Debian's own packages: a Debian 13 (trixie) root filesystem for the
test bed, so apt 3 with Sequoia's sqv, deb822 sources and gcc 14 are the real thing, not stand-ins.

    rootfs = ensure_template("trixie")      # built once per machine, then reused
    node.create_container(200, template=rootfs)

`debootstrap --variant=minbase` from the Debian mirror this machine's own apt is configured with (no
other network), plus python3 and gcc/g++/make (gcc 14 is what a trixie container builds extensions
with). The result is made hermetic before it is cached: no apt sources, no package lists, no downloaded
.debs, so a container from it can reach nothing but the test bed's loopback repository. It is cached as a
tarball (what CI keeps between runs) and unpacked next to it (what the overlay containers use as their
lower directory). Measured on the 2-core test machine: see docs/testbed.md.

Standard library and tests/lab/locks.py only (the node's `pct` stand-in imports container.py, which imports
nothing from here).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:  # the suite imports tests.lab.template; the qm stand-in (through qemuvm.py) puts tests/lab on sys.path
    from tests.lab.locks import cache_lock
except ImportError:
    from locks import cache_lock  # type: ignore[no-redef]

# Bump when what goes into the template changes, so stale caches are not reused.
_SCHEMA = 1
CACHE_ENV = "FLEETFIX_LAB_CACHE"
DEFAULT_CACHE = Path("/var/cache/fleetfix-lab")
MIRROR_ENV = "FLEETFIX_DEBIAN_MIRROR"


@dataclass(frozen=True)
class TemplateSpec:
    suite: str
    version_id: str
    packages: tuple[str, ...]


TEMPLATES: dict[str, TemplateSpec] = {
    # gcc/g++/make: what a CUDA extension build needs besides nvcc; trixie's gcc is 14.
    "trixie": TemplateSpec("trixie", "13", ("python3", "gcc", "g++", "make")),
    # The disk of a real QEMU VM (tests/lab/qemuvm.py): Debian 12 like this machine, so the VM meets the
    # same repository tree as the containers; its own guest agent, kmod to load the cloud kernel's
    # virtio modules, iproute2 for its one network interface.
    "bookworm-vm": TemplateSpec("bookworm", "12", ("python3", "qemu-guest-agent", "kmod", "iproute2")),
}
# Left out of the cached template: documentation, translations, and apt's downloads/indexes.
_PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt/archives",
          "var/lib/apt/lists")


class TemplateError(RuntimeError):
    """The template could not be built (no debootstrap, no mirror, a failed step)."""


@dataclass(frozen=True)
class Template:
    name: str
    rootfs: Path
    tarball: Path
    build_seconds: float | None    # the debootstrap run that produced the tarball (None: from an older cache)
    from_cache: bool


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def configured_debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 URIs: or a one-line `deb URI suite`), so the
    template comes from where this machine already gets its packages; FLEETFIX_DEBIAN_MIRROR overrides."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override.rstrip("/")
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for uri in re.findall(r"^\s*URIs:\s*(\S+)", text, flags=re.MULTILINE | re.IGNORECASE):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
        for uri in re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s", text, flags=re.MULTILINE):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    raise TemplateError(f"no Debian mirror in this machine's apt sources; set {MIRROR_ENV}")


def _key(spec: TemplateSpec) -> str:
    blob = json.dumps([_SCHEMA, spec.suite, spec.packages, _PRUNE])
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _run(argv: list[str], *, timeout: float) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as error:
        raise TemplateError(f"{argv[0]} is not installed (apt-get install debootstrap)") from error
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-2000:]
        raise TemplateError(f"{' '.join(argv[:3])} ... failed (exit {done.returncode}): {tail}")


def _make_hermetic(root: Path) -> None:
    """No way out of the test bed: apt knows no source; only a test's own repository will be added."""
    for relative in _PRUNE:
        target = root / relative
        if target.is_dir():
            shutil.rmtree(target)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    for partial in (root / "var/cache/apt/archives/partial", root / "var/lib/apt/lists/partial"):
        shutil.chown(partial, user="root", group="root")
        partial.chmod(0o700)
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    for entry in (root / "etc/apt/sources.list.d").glob("*"):
        entry.unlink()
    for cache in (root / "var/cache/apt").glob("*.bin"):
        cache.unlink()
    (root / "etc/hostname").write_text("localhost\n")


def _build(spec: TemplateSpec, tarball: Path) -> float:
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".build-{spec.suite}-", dir=tarball.parent))
    try:
        root = staging / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(spec.packages)}", spec.suite,
              str(root), configured_debian_mirror()], timeout=1800)
        _make_hermetic(root)
        partial = staging / "template.tar.gz"
        # gzip -1: ~3x smaller than plain tar for a cache upload, and a second or two to unpack.
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-I", "gzip -1", "-cf",
              str(partial), "."], timeout=600)
        os.replace(partial, tarball)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - started
    tarball.with_suffix(".json").write_text(json.dumps({"build_seconds": round(seconds, 1)}))
    return seconds


def _unpack(tarball: Path, rootfs: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=rootfs.parent))
    try:
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(staging), "-xzf", str(tarball)], timeout=600)
        staging.rename(rootfs)   # atomic: a half-unpacked tree never becomes a lower directory
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def ensure_template(name: str = "trixie", *, directory: Path | None = None) -> Template:
    """The template's unpacked root filesystem, building (debootstrap) or unpacking it when missing."""
    spec = TEMPLATES[name]
    base = directory or cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    stem = f"debian{spec.version_id}-{spec.suite}-{_key(spec)}"
    tarball, rootfs = base / f"{stem}.tar.gz", base / stem
    # Parallel test workers on a fresh machine: one builds, the others wait and then reuse it.
    with cache_lock(rootfs):
        from_cache = tarball.is_file()
        seconds: float | None = None
        if not from_cache:
            seconds = _build(spec, tarball)
        else:
            with_meta = tarball.with_suffix(".json")
            if with_meta.is_file():
                seconds = json.loads(with_meta.read_text()).get("build_seconds")
        if not rootfs.is_dir():
            _unpack(tarball, rootfs)
    return Template(name, rootfs, tarball, seconds, from_cache)
