"""Upstream's prebuilt release wheels: which file a wheel-cache key asks for, and whether a file is that one.

causal-conv1d, mamba-ssm and flash-attn publish wheels on their GitHub releases, one per combination of
CUDA major, torch major.minor, C++ ABI, Python and platform. Each one's setup.py names the file in
`get_wheel_url()` (docs/extensions.md cites the lines), and the release workflow uploads exactly that name
(bdist_wheel's own name with the label inserted after the version):

    {dist}-{version}+cu{CUDA major}torch{torch X.Y}cxx11abi{TRUE|FALSE}-{cpXY}-{cpXY}-linux_{machine}.whl

A playbook gives the URL per extension as a template whose placeholders (`PLACEHOLDERS`) this module fills
from the key. The result's file name is then parsed back and every field compared with the key, so a
template that hard-codes a field, or a key this scheme cannot express (a pre-release or NGC torch, a CUDA
major no setup.py maps, an unknown ABI), gives no candidate rather than a wrong wheel. All of that is pure.

`ReleaseDigests` says which sha256 the file must have before it is fetched: the operator's wheel lock
(`wheels/lock.py`), else the digest GitHub's REST API publishes for the release asset, asked through the
run's `Fetcher`.
"""

from __future__ import annotations

import re
import string
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from fleetfix import boundedjson
from fleetfix.wheels.cache import canonical_name
from fleetfix.wheels.httpfetch import Expected, Fetcher, FetchError, scheme_of
from fleetfix.wheels.lock import WheelLock

PLACEHOLDERS = ("version", "cuda_major", "torch", "cxx11abi", "python_tag", "platform")
# The key fields the label is derived from (build-extensions.yaml's wheels key has them all).
KEY_FIELDS = ("python_tag", "torch", "torch_cuda", "cxx11_abi", "machine")

# The CUDA majors the three setup.py files map to a cuN label (causal-conv1d and mamba-ssm raise on any
# other; flash-attn would ask for cu13 for anything above 12, which we do not follow).
_CUDA_MAJORS = frozenset({"11", "12", "13"})
# bdist_wheel's platform tag on the release runners (ubuntu-22.04, ubuntu-22.04-arm).
_PLATFORMS = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}
# A final torch release, with pip's +cuXYZ local label or none. Pre-releases are refused: NGC's torch
# (2.6.0a0+ecf3bae40a) gets wheels under another label (NVIDIA_PYTORCH_VERSION), nightlies none at all.
_FINAL_TORCH = re.compile(r"^(\d+)\.(\d+)\.\d+(\+[A-Za-z0-9.]+)?$")
_CUDA = re.compile(r"^(\d+)\.\d+$")
_PYTHON_TAG = re.compile(r"^cp3\d+$")
_PUBLIC_VERSION = re.compile(r"^\d[0-9A-Za-z.!]*$")  # a release tag v{version} exists only without +local
_RELEASE_NAME = re.compile(
    r"^(?P<dist>[A-Za-z0-9_.]+)-(?P<version>\d[0-9A-Za-z.!]*)"
    r"\+cu(?P<cuda_major>\d+)torch(?P<torch>\d+\.\d+)cxx11abi(?P<cxx11abi>TRUE|FALSE)"
    r"-(?P<python_tag>[^-]+)-(?P<abi_tag>[^-]+)-(?P<platform>[^-]+)\.whl$")


@dataclass(frozen=True)
class Label:
    """What a release wheel's file name says, as the key demands it."""

    version: str
    cuda_major: str  # "12"
    torch: str  # "2.8"
    cxx11abi: str  # "TRUE" | "FALSE"
    python_tag: str  # "cp312"
    platform: str  # "linux_x86_64"

    def placeholders(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in PLACEHOLDERS}


@dataclass(frozen=True)
class Candidate:
    """The release wheel of one key: where it is, and the names it goes by."""

    url: str
    filename: str  # as published, with the label
    # The same wheel under the plain PEP 427 name: its metadata version has no label (the workflow only
    # renames the file), so pip refuses the published name as inconsistent; upstream's setup.py renames
    # it the same way before pip installs it.
    install_name: str
    tag: str  # the wheel's compatibility tag, cpXY-cpXY-linux_<machine>


