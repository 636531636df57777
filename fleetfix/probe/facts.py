"""Facts: what the probe script saw on one target, parsed purely from its JSON (no I/O here).

The names under `Facts` are a contract with the playbooks (`facts.model_dump(mode="json")` is what
templates see as `facts`; see docs and notes/facts-contract.md). Fields may be added, never renamed.
Values the probe cannot know are None, never guessed. Derived values (NVIDIA's repo codes, "is the
repo configured", the first torch) are computed here, in Python, so they are unit-tested and the
shell script stays a plain fact gatherer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from fleetfix import boundedjson
from fleetfix.errors import ProbeOutputError

PROBE_SCHEMA_VERSION = 1
# The real output is a few KiB. Anything near this cap is not the probe talking.
MAX_PROBE_OUTPUT_BYTES = 4 * 1024 * 1024

# NVIDIA CUDA repos that exist (DOMAIN.md 1.2). A distro outside this set has no repo to install from.
KNOWN_NVIDIA_REPOS = frozenset({
    "ubuntu1604", "ubuntu1804", "ubuntu2004", "ubuntu2204", "ubuntu2404",
    "debian11", "debian12", "debian13",
})
NVIDIA_ARCH_BY_MACHINE = {"x86_64": "x86_64", "aarch64": "sbsa"}
# NVIDIA's dnf repositories for RHEL and its rebuilds (Rocky, Alma): .../repos/rhel<major>/<arch>/
# cuda-rhel<major>.repo (docs/findings.md, RPM_DISTRO_TOOLKIT, cites them).
KNOWN_NVIDIA_RPM_REPOS = frozenset({"rhel8", "rhel9", "rhel10"})
RHEL_FAMILY = frozenset({"rhel", "rocky", "almalinux", "centos"})
_REPO_PATH = re.compile(r"/compute/cuda/repos/([^/]+)/([^/]+)")


def nvidia_distro_code(os_id: str | None, version_id: str | None) -> str | None:
    """The code NVIDIA's URL scheme would use (ubuntu + VERSION_ID without dot, debian + major)."""
    if not os_id or not version_id:
        return None
    if os_id == "ubuntu":
        return "ubuntu" + version_id.replace(".", "")
    if os_id == "debian":
        return "debian" + version_id.split(".")[0]
    return None


def nvidia_distro(os_id: str | None, version_id: str | None) -> str | None:
    """NVIDIA's repo code for this OS, or None when NVIDIA publishes no repo for it."""
    code = nvidia_distro_code(os_id, version_id)
    return code if code in KNOWN_NVIDIA_REPOS else None


def nvidia_rpm_distro(os_id: str | None, id_like: str | None, version_id: str | None) -> str | None:
    """rhel<major> for RHEL and rebuilds that say they are like it (ID_LIKE has rhel), when NVIDIA has a
    dnf repository for that major; None otherwise (Fedora has its own repos, not mapped here)."""
    family = {os_id or ""} | set((id_like or "").split())
    if not version_id or not (family & RHEL_FAMILY) or os_id == "fedora":
        return None
    code = "rhel" + version_id.split(".")[0]
    return code if code in KNOWN_NVIDIA_RPM_REPOS else None


