"""The real torch (CUDA 13.0 build) for Debian 13 containers: an overlay layer over the trixie template.

realtorch.py's venv is built with this machine's python 3.11 and lives in this machine's /opt, which a
container of the Debian 13 template neither sees nor could run (trixie's python3 is 3.13). So the same
torch release is installed once, the way an operator of a trixie container would: inside a container of
the template, `apt-get install python3-dev python3-venv` from the Debian mirror this machine's apt uses,
`python3 -m venv /opt/fleetfix-torch-<version>`, and `pip install torch==<version>` there from a wheelhouse
of the cp313 wheels (torch, triton, cuda-bindings and markupsafe from PyPI; NVIDIA's py3-none CUDA
wheels from PyPI or this machine's index, whichever pip reaches). What that container wrote (its
overlay upper dir: the venv, the Python headers, dpkg's database) is kept as a layer:

    layer = ensure_torch_layer(ensure_template("trixie"))
    make_ct(template=(layer.path, layer.template))       # lowerdir=LAYER:TRIXIE, read-only

The apt sources, lists and downloaded .debs are removed before the layer is kept, so a container of it is
as hermetic as the template. Built once per machine (see docs/testbed.md for the time and size) under the
template cache, next to the template it extends; an flock serialises concurrent sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.lab.container import NodeState
from tests.lab.realtorch import BUILD_REQUIREMENTS, REAL_TORCH_CUDA, REAL_TORCH_VERSION, file_lock
from tests.lab.template import Template, configured_debian_mirror

# Bump when what goes into the layer changes, so a stale layer is not reused.
_SCHEMA = 1
# Debian's packages an extension build in a venv needs beyond the template: Python.h, and ensurepip for
# `python3 -m venv` (Debian splits both out of python3.13).
DEBIAN_PACKAGES = ("python3-dev", "python3-venv")
_BUILD_CTID = 100


class TorchLayerError(RuntimeError):
    """The layer could not be built (pip download, apt-get, pip install or the import check failed)."""


@dataclass(frozen=True)
class TorchLayer:
    path: Path            # the layer directory (an overlay upper dir): put it above `template`
    template: Path        # the root filesystem it extends
    venv: str             # the venv's path inside a container
    version: str          # torch.__version__, e.g. 2.14.1+cu130
    cuda: str             # torch.version.cuda
    build_seconds: float | None
    from_cache: bool

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def layers(self) -> tuple[Path, Path]:
        """What make_ct(template=...) takes: this layer over the template."""
        return (self.path, self.template)


def _python_tag(rootfs: Path) -> tuple[str, str]:
    """("313", "41"): the template's python3 and glibc, for pip's --python-version and --platform."""
    python = os.readlink(rootfs / "usr/bin/python3")
    found = re.fullmatch(r"python3\.(\d+)", python)
    libc = sorted((rootfs / "usr/lib/x86_64-linux-gnu").glob("libc.so.6"))
    if not found or not libc:
        raise TorchLayerError(f"{rootfs}: no usr/bin/python3 -> python3.N or no libc.so.6")
    glibc = re.search(rb"GNU C Library[^\n]*release version 2\.(\d+)", libc[0].read_bytes())
    if not glibc:
        raise TorchLayerError(f"{libc[0]}: no glibc version string")
    return f"3{found.group(1)}", glibc.group(1).decode()


def _platforms(glibc_minor: int) -> list[str]:
    # Every manylinux tag this glibc runs (PEP 600), plus the legacy aliases some NVIDIA wheels carry alone
    # (nvidia-cusparselt-cu13 is tagged manylinux2014 only): pip matches --platform tags literally.
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def download_wheels(dest: Path, python_tag: str, glibc_minor: int, version: str = REAL_TORCH_VERSION) -> None:
    """torch==VERSION and the extension build requirements, with all their dependencies, as wheels for
    CPython 3.N on x86_64 glibc (pip download, from PyPI or this machine's index)."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
            "--python-version", f"{python_tag[0]}.{python_tag[1:]}", "--implementation", "cp",
            "--abi", f"cp{python_tag}", "--abi", "abi3", "--abi", "none", "-d", str(dest)]
    for platform in _platforms(glibc_minor):
        argv += ["--platform", platform]
    done = subprocess.run([*argv, f"torch=={version}", *BUILD_REQUIREMENTS], capture_output=True,
                          text=True, timeout=1800, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise TorchLayerError(f"pip download for cp{python_tag} failed: {tail}")


def _install_script(venv: str, version: str, mirror: str) -> str:
    packages = " ".join(DEBIAN_PACKAGES)
    requirements = " ".join(shlex.quote(r) for r in (f"torch=={version}", *BUILD_REQUIREMENTS))
    return f"""set -eu
export DEBIAN_FRONTEND=noninteractive HOME=/root
cat > /etc/apt/sources.list.d/fleetfix-layer-build.sources <<'EOF'
Types: deb
URIs: {mirror}
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt-get -qq update
apt-get install -y -qq --no-install-recommends {packages} >/dev/null
# Hermetic again: no source, no lists, no downloaded .debs (as tests/lab/template.py leaves the template).
rm -f /etc/apt/sources.list.d/fleetfix-layer-build.sources /var/cache/apt/*.bin
find /var/lib/apt/lists -maxdepth 1 -type f -delete
apt-get clean
python3 -m venv {shlex.quote(venv)}
{shlex.quote(venv)}/bin/python -m pip install --quiet --no-index --no-cache-dir \
    --find-links /fleetfix-wheels {requirements}
rm -rf /fleetfix-wheels
{shlex.quote(venv)}/bin/python -c 'import torch; print(torch.__version__, torch.version.cuda)'
"""


def _key(template: Template, version: str) -> str:
    blob = json.dumps([_SCHEMA, template.rootfs.name, version, DEBIAN_PACKAGES, BUILD_REQUIREMENTS])
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _build(template: Template, version: str, venv: str, final: Path) -> tuple[str, str]:
    staging = Path(tempfile.mkdtemp(prefix=".torch-layer-", dir=final.parent))
    node = NodeState.create(staging / "node", "layer-build")
    ct = node.create_container(_BUILD_CTID, template=template.rootfs)
    try:
        python_tag, glibc_minor = _python_tag(template.rootfs)
        # Straight into the stopped container's upper dir: it sees /fleetfix-wheels without a copy.
        download_wheels(ct.upper_dir / "fleetfix-wheels", python_tag, int(glibc_minor), version)
        ct.start()
        done = ct.sh(_install_script(venv, version, configured_debian_mirror()), check=False, timeout=1800)
        ct.stop()
        reported = done.stdout.decode().split()
        if done.returncode != 0 or len(reported) != 2 or not reported[0].startswith(version):
            raise TorchLayerError(f"torch {version} layer: exit {done.returncode}: "
                                  f"{(done.stdout + done.stderr).decode(errors='replace')[-2000:]}")
        (ct.upper_dir / "etc/hostname").unlink()   # each container writes its own
        os.rename(ct.upper_dir, final)
        return reported[0], reported[1]
    finally:
        ct.destroy()
        shutil.rmtree(staging, ignore_errors=True)


def ensure_torch_layer(template: Template, version: str = REAL_TORCH_VERSION) -> TorchLayer:
    """The layer with the real torch VERSION in a venv of the template's python3, built now if missing."""
    venv = f"/opt/fleetfix-torch-{version}"
    final = template.rootfs.parent / f"{template.rootfs.name}-torch-{version}-{_key(template, version)}"
    meta = final.with_name(final.name + ".json")
    with file_lock(final.with_name(f".{final.name}.lock")):
        if final.is_dir() and meta.is_file():
            saved = json.loads(meta.read_text())
            return TorchLayer(final, template.rootfs, venv, saved["version"], saved["cuda"],
                              saved.get("build_seconds"), True)
        shutil.rmtree(final, ignore_errors=True)   # a layer whose build was killed before its record
        started = time.monotonic()
        reported, cuda = _build(template, version, venv, final)
        seconds = time.monotonic() - started
        if cuda != REAL_TORCH_CUDA:
            raise TorchLayerError(f"torch {reported} reports CUDA {cuda}, not {REAL_TORCH_CUDA}")
        meta.write_text(json.dumps({"version": reported, "cuda": cuda, "build_seconds": round(seconds, 1)}))
        return TorchLayer(final, template.rootfs, venv, reported, cuda, seconds, False)