def label_for(key: Mapping[str, str]) -> Label | str:
    """The label key asks for, or why this scheme cannot express the key."""
    absent = [name for name in ("version", *KEY_FIELDS) if not key.get(name)]
    if absent:
        return f"the key has no {', '.join(absent)}"
    version, torch, cuda = key["version"], key["torch"], key["torch_cuda"]
    if not _PUBLIC_VERSION.match(version):
        return f"version {version} is not a public release version"
    torch_found = _FINAL_TORCH.match(torch)
    if torch_found is None:
        return f"torch {torch} is not a final release (pre-release and NGC builds have no such label)"
    cuda_found = _CUDA.match(cuda)
    if cuda_found is None or cuda_found[1] not in _CUDA_MAJORS:
        return f"torch's CUDA {cuda} has no release label (only CUDA {', '.join(sorted(_CUDA_MAJORS))})"
    abi = {"1": "TRUE", "0": "FALSE"}.get(key["cxx11_abi"])
    if abi is None:
        return f"C++ ABI {key['cxx11_abi']!r} is not 1 or 0"
    if not _PYTHON_TAG.match(key["python_tag"]):
        return f"python tag {key['python_tag']} is not CPython 3"
    platform = _PLATFORMS.get(key["machine"])
    if platform is None:
        return f"machine {key['machine']} has no release wheels (only {', '.join(sorted(_PLATFORMS))})"
    return Label(version, cuda_found[1], f"{torch_found[1]}.{torch_found[2]}", abi, key["python_tag"],
                 platform)


def mismatch(filename: str, key: Mapping[str, str]) -> str | None:
    """Why the release wheel filename is not exactly the key's (None: every field matches)."""
    found = _RELEASE_NAME.match(filename)
    if found is None:
        return (f"{filename} is not named {{dist}}-{{version}}+cu{{N}}torch{{X.Y}}cxx11abi{{TRUE|FALSE}}"
                "-{python}-{abi}-{platform}.whl")
    if canonical_name(found["dist"]) != key.get("name"):
        return f"{filename} is {canonical_name(found['dist'])}, not {key.get('name')}"
    wanted = label_for(key)
    if isinstance(wanted, str):
        return wanted
    differing = [f"{name} {found[name]} (the key's: {value})" for name, value in wanted.placeholders().items()
                 if found[name] != value]
    if found["abi_tag"] != wanted.python_tag:
        differing.append(f"abi tag {found['abi_tag']} (the key's: {wanted.python_tag})")
    return f"{filename} differs from the key: {', '.join(differing)}" if differing else None


def candidate(template: str, key: Mapping[str, str]) -> Candidate | str:
    """The release wheel template names for key, or why there is none. template is a URL with the
    placeholders {version}, {cuda_major}, {torch}, {cxx11abi}, {python_tag}, {platform}."""
    label = label_for(key)
    if isinstance(label, str):
        return label
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        unknown = sorted(used - set(PLACEHOLDERS))
        if unknown:
            return f"the URL template has unknown placeholders: {', '.join(unknown)}"
        url = template.format_map(label.placeholders())
    except (ValueError, IndexError) as error:
        return f"the URL template is malformed ({error})"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return f"not an http(s) URL of a file: {url}"
    filename = urllib.parse.unquote(parts.path.rpartition("/")[2])
    problem = mismatch(filename, key)
    if problem is not None:
        return problem
    found = _RELEASE_NAME.match(filename)
    assert found is not None  # mismatch() parsed it
    tag = f"{found['python_tag']}-{found['abi_tag']}-{found['platform']}"
    return Candidate(url, filename, f"{found['dist']}-{found['version']}-{tag}.whl", tag)


# --- which sha256 a release wheel must have ------------------------------------------------------------

GITHUB_API = "https://api.github.com"
# GitHub Enterprise Server serves the same REST API under /api/v3 of its own host
# (docs.github.com/en/enterprise-server@3.15/rest/releases/releases: "http(s)://HOSTNAME/api/v3/repos/...").
ENTERPRISE_API_PATH = "/api/v3"
MAX_API_BYTES = 16 * 1024 * 1024  # one release's JSON: hundreds of assets are a few hundred kB
_DOWNLOAD_PATH = re.compile(
    r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+)/releases/download/(?P<tag>[^/]+)/(?P<file>[^/]+)$")