def nvidia_arch(machine: str | None) -> str | None:
    return NVIDIA_ARCH_BY_MACHINE.get(machine or "")


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'12.8' -> (12, 8); '570.124.06' -> (570, 124, 6); anything else -> None."""
    if not text or not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))


_T = TypeVar("_T")


def empty(kind: Callable[[], _T]) -> Callable[[], _T]:
    """`Field(default_factory=empty(list))`: what `default_factory=list` gives, cheaper to declare. pydantic
    reads a factory's signature when it builds the model; a builtin's (list, dict) it parses from text
    with tokenize, a model class's it builds from the fields, a plain function's it reads off the code.
    For the probe's models that was a measurable share of every command's start-up
    (benchmarks/instructions.py counts it)."""
    def make() -> _T:
        return kind()

    return make


class _Model(BaseModel):
    # Ignore unknown keys: a newer probe may report more than this parser knows.
    model_config = ConfigDict(extra="ignore", frozen=True)


class OsFacts(_Model):
    id: str | None = None
    id_like: str | None = None
    version_id: str | None = None
    codename: str | None = None
    pretty_name: str | None = None
    machine: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nvidia_distro(self) -> str | None:
        return nvidia_distro(self.id, self.version_id)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nvidia_arch(self) -> str | None:
        return nvidia_arch(self.machine)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nvidia_rpm_distro(self) -> str | None:
        return nvidia_rpm_distro(self.id, self.id_like, self.version_id)


class AptSource(_Model):
    """One source entry whose URI points at an NVIDIA repo (.list line or deb822 stanza URI)."""

    file: str
    line: int
    format: Literal["list", "deb822"]
    types: str = "deb"
    uri: str
    suite: str = ""
    components: str = ""
    signed_by: str | None = None
    enabled: bool = True

    @property
    def is_cuda_repo(self) -> bool:
        return "/compute/cuda/repos/" in self.uri

    @property
    def is_machine_learning_repo(self) -> bool:
        return "/compute/machine-learning/repos/" in self.uri

    @property
    def repo_distro(self) -> str | None:
        """'debian12' from .../compute/cuda/repos/debian12/x86_64/."""
        found = _REPO_PATH.search(self.uri)
        return found.group(1) if found else None

    @property
    def apt_key(self) -> tuple[str, str]:
        """What apt groups entries by when it compares options: URI (no trailing slash) and suite."""
        return self.uri.rstrip("/"), self.suite


class KeyringHit(_Model):
    key: str          # "7fa2af80" | "3bf863cc"
    file: str


class NvidiaIndex(_Model):
    """apt's downloaded index of NVIDIA's repository: how many list files, which cuda-nvcc-X-Y."""

    files: int = 0
    nvcc: list[str] = Field(default_factory=empty(list))   # "12-8", "13-0"

    def carries(self, cuda: str) -> bool | None:
        """Whether the index has cuda-nvcc for X.Y; None when there is no index to tell."""
        return cuda.replace(".", "-") in self.nvcc if self.files else None


class AptFacts(_Model):
    present: bool = False
    version: str | None = None
    sqv: bool = False
    keyring_installed: bool = False
    keyring_version: str | None = None
    keyring_list: str | None = None      # the installed keyring's own .list (dpkg's file list of it)
    keyring_file: bool = False
    nvidia_sources: list[AptSource] = Field(default_factory=empty(list))
    nvidia_keys: list[KeyringHit] = Field(default_factory=empty(list))
    apt_key: bool | None = None          # None: an older probe that did not look
    nvidia_index: NvidiaIndex = Field(default_factory=empty(NvidiaIndex))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nvidia_repo_configured(self) -> bool:
        return any(s.is_cuda_repo and "deb" in s.types.split() for s in self.enabled_sources)

    @property
    def enabled_sources(self) -> list[AptSource]:
        return [s for s in self.nvidia_sources if s.enabled]

    @property
    def major(self) -> int | None:
        parsed = version_tuple(re.split(r"[^\d.]", self.version or "", maxsplit=1)[0])
        return parsed[0] if parsed else None

    @property
    def uses_sqv(self) -> bool:
        """apt >= 3.0 verifies with Sequoia's sqv, which rejects SHA-1 key bindings (DOMAIN.md 1.5)."""
        return self.sqv or (self.major is not None and self.major >= 3)


class LockHolder(_Model):
    lock: str
    pid: int | None = None
    command: str | None = None


class DpkgFacts(_Model):
    present: bool = False
    interrupted: bool = False
    pending_updates: int = 0
    lock_holders: list[LockHolder] = Field(default_factory=empty(list))


class Nvcc(_Model):
    path: str
    version: str | None = None     # "12.8"
    release: str | None = None     # "V12.8.93"
    complete: bool | None = None   # pip wheels: runtime headers and CCCL beside nvcc (None: not a pip nvcc)


class Toolkit(_Model):
    path: str                      # /usr/local/cuda-12.8
    version: str | None = None
    nvcc: str | None = None
    release: str | None = None


class Package(_Model):
    name: str
    version: str


class CudaFacts(_Model):
    toolkits: list[Toolkit] = Field(default_factory=empty(list))
    default_link: str | None = None
    nvcc_on_path: Nvcc | None = None
    distro_nvcc: Nvcc | None = None
    packages: list[Package] = Field(default_factory=empty(list))
    env_cuda_home: str | None = None       # CUDA_HOME/CUDA_PATH set for logins (/etc/environment, profile)
    env_cuda_home_file: str | None = None  # the file that sets it
    env_cuda_home_target: str | None = None  # env_cuda_home with its symlinks followed (/usr/local/cuda ->)

    def toolkit_at(self, path: str | None) -> Toolkit | None:
        return next((t for t in self.toolkits if t.path == path), None)


