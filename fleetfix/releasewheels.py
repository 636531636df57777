"""Upstream's prebuilt release wheels: which file a wheel-cache key asks for, and whether a file is that one.

causal-conv1d, mamba-ssm and flash-attn publish wheels on their GitHub releases, one per combination of
CUDA major, torch major.minor, C++ ABI, Python and platform. Each one's setup.py names the file in
`get_wheel_url()` (docs/extensions.md cites the lines), and the release workflow uploads exactly that name
(bdist_wheel's own name with the label inserted after the version):

    {dist}-{version}+cu{CUDA major}torch{torch X.Y}cxx11abi{TRUE|FALSE}-{cpXY}-{cpXY}-linux_{machine}.whl

A playbook gives the URL per extension as a template whose placeholders (`PLACEHOLDERS`) this module fills
from the key. The result's file name is then parsed back and every field compared with the key, so a
template that hard-codes a field, or a key this scheme cannot express (a pre-release or NGC torch, a CUDA
major no setup.py maps, an unknown ABI), gives no candidate rather than a wrong wheel. Pure: no I/O.
"""

from __future__ import annotations

import re
import string
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from fleetfix.wheelcache import canonical_name

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
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return f"not an http(s) URL of a file: {url}"
    filename = urllib.parse.unquote(parts.path.rpartition("/")[2])
    problem = mismatch(filename, key)
    if problem is not None:
        return problem
    found = _RELEASE_NAME.match(filename)
    assert found is not None  # mismatch() parsed it
    tag = f"{found['python_tag']}-{found['abi_tag']}-{found['platform']}"
    return Candidate(url, filename, f"{found['dist']}-{found['version']}-{tag}.whl", tag)