_API_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
# The media type GitHub's REST reference recommends sending ("Setting to application/vnd.github+json is
# recommended", docs.github.com/en/rest/releases/releases).
_API_MEDIA_TYPE = "application/vnd.github+json"


def release_api_url(url: str) -> str | None:
    """The REST API address of the release url is an asset of (GET a release by tag name), or None when
    url is not a release download at a host's root: github.com's assets are described by api.github.com,
    any other host's (GitHub Enterprise Server, or a mirror that serves its API too) by its own /api/v3."""
    parts = urllib.parse.urlsplit(url)
    found = _DOWNLOAD_PATH.match(parts.path)
    if found is None or not parts.hostname:
        return None
    path = f"/repos/{found['owner']}/{found['repo']}/releases/tags/{found['tag']}"
    if parts.hostname.lower() == "github.com":
        return GITHUB_API + path
    return f"https://{parts.netloc}{ENTERPRISE_API_PATH}{path}"


class ReleaseDigests:
    """Where the sha256 of a release wheel comes from (an `httpfetch.Authenticator`): the operator's wheel
    lock first (a pin; it authenticates even a plain-http mirror), else the `digest` GitHub's REST API
    gives each release asset ("sha256:<hex>"; docs/findings.md), asked over https once per release and
    run. An asset without a digest, an API that does not answer, or an answer that does not parse: no
    digest, and the fetcher refuses the file unless the operator allowed unverified wheels."""

    def __init__(self, lock: WheelLock | None = None) -> None:
        self.lock = lock
        self._releases: dict[str, dict[str, tuple[str | None, int | None]] | str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def expected(self, url: str, fetcher: Fetcher) -> Expected | str:
        pin = self.lock.pin(url) if self.lock is not None else None
        if pin is not None:
            return Expected(pin.sha256, f"pinned at {pin.where}", pinned=True)
        if scheme_of(url) != "https":  # the API's word is over https; only the operator's pin is more
            return "not pinned in the wheel lock"
        api = release_api_url(url)
        if api is None:
            return "not a release download, and not in the wheel lock"
        assets = self._assets(api, fetcher)
        if isinstance(assets, str):
            return assets
        filename = urllib.parse.unquote(url.rpartition("/")[2])
        if filename not in assets:
            return f"the release at {api} has no asset {filename}"
        digest, size = assets[filename]
        if digest is None:
            return f"the release asset {filename} has no sha256 digest at {api}"
        return Expected(digest, f"the digest at {api}", size=size)

    def _assets(self, api: str, fetcher: Fetcher) -> dict[str, tuple[str | None, int | None]] | str:
        """{asset name: (sha256 or None, size)} of one release, asked once per run; or why not."""
        with self._guard:
            lock = self._locks.setdefault(api, threading.Lock())
        with lock:
            if api not in self._releases:
                try:
                    answer = fetcher.get(api, max_bytes=MAX_API_BYTES, accept=_API_MEDIA_TYPE)
                    self._releases[api] = parse_release(answer)
                except FetchError as error:
                    self._releases[api] = f"asking {api}: {error.reason}"
            return self._releases[api]


def parse_release(body: bytes) -> dict[str, tuple[str | None, int | None]] | str:
    """GitHub's release JSON as {asset name: (sha256 or None, size)}, or why it is not one. A digest in
    another form than sha256:<64 lower-case hex> counts as none."""
    try:
        release = boundedjson.loads(body)
    except ValueError as error:
        return f"the API's answer is not JSON ({error})"
    assets = release.get("assets") if isinstance(release, dict) else None
    if not isinstance(assets, list):
        return "the API's answer has no assets list"
    found: dict[str, tuple[str | None, int | None]] = {}
    for asset in assets:
        if not isinstance(asset, dict) or not isinstance(asset.get("name"), str):
            continue
        digest = asset.get("digest")
        matched = _API_DIGEST.match(digest) if isinstance(digest, str) else None
        size = asset.get("size")
        found[asset["name"]] = (matched[1] if matched else None,
                                size if isinstance(size, int) and size >= 0 else None)
    return found