class TorchInfo(_Model):
    version: str | None = None     # "2.11.0+cu128"
    cuda: str | None = None        # "12.8"; None for CPU-only builds
    hip: str | None = None
    path: str | None = None
    arch_list: list[str] | None = None   # what torch.cuda.get_arch_list() returns, read from the wheel
    cxx11_abi: bool | None = None  # _GLIBCXX_USE_CXX11_ABI torch was built with; None: unknown


class Extension(_Model):
    present: bool = False
    version: str | None = None
    compiled_module: str | None = None
    compiled_present: bool | None = None   # None: no compiled part, or the package is absent
    importable: bool | None = None         # None: not checked (only --deep imports)
    error: str | None = None


class HubKernels(_Model):
    """transformers and the `kernels` package in one env: which extensions transformers takes from the
    Hugging Face Hub instead of the local build (its hub_kernels.py's _HUB_KERNEL_MAPPING keys)."""

    transformers: str | None = None
    kernels: str | None = None           # the `kernels` distribution's version; None: not installed
    hub_mapped: list[str] = Field(default_factory=empty(list))   # "causal-conv1d", "mamba-ssm", ...


class DeepTorch(_Model):
    cuda_available: bool | None = None
    device_count: int | None = None
    capabilities: list[str] = Field(default_factory=empty(list))
    arch_list: list[str] = Field(default_factory=empty(list))
    error: str | None = None


class PythonEnv(_Model):
    interpreter: str
    found: bool = False
    executable: str | None = None
    version: str | None = None
    prefix: str | None = None
    virtualenv: bool = False
    python_tag: str | None = None  # "cp311": the wheel tag of this interpreter
    libc: str | None = None  # "glibc 2.36"
    torch: TorchInfo | None = None
    extensions: dict[str, Extension] = Field(default_factory=empty(dict))
    pip_nvcc: list[Nvcc] = Field(default_factory=empty(list))
    conda_nvcc: Nvcc | None = None        # $CONDA_PREFIX/bin/nvcc of a conda env (conda's cuda-nvcc)
    python_h: bool | None = None          # Python.h for this interpreter (None: an older probe)
    deep: DeepTorch | None = None
    error: str | None = None
    # How the probe's discovery found this env when nothing named it; None: named (inventory, default).
    discovered: Literal["venv", "conda", "process"] | None = None
    hub_kernels: HubKernels | None = None   # None: no transformers (or an older probe)
    # PEP 668 (docs/extensions.md): pip refuses to install here unless told to break system packages.
    # None: an older probe (or, for the first, the stdlib directory could not be read).
    externally_managed: bool | None = None
    pip_version: str | None = None
    # The pip config file, or PIP_BREAK_SYSTEM_PACKAGES, that tells pip to ignore the marker; None: none.
    pip_break_system_packages: str | None = None
    # The INSTALLER file of torch's .dist-info ("pip", "uv", "conda"); None: none (distro package), no torch.
    torch_installer: str | None = None


class DiscoveredPython(_Model):
    """An interpreter found on the target without being asked for (not run: torch read as text)."""

    path: str
    source: Literal["venv", "conda", "process"]
    prefix: str | None = None
    inspected: bool = False        # named in the probe's interpreter list, or inspected once discovered
    torch: TorchInfo | None = None


class TorchRef(_Model):
    """`facts.torch`: the first python env that has torch."""

    version: str | None
    cuda: str | None
    interpreter: str
    path: str | None = None
    cxx11_abi: bool | None = None
    python_tag: str | None = None
    libc: str | None = None


class DriverLib(_Model):
    file: str
    version: str


class GpuFacts(_Model):
    devices: list[str] = Field(default_factory=empty(list))
    smi_present: bool = False
    smi_error: str | None = None
    driver_version: str | None = None
    names: list[str] = Field(default_factory=empty(list))
    compute_caps: list[str] = Field(default_factory=empty(list))
    driver_libs: list[DriverLib] = Field(default_factory=empty(list))

    @property
    def userspace_driver_versions(self) -> list[str]:
        return sorted({lib.version for lib in self.driver_libs})


class BuildFacts(_Model):
    gcc: bool = False
    gcc_version: str | None = None
    gxx: bool = False
    gxx_version: str | None = None
    ninja: bool = False
    ninja_version: str | None = None
    make: bool = False
    gxx_majors: list[int] = Field(default_factory=empty(list))   # /usr/bin/g++-N installed (N)
    glibc: str | None = None                                      # "2.41" (None: an older probe, or musl)
    disk_free_mb: dict[str, int | None] = Field(default_factory=empty(dict))
    mem_total_mb: int | None = None
    mem_available_mb: int | None = None
    cpus: int | None = None
    tmp_fstype: str | None = None                        # /tmp's filesystem type when it is a mount
    tmp_free_mb: dict[str, int | None] | None = None     # {"/tmp": MiB}, only when /tmp is a tmpfs


