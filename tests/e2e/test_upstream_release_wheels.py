"""Issue 19 item 3's last part on the test bed, through the real CLI and the shipped build-extensions.yaml:
upstream's release wheel is used only when reachable and matching.

Three containers share the real torch 2.14.1 (cu130) venv and get the real nvcc 13.0 (cuda-toolkit.yaml);
the extension is our one-kernel fixture (tests/fixtures/extensions/fleetfix-tiny-ext), installed by name
from an sdist, with a catalog entry of its own in the inventory that names a release wheel the way
causal-conv1d's does. A and B build for arch 9.0, C for 8.0: two keys whose release wheel is one file (the
label says nothing of the arch). A loopback HTTPS stand-in for GitHub's release downloads and its REST API
(tests/lab/releases.py; each asset's sha256 `digest`), whose test CA the controller trusts through
SSL_CERT_FILE as an operator trusts an internal CA, serves, per scenario:

  d. upstream_wheels=false: the matching wheel is there; nothing asks for it (zero requests), A builds.
  a. the matching wheel (the real compiled module of (d)'s build, plus a RELEASE file that only it has):
     its digest asked of the API once, downloaded once, installed on A and B, import-checked, cached with
     its URL; no build.
  a'. the same wheel from a plain-http mirror, its sha256 pinned in a wheel lock (--wheel-lock): the API is
     not asked, the pin authenticates it, installed; no build.
  b+e. wheels whose label differs in one field each (CUDA, torch, ABI, Python, platform), and the matching
     name with bytes damaged before upstream published them (so its digest is theirs): no other label is
     asked for or installed; the matching name is asked once and refused on the controller; A builds.
  c. nothing listening on the release port: A and C (two keys) build, the output says why (no digest: the
     API cannot be asked), and the host is tried by one of them only.

Every scenario checks what is really there afterwards: `pip show -f` in the container, the stand-in's
request log, the cache manifest (`fleetfix wheels list`), and the wheel events of the run record.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import CliResult, run_cli
from tests.e2e.test_build_extensions import (  # noqa: F401  # session fixtures, used by name
    import_tiny,
    real_repo,
    real_torch,
)
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.cli import TINY_EXTENSION_SOURCE
from tests.lab.container import Container
from tests.lab.realtorch import RealTorch
from tests.lab.releases import ReleaseServer, github_api, make_wheel, refused_port
from tests.lab.tlsca import TestCA

pytestmark = [pytest.mark.slow]

TOOLKIT = "playbooks/cuda-toolkit.yaml"
BUILD = "playbooks/build-extensions.yaml"
SDISTS = "/srv/sdists"
VERSION = "0.1.0"
# causal-conv1d's scheme (its setup.py get_wheel_url(), docs/extensions.md), for our fixture.
RELEASE_PATH = ("/fleetfix/tiny-ext/releases/download/v{version}/fleetfix_tiny_ext-{version}"
                "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl")
CATALOG = {"fleetfix-tiny-ext": {"modules": ["fleetfix_tiny_cuda", "fleetfix_tiny"],
                                 "release_wheel": RELEASE_PATH}}
MARKER = "fleetfix_tiny/RELEASE"  # a file only the served wheel has
# The tag of every wheel here: Debian 12's python3 (the venv's) on this machine.
TAG = f"cp311-cp311-linux_{platform.machine()}"
PLAIN_NAME = f"fleetfix_tiny_ext-{VERSION}-{TAG}.whl"  # the PEP 427 name, as cached


def upstream_label(venv: RealTorch) -> dict[str, str]:
    """The label as upstream's setup.py computes it, from the real torch itself (not from fleetfix's facts):
    torch.version.cuda's major, torch's major.minor, torch._C._GLIBCXX_USE_CXX11_ABI, the Python tag."""
    script = ("import sys, torch; print(torch.version.cuda.split('.')[0], "
              "'.'.join(torch.__version__.split('+')[0].split('.')[:2]), "
              "torch._C._GLIBCXX_USE_CXX11_ABI, f'cp{sys.version_info[0]}{sys.version_info[1]}')")
    done = subprocess.run([str(venv.python), "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cuda_major, torch, abi, python_tag = done.stdout.split()
    return {"version": VERSION, "cuda_major": cuda_major, "torch": torch,
            "cxx11abi": str(abi == "True").upper(), "python_tag": python_tag,
            "platform": f"linux_{platform.machine()}"}


def sdist() -> bytes:
    """fleetfix-tiny-ext's source as an sdist, so that it is installed by name (the catalog's way)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for source in sorted(TINY_EXTENSION_SOURCE.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts and "build" not in source.parts:
                inside = source.relative_to(TINY_EXTENSION_SOURCE)
                archive.add(source, f"fleetfix_tiny_ext-{VERSION}/{inside}")
    return buffer.getvalue()


def release_wheel(built: Path) -> bytes:
    """Upstream's wheel stand-in: the modules of a real build of this key, plus MARKER, with dist-info
    written afresh (as the release workflow's bdist_wheel would)."""
    with zipfile.ZipFile(built) as wheel:
        files: dict[str, str | bytes] = {name: wheel.read(name) for name in wheel.namelist()
                                         if ".dist-info/" not in name}
    assert any(name.startswith("fleetfix_tiny_cuda.") and name.endswith(".so") for name in files), files
    files[MARKER] = "from the release stand-in\n"
    return make_wheel("fleetfix_tiny_ext", VERSION, TAG, files)


def damaged(wheel: bytes) -> bytes:
    """wheel with one byte flipped inside the compiled module's stored data: its zip directory still reads."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        member = next(info for info in archive.infolist() if info.filename.endswith(".so"))
    name_length = int.from_bytes(wheel[member.header_offset + 26:member.header_offset + 28], "little")
    extra_length = int.from_bytes(wheel[member.header_offset + 28:member.header_offset + 30], "little")
    offset = member.header_offset + 30 + name_length + extra_length + member.compress_size // 2
    return wheel[:offset] + bytes([wheel[offset] ^ 0xFF]) + wheel[offset + 1:]


def inventory(path: Path, lab: Lab, cts: Sequence[tuple[Container, str]], python: Path) -> Path:
    node = lab.node()
    document = {
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{"name": node.name, "address": node.address, "port": node.port, "containers": [
            {"ctid": ct.ctid, "vars": {"python": str(python), "cuda_arch_list": arch,
                                       "extension_catalog": CATALOG}} for ct, arch in cts]}],
    }
    path.write_text(yaml.safe_dump(document))
    return path


def wheel_events(state: Path, run_id: str) -> dict[str, dict[str, Any]]:
    lines = (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return {event["target"].rpartition("/")[2]: event for event in map(json.loads, lines)
            if event["kind"] == "wheel"}


def installed(ct: Container, venv: RealTorch) -> str:
    """What pip says is installed in ct, with its files: "0.1.0 upstream", "0.1.0 built" or "absent"."""
    shown = ct.sh(f"{venv.python} -m pip show -f fleetfix-tiny-ext", check=False, timeout=120)
    if shown.returncode != 0:
        return "absent"
    text = shown.stdout.decode()
    version = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Version:"))
    return f"{version} {'upstream' if MARKER in text else 'built'}"


@pytest.mark.timeout(2400)
def test_the_release_wheel_is_used_only_when_reachable_and_matching(
    lab: Lab, make_ct: Callable[..., Container], real_torch: RealTorch,  # noqa: F811
    real_repo: AptRepo, tmp_path: Path,  # noqa: F811
) -> None:
    label = upstream_label(real_torch)
    assert (label["cuda_major"], label["python_tag"]) == ("13", "cp311")  # what PLAIN_NAME and the key say
    served = RELEASE_PATH.format_map(label)
    api = f"/api/v3/repos/fleetfix/tiny-ext/releases/tags/v{VERSION}"  # GitHub Enterprise Server's layout
    ca = TestCA(tmp_path / "ca")
    a, b, c = (make_ct(share=(str(real_torch.venv),)) for _ in range(3))
    for ct in (a, b, c):
        ct.write_file(f"{SDISTS}/fleetfix_tiny_ext-{VERSION}.tar.gz", sdist())
    inv = {name: inventory(tmp_path / f"{name}.yaml", lab, cts, real_torch.python)
           for name, cts in (("all", [(a, "9.0"), (b, "9.0"), (c, "8.0")]), ("a", [(a, "9.0")]),
                             ("ab", [(a, "9.0"), (b, "9.0")]), ("ac", [(a, "9.0"), (c, "8.0")]))}
    state, cache = tmp_path / "state", tmp_path / "wheels"
    toolkit = run_cli("apply", TOOLKIT, "-i", str(inv["all"]), "--state-dir", str(state),
                      "--var", f"cuda_repo_base={real_repo.base_url}", timeout=900)
    assert toolkit.exit_code == 0, toolkit.stdout[-3000:] + toolkit.stderr[-3000:]

    def apply(targets: str, release_url: str, *extra: str, as_json: bool = True) -> tuple[CliResult, str]:
        done = run_cli("apply", BUILD, "-i", str(inv[targets]), "--state-dir", str(state),
                       "--wheel-cache", str(cache), "--var", f"extensions=fleetfix-tiny-ext=={VERSION}",
                       "--var", f"pip_args=--no-index --find-links {SDISTS}",
                       "--var", f"release_wheels_url={release_url}", *extra, *(["--json"] if as_json else []),
                       timeout=1200, env=ca.env())
        assert done.exit_code == 0, done.stdout[-4000:] + done.stderr[-3000:]
        run_id = max(run["run_id"] for run in
                     run_cli("runs", "list", "--state-dir", str(state), "--json").json())
        return done, run_id

    def entries() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = run_cli("wheels", "list", "--wheel-cache", str(cache), "--json").json()
        return listed

    def start_over(*cts: Container) -> None:
        for ct in cts:
            ct.sh(f"{real_torch.python} -m pip uninstall -y -q fleetfix-tiny-ext")
            assert installed(ct, real_torch) == "absent"
        assert run_cli("wheels", "purge", "--all", "--wheel-cache", str(cache)).exit_code == 0
        assert entries() == []

    placeholder = make_wheel("fleetfix_tiny_ext", VERSION, TAG,
                             {"fleetfix_tiny_cuda.py": "", "fleetfix_tiny/__init__.py": "", MARKER: ""})

    # d. The off switch: the matching wheel is published, and nobody asks for it.
    with ReleaseServer({served: placeholder, **github_api({served: placeholder})}, tls=ca) as server:
        _, run_id = apply("a", server.url, "--var", "upstream_wheels=false")
        assert sum(server.requests.values()) == 0, server.requests
    (event,) = wheel_events(state, run_id).values()
    assert event["action"] == "built" and "upstream" not in event, event
    assert installed(a, real_torch) == "0.1.0 built" and import_tiny(a, real_torch) == "13000"
    (entry,) = entries()
    assert entry["source"] == "build" and entry["wheel"] == PLAIN_NAME
    upstream = release_wheel(next(cache.glob(f"*/{PLAIN_NAME}")))

    # a. The matching wheel: its digest asked of the API and downloaded once for the key, installed and
    # import-checked on A and B, cached with its URL; no build anywhere.
    start_over(a)
    with ReleaseServer({served: upstream, **github_api({served: upstream})}, tls=ca) as server:
        assert server.url.startswith("https://")
        _, run_id = apply("ab", server.url)
        assert dict(server.requests) == {api: 1, served: 1}
        events = wheel_events(state, run_id)
        actions = sorted(e["action"] for e in events.values())
        assert actions == ["installed-from-cache", "installed-from-upstream"], events
        (fetched,) = [e for e in events.values() if e["action"] == "installed-from-upstream"]
        assert fetched["url"] == server.url + served
        assert fetched["sha256"] == hashlib.sha256(upstream).hexdigest()
        for ct in (a, b):
            assert installed(ct, real_torch) == "0.1.0 upstream"
            assert import_tiny(ct, real_torch) == "13000"
        (entry,) = entries()
        assert (entry["source"], entry["built_on"]) == (server.url + served, "upstream")
        assert entry["wheel"] == PLAIN_NAME
        assert entry["sha256"] == hashlib.sha256(upstream).hexdigest() and not entry["build_seconds"]
        # A second apply changes nothing and asks upstream nothing.
        again, _ = apply("ab", server.url)
        assert sum(target["counts"]["changed"] for target in again.json()["targets"]) == 0
        assert dict(server.requests) == {api: 1, served: 1}

    # a'. A plain-http mirror, the wheel's sha256 pinned in the fleet's wheel lock: the pin authenticates it
    # (the API is not asked), installed; no build.
    start_over(a)
    with ReleaseServer({served: upstream}) as mirror:
        assert mirror.url.startswith("http://")
        lock = tmp_path / "wheels.lock"
        lock.write_text(yaml.safe_dump({"wheels": {"fleetfix-tiny-ext": {
            mirror.url + served: f"sha256:{hashlib.sha256(upstream).hexdigest()}"}}}))
        _, run_id = apply("a", mirror.url, "--wheel-lock", str(lock))
        assert dict(mirror.requests) == {served: 1}
    (event,) = wheel_events(state, run_id).values()
    assert event["action"] == "installed-from-upstream" and event["url"] == mirror.url + served, event
    assert installed(a, real_torch) == "0.1.0 upstream" and import_tiny(a, real_torch) == "13000"

    # b + e. Published for other labels (one field off each), and under the key's own name damaged bytes:
    # no other label is asked for or installed; the right name is refused on the controller before it goes
    # anywhere; A builds. (One apply for both: each fallback is a real build. A 404 for the key's own name is
    # in tests/unit/playbook/test_upstream_wheels.py.)
    start_over(a)
    others = {field: RELEASE_PATH.format_map({**label, field: value}) for field, value in
              (("cuda_major", "12"), ("torch", "2.13"), ("cxx11abi", "FALSE"), ("python_tag", "cp312"),
               ("platform", "linux_aarch64" if label["platform"] != "linux_aarch64" else "linux_x86_64"))}
    assert served not in others.values()
    published = {**dict.fromkeys(others.values(), upstream), served: damaged(upstream)}
    with ReleaseServer({**published, **github_api(published)}, tls=ca) as server:
        _, run_id = apply("a", server.url)
        assert dict(server.requests) == {api: 1, served: 1}, server.requests
    (event,) = wheel_events(state, run_id).values()
    assert event["action"] == "built", event
    assert "refused: not a readable wheel (bad CRC-32 for fleetfix_tiny_cuda." in event["upstream"], event
    assert installed(a, real_torch) == "0.1.0 built" and import_tiny(a, real_torch) == "13000"
    assert [e["source"] for e in entries()] == ["build"]
    assert run_cli("wheels", "verify", "--wheel-cache", str(cache)).exit_code == 0

    # c. Nothing listens on the release port: two keys (A, C) build, the output says why (the API that would
    # give the digest cannot be asked), and only one of them tried the host (targets ask at the same moment:
    # the other waited for that try's outcome, the release's answer kept for the run).
    start_over(a)
    with refused_port() as port:
        fallback, run_id = apply("ac", f"https://127.0.0.1:{port}", as_json=False)
    events = wheel_events(state, run_id)
    assert sorted(events) == sorted([str(a.ctid), str(c.ctid)])
    assert all(e["action"] == "built" for e in events.values()), events
    reasons = [e["upstream"] for e in events.values()]
    why = (f"asking https://127.0.0.1:{port}{api}: cannot reach 127.0.0.1: [Errno 111] Connection refused")
    assert reasons[0] == reasons[1] and f"against ({why}); not fetched" in reasons[0], reasons
    assert f"(upstream: {reasons[0]})" in fallback.stdout, fallback.stdout[-3000:]
    for ct in (a, c):
        assert installed(ct, real_torch) == "0.1.0 built" and import_tiny(ct, real_torch) == "13000"
    assert sorted(e["source"] for e in entries()) == ["build", "build"]