class Facts(_Model):
    fleetfix_probe: int
    deep: bool = False
    hostname: str | None = None
    kernel: str | None = None
    os: OsFacts = Field(default_factory=empty(OsFacts))
    apt: AptFacts = Field(default_factory=empty(AptFacts))
    dpkg: DpkgFacts = Field(default_factory=empty(DpkgFacts))
    cuda: CudaFacts = Field(default_factory=empty(CudaFacts))
    pythons: list[PythonEnv] = Field(default_factory=empty(list))
    discovered_pythons: list[DiscoveredPython] = Field(default_factory=empty(list))
    gpu: GpuFacts = Field(default_factory=empty(GpuFacts))
    build: BuildFacts = Field(default_factory=empty(BuildFacts))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def torch(self) -> TorchRef | None:
        env = next((p for p in self.pythons if p.torch is not None), None)
        if env is None or env.torch is None:
            return None
        return TorchRef(version=env.torch.version, cuda=env.torch.cuda, interpreter=env.interpreter,
                        path=env.torch.path, cxx11_abi=env.torch.cxx11_abi, python_tag=env.python_tag,
                        libc=env.libc)

    @property
    def torch_envs(self) -> list[PythonEnv]:
        return [p for p in self.pythons if p.torch is not None]


class NodeFacts(_Model):
    """From the Proxmox node itself (one command per node, shared by its containers)."""

    hostname: str | None = None
    kernel_module_version: str | None = None              # "550.135" (/proc/driver/nvidia/version)
    kernel_module_flavor: Literal["open", "proprietary"] | None = None
    nvrm_line: str | None = None


def parse_facts(stdout: str) -> Facts:
    """The probe's stdout -> Facts, or ProbeOutputError with a one-line reason."""
    size = len(stdout.encode("utf-8", "replace"))
    if size > MAX_PROBE_OUTPUT_BYTES:
        raise ProbeOutputError(f"probe output is {size} bytes, over the {MAX_PROBE_OUTPUT_BYTES} byte cap")
    text = stdout.strip()
    if not text:
        raise ProbeOutputError("probe printed nothing")
    try:
        data = boundedjson.loads(text)
    except json.JSONDecodeError as exc:
        if text.startswith("{") and not text.endswith("}"):
            raise ProbeOutputError(f"probe output is truncated after {len(text)} characters") from None
        raise ProbeOutputError(
            f"probe output is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg}): {_preview(text)}"
        ) from None
    except ValueError as exc:  # over a limit: nesting, integer size
        raise ProbeOutputError(f"probe output is not acceptable JSON: {exc}") from None
    if not isinstance(data, dict) or "fleetfix_probe" not in data:
        raise ProbeOutputError(f"probe output is JSON but not the probe's document: {_preview(text)}")
    if data["fleetfix_probe"] != PROBE_SCHEMA_VERSION:
        raise ProbeOutputError(
            f"probe schema {data['fleetfix_probe']!r} is not the supported {PROBE_SCHEMA_VERSION}")
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        raise ProbeOutputError(f"probe JSON has the wrong shape: {_first_error(exc)}") from None
    except RecursionError:  # nesting the JSON parser took but validation does not
        raise ProbeOutputError("probe JSON has the wrong shape: nested too deeply") from None


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "(document)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _preview(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))


_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
NODE_FACTS_HEADER = "fleetfix-node-facts 1"


def parse_node_facts(stdout: str) -> NodeFacts:
    """The node script's stdout ('key<TAB>value' lines after a header) -> NodeFacts."""
    lines = stdout.splitlines()
    if NODE_FACTS_HEADER not in (line.strip() for line in lines[:1]):
        raise ProbeOutputError(f"node facts output lacks its header line: {_preview(stdout)}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition("\t")
        if sep and key not in fields:
            fields[key] = value.strip()
    nvrm = fields.get("nvrm") or None
    found = _NVRM.search(nvrm) if nvrm else None
    flavor: Literal["open", "proprietary"] | None = None
    if found and nvrm:
        flavor = "open" if "Open Kernel Module" in nvrm else "proprietary"
    return NodeFacts(
        hostname=fields.get("hostname") or None,
        kernel_module_version=found.group(1) if found else None,
        kernel_module_flavor=flavor,
        nvrm_line=nvrm,
    )


def facts_to_template_dict(facts: Facts) -> dict[str, Any]:
    """What playbook templates see as `facts`."""
    return facts.model_dump(mode="json")
