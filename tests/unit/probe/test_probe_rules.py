"""Rules: the recorded cases give the right chains; every code has a case that makes it fire."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from probe_testkit import edited, facts_of, load_fixture

from fleetfix.probe import Finding, NodeFacts, Severity, diagnose
from fleetfix.probe.rules import (
    BUILD_EXTENSIONS_PLAYBOOK,
    CODES,
    CUDA_TOOLKIT_PIP_PLAYBOOK,
    CUDA_TOOLKIT_PLAYBOOK,
    DISK_ERROR_MB,
    DISK_WARNING_MB,
    QWEN_FAST_PATH_WARNING,
    Fix,
)

NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos"
Edit = Callable[[dict[str, Any]], None]


def problems(findings: list[Finding]) -> list[str]:
    """Codes of the findings that need action (error or warning), in order."""
    return [f.code for f in findings if f.severity is not Severity.INFO]


def only(findings: list[Finding], code: str) -> Finding:
    matching = [f for f in findings if f.code == code]
    assert len(matching) == 1, [f.code for f in findings]
    return matching[0]


# ---------------------------------------------------------------- the recorded cases


def test_problem_case_gives_the_chain_with_fixes() -> None:
    findings = diagnose(facts_of(load_fixture("problem_case")))
    assert [f.code for f in findings] == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED", "EXTENSION_MISSING"]
    runtime, repo, missing = findings
    assert (runtime.severity, runtime.fix.playbook, runtime.fix.vars) == (
        Severity.ERROR, CUDA_TOOLKIT_PLAYBOOK, {"cuda_version": "12.8"})
    assert runtime.evidence["torch_version"] == "2.11.0+cu128"
    assert "Unable to locate package cuda-nvcc-12-8" in repo.summary
    assert (repo.fix.playbook, repo.fix.vars) == (CUDA_TOOLKIT_PLAYBOOK, {"cuda_version": "12.8"})
    assert "debian12/x86_64" in repo.fix.hint
    assert missing.evidence["extension"] == "causal_conv1d"
    assert "GatedDeltaNet" in missing.summary and "torch implementation" in missing.summary
    assert QWEN_FAST_PATH_WARNING in missing.evidence["fallback"]
    assert (missing.fix.playbook, missing.fix.vars) == (
        BUILD_EXTENSIONS_PLAYBOOK,
        {"extensions": ["causal_conv1d"], "python": "python3", "cuda_version": "12.8"})


def test_healthy_container_has_no_findings() -> None:
    assert diagnose(facts_of(load_fixture("healthy"))) == []


def test_cuda_12_4_toolkit_gives_minor_mismatch_only() -> None:
    findings = diagnose(facts_of(load_fixture("toolkit_12_4")))
    assert problems(findings) == ["CUDA_TOOLKIT_MINOR_MISMATCH"]
    assert findings[0].severity is Severity.WARNING
    assert findings[0].evidence["nvcc_versions"] == ["12.4"]
    assert findings[0].fix.vars == {"cuda_version": "12.8"}


def test_cuda_13_toolkit_against_cu128_is_a_major_mismatch() -> None:
    findings = diagnose(facts_of(load_fixture("toolkit_13_vs_cu128")))
    assert problems(findings) == ["CUDA_TOOLKIT_MAJOR_MISMATCH"]
    assert findings[0].severity is Severity.ERROR


def test_this_machine_without_torch_has_nothing_to_fix() -> None:
    assert problems(diagnose(facts_of(load_fixture("local_debian12_nvcc13")))) == []


def test_apt_trouble_chain() -> None:
    findings = diagnose(facts_of(load_fixture("apt_trouble")))
    assert problems(findings) == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "DPKG_INTERRUPTED", "DPKG_LOCK_HELD", "APT_SIGNED_BY_CONFLICT",
        "APT_NVIDIA_KEY_MISSING", "APT_NVIDIA_ML_REPO", "APT_OLD_NVIDIA_KEY", "EXTENSION_MISSING"]
    conflict = only(findings, "APT_SIGNED_BY_CONFLICT")
    assert "/etc/apt/sources.list:52" in conflict.fix.hint


def test_findings_are_json_serialisable() -> None:
    for name in ("problem_case", "apt_trouble", "debian13_sqv"):
        for finding in diagnose(facts_of(load_fixture(name))):
            assert Finding.model_validate_json(finding.model_dump_json()) == finding


def test_fix_text_is_a_command_to_paste_then_the_hint() -> None:
    fix = Fix(playbook=BUILD_EXTENSIONS_PLAYBOOK, hint="then re-probe",
              vars={"extensions": ["causal_conv1d", "fla"], "cuda_version": "12.8", "note": "it's $HOME"})
    assert fix.text() == (f"fleetfix apply {BUILD_EXTENSIONS_PLAYBOOK} --var extensions=causal_conv1d,fla"
                          " --var cuda_version=12.8 --var 'note=it'\"'\"'s $HOME' — then re-probe")
    assert Fix(hint="reboot the node").text() == "reboot the node"


# ---------------------------------------------------------------- one case per code


def set_in(path: str, value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return edit


def chain(*edits: Edit) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        for one in edits:
            one(data)
    return edit


def toolkit(version: str, patch: str = "0") -> dict[str, Any]:
    return {"path": f"/usr/local/cuda-{version}", "version": version,
            "nvcc": f"/usr/local/cuda-{version}/bin/nvcc", "release": f"V{version}.{patch}"}


def nvidia_list(file: str, uri: str, signed_by: str | None, line: int = 1) -> dict[str, Any]:
    return {"file": file, "line": line, "format": "list", "types": "deb", "uri": uri, "suite": "/",
            "components": "", "signed_by": signed_by, "enabled": True}


def ext(present: bool, compiled: bool | None = None, importable: bool | None = None,
        error: str | None = None, module: str | None = None) -> dict[str, Any]:
    return {"present": present, "version": "1.0" if present else None, "compiled_module": module,
            "compiled_present": compiled, "importable": importable, "error": error}


@dataclass(frozen=True)
class Case:
    fixture: str
    edit: Edit
    severity: Severity
    node: NodeFacts | None = None
    evidence: tuple[str, Any] | None = None   # one evidence key the rule must report, and its value


NO_EDIT: Edit = chain()
# /proc/driver/nvidia/version's NVRM line of the proprietary flavor (DOMAIN.md 4.2 quotes both forms).
PROPRIETARY_NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Wed Feb 26 01:45:26 UTC 2025"
OPEN_NVRM = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
DEEP_NO_CUDA = {"cuda_available": False, "device_count": 0, "capabilities": [], "arch_list": [],
                "error": None}
# What the probe reads from transformers 5.0.0's integrations/hub_kernels.py (_HUB_KERNEL_MAPPING's keys).
TRANSFORMERS_5_0_WITH_KERNELS = {"transformers": "5.0.0", "kernels": "0.10.2",
                                 "hub_mapped": ["causal-conv1d", "mamba-ssm", "falcon_mamba-ssm"]}
KEYRING_SB = "/usr/share/keyrings/cuda-archive-keyring.gpg"

CASES: dict[str, Case] = {
    "DRIVER_LIBS_MISMATCH": Case(
        "healthy", NO_EDIT, Severity.ERROR,
        node=NodeFacts(hostname="pve1", kernel_module_version="570.133.07"),
        evidence=("host_kernel_module", "570.133.07")),
    "DRIVER_TOO_OLD": Case(
        "healthy", set_in("gpu.driver_version", "515.105.01"), Severity.ERROR,
        evidence=("minimum_driver", "525")),
    "DRIVER_BELOW_FULL_FEATURE": Case(
        "healthy", chain(set_in("gpu.driver_version", "550.135"),
                         set_in("gpu.driver_libs", [{"file": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.135",
                                                     "version": "550.135"}])),
        Severity.WARNING, evidence=("full_feature_driver", "570.26")),
    "DRIVER_PROPRIETARY_MODULE": Case(
        "healthy", chain(set_in("gpu.names", ["NVIDIA B200"]), set_in("gpu.compute_caps", ["10.0"])),
        Severity.ERROR, node=NodeFacts(kernel_module_version="570.124.06", kernel_module_flavor="proprietary",
                                       nvrm_line=PROPRIETARY_NVRM),
        evidence=("kernel_module_flavor", "proprietary")),
    "GPU_NOT_VISIBLE": Case("healthy", set_in("gpu.devices", []), Severity.INFO),
    "GPU_PASSTHROUGH_PARTIAL": Case(
        "healthy", set_in("gpu.devices", ["/dev/nvidia0", "/dev/nvidiactl"]), Severity.ERROR,
        evidence=("missing", ["/dev/nvidia-uvm"])),
    "CUDA_UNAVAILABLE_WITH_DEVICES": Case(
        "healthy", set_in("pythons.0.deep", DEEP_NO_CUDA), Severity.ERROR,
        evidence=("devices", ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"])),
    "CUDA_RUNTIME_WITHOUT_TOOLKIT": Case(
        "problem_case", NO_EDIT, Severity.ERROR, evidence=("torch_cuda", "12.8")),
    "CUDA_TOOLKIT_MAJOR_MISMATCH": Case(
        "healthy", set_in("cuda.toolkits", [toolkit("13.0", "88")]), Severity.ERROR,
        evidence=("nvcc_versions", ["13.0"])),
    "CUDA_TOOLKIT_MINOR_MISMATCH": Case(
        "healthy", set_in("cuda.toolkits", [toolkit("12.9", "86")]), Severity.WARNING,
        evidence=("nvcc_versions", ["12.9"])),
    "NVCC_GLIBC_INCOMPATIBLE": Case(
        "debian13_cu128_problem", NO_EDIT, Severity.ERROR, evidence=("glibc", "2.41")),
    "TORCH_WHEEL_LACKS_ARCH": Case(
        "healthy", chain(set_in("pythons.0.torch.arch_list", ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                                               "sm_120"]),
                         set_in("gpu.names", ["Tesla V100-SXM2-32GB"]), set_in("gpu.compute_caps", ["7.0"])),
        Severity.ERROR, evidence=("confirmed_by_deep", False)),
    "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT": Case(
        "healthy", chain(set_in("pythons.0.torch.cuda", "12.4"),
                         set_in("pythons.0.torch.version", "2.5.1+cu124"),
                         set_in("cuda.toolkits", [toolkit("12.4", "131")]),
                         set_in("gpu.names", ["NVIDIA GeForce RTX 5090"]),
                         set_in("gpu.compute_caps", ["12.0"])),
        Severity.ERROR, evidence=("minimum_nvcc", "12.8")),
    "CUDA_DEFAULT_LINK_MISMATCH": Case(
        "healthy", chain(set_in("cuda.toolkits", [toolkit("12.8", "93"), toolkit("13.0", "88")]),
                         set_in("cuda.default_link", "/usr/local/cuda-13.0")),
        Severity.WARNING, evidence=("linked_version", "13.0")),
    "BUILD_PICKS_OTHER_NVCC": Case(
        "healthy", chain(set_in("cuda.toolkits", [toolkit("12.8", "93"), toolkit("12.4", "131")]),
                         set_in("cuda.env_cuda_home", "/usr/local/cuda-12.4"),
                         set_in("cuda.env_cuda_home_file", "/etc/environment")),
        Severity.WARNING, evidence=("set_in", "/etc/environment")),
    "DISTRO_NVCC_ON_PATH": Case(
        "healthy",
        set_in("cuda.distro_nvcc", {"path": "/usr/bin/nvcc", "version": "12.0", "release": "V12.0.140"}),
        Severity.WARNING),
    "DPKG_INTERRUPTED": Case(
        "healthy", chain(set_in("dpkg.interrupted", True), set_in("dpkg.pending_updates", 3)), Severity.ERROR,
        evidence=("pending_updates", 3)),
    "DPKG_LOCK_HELD": Case(
        "healthy", set_in("dpkg.lock_holders", [{"lock": "/var/lib/dpkg/lock-frontend", "pid": 1719,
                                                 "command": "unattended-upgr"}]), Severity.WARNING),
    "DISK_LOW": Case(
        "problem_case", set_in("build.disk_free_mb", {"/": 1500, "/var/cache/apt": 1500, "/usr/local": 1500}),
        Severity.ERROR, evidence=("error_below_mb", DISK_ERROR_MB)),
    "UNSUPPORTED_DISTRO": Case(
        "problem_case", chain(set_in("os.id", "ubuntu"), set_in("os.version_id", "23.10")), Severity.ERROR,
        evidence=("nvidia_distro", None)),
    "NVIDIA_REPO_NOT_CONFIGURED": Case(
        "problem_case", NO_EDIT, Severity.ERROR, evidence=("nvidia_distro", "debian12")),
    "NVIDIA_REPO_LACKS_CUDA": Case(
        "debian13_cu128_problem", NO_EDIT, Severity.ERROR, evidence=("nvidia_distro", "debian13")),
    "RPM_DISTRO_TOOLKIT": Case(
        "problem_case", chain(set_in("os.id", "rocky"), set_in("os.version_id", "9.4"),
                              set_in("os.id_like", "rhel centos fedora"), set_in("apt.present", False),
                              set_in("dpkg.present", False)),
        Severity.ERROR, evidence=("nvidia_rpm_distro", "rhel9")),
    "APT_SIGNED_BY_CONFLICT": Case(
        "healthy", set_in("apt.nvidia_sources", [
            nvidia_list("/etc/apt/sources.list.d/cuda-debian12-x86_64.list", f"{NVIDIA}/debian12/x86_64/",
                        KEYRING_SB),
            nvidia_list("/etc/apt/sources.list", f"{NVIDIA}/debian12/x86_64", None, line=7)]),
        Severity.ERROR, evidence=("uri", f"{NVIDIA}/debian12/x86_64")),
    "APT_DUPLICATE_SOURCE": Case(
        "healthy", set_in("apt.nvidia_sources", [
            nvidia_list("/etc/apt/sources.list.d/cuda-debian12-x86_64.list", f"{NVIDIA}/debian12/x86_64/",
                        KEYRING_SB),
            nvidia_list("/etc/apt/sources.list.d/cuda.list", f"{NVIDIA}/debian12/x86_64/", KEYRING_SB)]),
        Severity.WARNING),
    "APT_NVIDIA_KEY_MISSING": Case(
        "healthy", chain(
            set_in("apt.nvidia_sources", [nvidia_list("/etc/apt/sources.list.d/cuda.list",
                                                      f"{NVIDIA}/debian12/x86_64/", None)]),
            set_in("apt.nvidia_keys", [{"key": "7fa2af80", "file": "/etc/apt/trusted.gpg"}])),
        Severity.ERROR, evidence=("trusted_nvidia_keys", ["7fa2af80"])),
    "APT_NVIDIA_ML_REPO": Case(
        "healthy", lambda d: d["apt"]["nvidia_sources"].append(nvidia_list(
            "/etc/apt/sources.list.d/nvidia-ml.list",
            "https://developer.download.nvidia.com/compute/machine-learning/repos/ubuntu1804/x86_64", None)),
        Severity.ERROR),
    "APT_OLD_NVIDIA_KEY": Case(
        "healthy",
        lambda d: d["apt"]["nvidia_keys"].append({"key": "7fa2af80", "file": "/etc/apt/trusted.gpg"}),
        Severity.WARNING),
    "APT_SHA1_KEY_REJECTED": Case(
        "debian13_sqv", NO_EDIT, Severity.ERROR, evidence=("repos", ["debian12"])),
    "HOST_COMPILER_TOO_NEW": Case(
        "healthy", set_in("build.gxx_version", "15.1.0"),   # the installed 12.8 takes gcc <= 14
        Severity.ERROR, evidence=("newest_gcc", 14)),
    "HOST_COMPILER_TOO_OLD": Case(
        "problem_case", chain(set_in("pythons.0.torch.version", "2.13.0+cu128"),
                              set_in("build.gxx_version", "9.4.0")),
        Severity.ERROR, evidence=("minimum_gcc", 10)),
    "PYTHON_HEADERS_MISSING": Case(
        "debian13_cu130_problem", NO_EDIT, Severity.ERROR, evidence=("python_version", "3.13.5")),
    "BUILD_TOOLS_MISSING": Case(
        "problem_case", set_in("build.ninja", False), Severity.WARNING, evidence=("ninja", False)),
    "BUILD_MEMORY_LOW": Case(
        "problem_case", set_in("build.mem_available_mb", 3000), Severity.WARNING,
        evidence=("mem_per_job_mb", 5120)),
    "TMP_ON_TMPFS": Case(
        "problem_case",
        chain(set_in("build.tmp_fstype", "tmpfs"), set_in("build.tmp_free_mb", {"/tmp": 512})),
        Severity.WARNING, evidence=("tmp_free_mb", 512)),
    "EXTENSION_NOT_BUILT": Case(
        "healthy", set_in("pythons.0.extensions.causal_conv1d",
                          ext(True, compiled=False, module="causal_conv1d_cuda")),
        Severity.ERROR, evidence=("extension", "causal_conv1d")),
    "EXTENSION_IMPORT_FAILED": Case(
        "healthy", set_in("pythons.0.extensions.causal_conv1d", ext(
            True, compiled=True, importable=False, module="causal_conv1d_cuda",
            error="ImportError: causal_conv1d_cuda.so: undefined symbol: "
                  "_ZN3c105ErrorC2ENS_14SourceLocationESs")),
        Severity.ERROR, evidence=("importable", False)),
    "EXTENSION_MISSING": Case(
        "problem_case", NO_EDIT, Severity.WARNING, evidence=("extension", "causal_conv1d")),
    "EXTENSION_WRONG_RESULTS": Case(
        "healthy", chain(set_in("pythons.0.torch.cuda", "13.0"),
                         set_in("pythons.0.torch.version", "2.14.1+cu130"),
                         set_in("gpu.names", ["NVIDIA B300 SXM6 AC"]), set_in("gpu.compute_caps", ["10.3"]),
                         set_in("pythons.0.extensions.causal_conv1d.version", "1.7.0")),
        Severity.ERROR, evidence=("version", "1.7.0")),
    "EXTENSION_FROM_HUB": Case(
        "healthy", set_in("pythons.0.hub_kernels", TRANSFORMERS_5_0_WITH_KERNELS), Severity.WARNING,
        evidence=("local_extensions", ["causal_conv1d"])),
    "PYTHON_NOT_FOUND": Case("no_python", NO_EDIT, Severity.INFO, evidence=("interpreter", "python3")),
    "PYTHON_PROBE_FAILED": Case(
        "healthy", lambda d: d["pythons"].append({"interpreter": "python", "found": True,
                                                  "executable": "/usr/bin/python",
                                                  "error": "interpreter ran but printed no probe result"}),
        Severity.WARNING),
    "TORCH_NOT_FOUND": Case("local_debian12_nvcc13", NO_EDIT, Severity.INFO),
    "TORCH_CPU_ONLY": Case(
        "healthy",
        chain(set_in("pythons.0.torch.cuda", None), set_in("pythons.0.torch.version", "2.11.0+cpu")),
        Severity.INFO),
}


def test_every_code_has_a_case() -> None:
    assert set(CASES) == set(CODES)


@pytest.mark.parametrize("code", list(CASES))
def test_rule_fires(code: str) -> None:
    case = CASES[code]
    findings = diagnose(edited(case.fixture, case.edit), case.node)
    finding = only(findings, code)
    assert finding.severity is case.severity
    assert finding.summary and "\n" not in finding.summary
    assert finding.fix.hint
    if case.evidence:
        key, value = case.evidence
        assert finding.evidence[key] == value
    if finding.fix.playbook:
        assert finding.fix.playbook in (CUDA_TOOLKIT_PLAYBOOK, CUDA_TOOLKIT_PIP_PLAYBOOK,
                                        BUILD_EXTENSIONS_PLAYBOOK)


@pytest.mark.parametrize("code", [c for c, case in CASES.items() if case.fixture == "healthy"])
def test_rule_is_quiet_on_the_healthy_baseline(code: str) -> None:
    # The same fixture without the edit: proves it is the edit that made the rule fire.
    assert code not in [f.code for f in diagnose(facts_of(load_fixture("healthy")))]


# ---------------------------------------------------------------- rule details


def test_findings_come_in_chain_order() -> None:
    findings = diagnose(edited("apt_trouble", set_in("gpu.driver_version", "510.47.03")))
    order = [CODES.index(f.code) for f in findings]
    assert order == sorted(order)
    assert findings[0].code == "DRIVER_TOO_OLD"   # the host driver comes before everything in the CT


def test_driver_rules_prefer_the_node_kernel_module() -> None:
    node = NodeFacts(kernel_module_version="550.135")
    finding = only(diagnose(facts_of(load_fixture("healthy")), node), "DRIVER_BELOW_FULL_FEATURE")
    assert finding.evidence["driver_source"].startswith("node kernel module")


def test_new_driver_is_fine_for_cuda_12() -> None:
    # 580 is past 12.x's minor-compat range, but backward compatibility still runs it.
    findings = diagnose(edited("healthy", chain(
        set_in("gpu.driver_version", "580.95.05"),
        set_in("gpu.driver_libs", [{"file": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                                    "version": "580.95.05"}]))))
    assert findings == []


def test_cuda_13_needs_driver_580() -> None:
    findings = diagnose(edited("toolkit_13_vs_cu128", chain(
        set_in("pythons.0.torch.cuda", "13.0"), set_in("pythons.0.torch.version", "2.14.1+cu130"))))
    assert only(findings, "DRIVER_TOO_OLD").evidence["minimum_driver"] == "580"


def test_cuda_13_cannot_build_for_volta() -> None:
    findings = diagnose(edited("toolkit_13_vs_cu128", chain(
        set_in("pythons.0.torch.cuda", "13.0"), set_in("gpu.driver_version", "580.95.05"),
        set_in("gpu.driver_libs", []), set_in("gpu.compute_caps", ["7.0"]))))
    assert only(findings, "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT").evidence["compute_cap"] == "7.0"


def test_nvml_mismatch_message_alone_is_enough() -> None:
    findings = diagnose(edited("healthy", chain(
        set_in("gpu.driver_version", None),
        set_in("gpu.smi_error", "Failed to initialize NVML: Driver/library version mismatch"))))
    assert only(findings, "DRIVER_LIBS_MISMATCH").severity is Severity.ERROR


def test_pip_nvcc_counts_as_a_toolkit() -> None:
    # NVIDIA's wheels hold an nvcc from 13.0 on (nvidia/cu13/bin/nvcc; tests/unit/groundtruth).
    facts = edited("problem_case", chain(set_in("pythons.0.torch.cuda", "13.0"),
                                         set_in("pythons.0.pip_nvcc", [
        {"path": "/usr/local/lib/python3.11/dist-packages/nvidia/cu13/bin/nvcc", "version": "13.0",
         "release": "V13.0.88"}])))
    codes = [f.code for f in diagnose(facts)]
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" not in codes and "NVIDIA_REPO_NOT_CONFIGURED" not in codes


def test_repo_finding_only_when_an_install_is_needed() -> None:
    assert "NVIDIA_REPO_NOT_CONFIGURED" not in [
        f.code for f in diagnose(edited("healthy", set_in("apt.nvidia_sources", [])))]


def test_unsupported_distro_replaces_the_repo_finding() -> None:
    findings = diagnose(edited("problem_case", set_in("os.machine", "ppc64le")))
    codes = [f.code for f in findings]
    assert "UNSUPPORTED_DISTRO" in codes and "NVIDIA_REPO_NOT_CONFIGURED" not in codes


def test_disk_warning_band_and_quiet_when_nothing_to_install() -> None:
    low = {"/": DISK_WARNING_MB - 1, "/var/cache/apt": DISK_WARNING_MB - 1, "/usr/local": DISK_WARNING_MB - 1}
    assert only(diagnose(edited("problem_case", set_in("build.disk_free_mb", low))),
                "DISK_LOW").severity is Severity.WARNING
    assert diagnose(edited("healthy", set_in("build.disk_free_mb", {"/": 100}))) == []


def test_sha1_rule_quiet_for_the_debian13_repo() -> None:
    def use_debian13_repo(data: dict[str, Any]) -> None:
        data["apt"]["nvidia_sources"][0]["uri"] = f"{NVIDIA}/debian13/x86_64/"
    codes = [f.code for f in diagnose(edited("debian13_sqv", use_debian13_repo))]
    assert "APT_SHA1_KEY_REJECTED" not in codes


def test_sha1_rule_predicts_before_the_repo_is_added() -> None:
    # Ubuntu with apt 3 and no repo yet: installing cuda-keyring for ubuntu2404 would hit sqv.
    findings = diagnose(edited("problem_case", chain(
        set_in("os.id", "ubuntu"), set_in("os.version_id", "24.04"), set_in("apt.version", "3.0.0"))))
    assert only(findings, "APT_SHA1_KEY_REJECTED").evidence["repos"] == ["ubuntu2404"]


def test_causal_conv1d_without_fla_is_complete_unless_fla_is_required() -> None:
    # Built for a Mamba-family model, say: nothing is missing. Required by the inventory: it is.
    def swap(data: dict[str, Any]) -> None:
        exts = data["pythons"][0]["extensions"]
        exts["fla"] = ext(False)
        exts["causal_conv1d"] = ext(True, compiled=True, module="causal_conv1d_cuda")
    facts = edited("problem_case", swap)
    assert "EXTENSION_MISSING" not in [f.code for f in diagnose(facts)]
    finding = only(diagnose(facts, required_extensions=["fla"]), "EXTENSION_MISSING")
    assert finding.evidence["extension"] == "fla"


def test_absent_extension_with_no_partner_is_not_a_finding_unless_required() -> None:
    def none_installed(data: dict[str, Any]) -> None:
        for name in data["pythons"][0]["extensions"]:
            data["pythons"][0]["extensions"][name] = ext(False)
    facts = edited("healthy", none_installed)
    assert diagnose(facts) == []
    required = diagnose(facts, required_extensions=["flash_attn"])
    assert [(f.code, f.evidence["extension"]) for f in required] == [("EXTENSION_MISSING", "flash_attn")]


def test_an_nvcc_that_prints_no_version_is_no_toolkit() -> None:
    # A wrapper in /usr/local/bin pointing at a removed toolkit: it cannot build anything, so the finding
    # is the missing toolkit, not a "mismatch" against an unknown version.
    def dangling_wrapper(data: dict[str, Any]) -> None:
        data["cuda"]["nvcc_on_path"] = {"path": "/usr/local/bin/nvcc", "version": None, "release": None}

    findings = diagnose(edited("problem_case", dangling_wrapper))
    assert problems(findings) == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED", "EXTENSION_MISSING"]


# ---------------------------------------------------------------- issue 17: today's fleets


def test_debian13_seed_problem_is_fixed_from_the_debian13_repo() -> None:
    # Recorded on the test bed's Debian 13 template: apt 3.0.4 with sqv, no apt-key, gcc 14.
    # The template has python3 without python3-dev, and no ninja: both real, both found.
    findings = diagnose(facts_of(load_fixture("debian13_cu130_problem")))
    assert problems(findings) == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED", "PYTHON_HEADERS_MISSING",
        "BUILD_TOOLS_MISSING", "EXTENSION_MISSING"]
    runtime, repo = findings[1], findings[2]   # after GPU_NOT_VISIBLE (no GPU on the test bed)
    assert (runtime.fix.playbook, runtime.fix.vars) == (CUDA_TOOLKIT_PLAYBOOK, {"cuda_version": "13.0"})
    assert "debian13/x86_64" in repo.fix.hint


def test_debian13_with_a_cuda_12_torch_gets_no_12x_toolkit_but_the_way_forward() -> None:
    # Debian 13 (glibc 2.41): NVIDIA's repository there starts at 13.0, NVIDIA's cu12 wheels hold no nvcc,
    # and no 12.x nvcc compiles against glibc 2.41. No playbook can install a working 12.8 toolkit.
    findings = diagnose(facts_of(load_fixture("debian13_cu128_problem")))
    assert problems(findings) == [
        "CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVCC_GLIBC_INCOMPATIBLE", "NVIDIA_REPO_LACKS_CUDA",
        "PYTHON_HEADERS_MISSING", "BUILD_TOOLS_MISSING", "EXTENSION_MISSING"]
    for code in ("CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVCC_GLIBC_INCOMPATIBLE", "NVIDIA_REPO_LACKS_CUDA"):
        fix = only(findings, code).fix
        assert fix.playbook is None, code
        assert "torch built for CUDA >= 13.0" in fix.hint and "whl/cu130" in fix.hint, fix.hint
    glibc = only(findings, "NVCC_GLIBC_INCOMPATIBLE")
    assert "glibc 2.41" in glibc.summary and "12.8" in glibc.summary and '"cospi"' in glibc.summary
    assert "the route is a torch built for CUDA >= 13.0" in glibc.summary
    assert "starts at CUDA 13.0" in only(findings, "NVIDIA_REPO_LACKS_CUDA").evidence["why"]


def test_the_pip_route_is_offered_for_cuda_13_only() -> None:
    # No apt at all: 13.0 goes to NVIDIA's wheels, 12.8 has none with an nvcc (tests/unit/groundtruth).
    def no_apt(cuda: str, version: str) -> Edit:
        return chain(set_in("apt.present", False), set_in("pythons.0.torch.cuda", cuda),
                     set_in("pythons.0.torch.version", version))
    cu130 = only(diagnose(edited("problem_case", no_apt("13.0", "2.14.1+cu130"))),
                 "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert (cu130.fix.playbook, cu130.fix.vars) == (
        CUDA_TOOLKIT_PIP_PLAYBOOK, {"cuda_version": "13.0", "python": "python3"})
    cu128 = only(diagnose(edited("problem_case", no_apt("12.8", "2.11.0+cu128"))),
                 "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert cu128.fix.playbook is None
    assert "ship no nvcc" in cu128.fix.hint and "whl/cu130" in cu128.fix.hint


def test_an_installed_12x_nvcc_on_glibc_2_41_is_a_broken_toolkit() -> None:
    # torch cu130 is fine here, but a 12.8 toolkit also installed cannot compile anything: say so.
    findings = diagnose(edited("debian13_cu130_problem", set_in("cuda.toolkits", [toolkit("12.8", "93")])))
    finding = only(findings, "NVCC_GLIBC_INCOMPATIBLE")
    assert finding.evidence["nvcc_paths"] == ["/usr/local/cuda-12.8/bin/nvcc"]
    assert (finding.evidence["nvcc_version"], finding.evidence["minimum_nvcc"]) == ("12.8", "13.0")
    assert finding.fix.playbook is None and "nvcc >= 13.0" in finding.fix.hint


def test_glibc_2_42_needs_nvcc_13_2() -> None:
    # Ubuntu 25.10-like: glibc 2.42 declares rsqrt too; 13.0's headers do not guard it, 13.2's do.
    findings = diagnose(edited("debian13_cu130_problem", set_in("build.glibc", "2.42")))
    finding = only(findings, "NVCC_GLIBC_INCOMPATIBLE")
    assert finding.evidence["minimum_nvcc"] == "13.2" and '"rsqrt"' in finding.summary
    assert "cuda_version=13.2" in finding.fix.hint and "cuda_home" in finding.fix.hint
    assert only(findings, "CUDA_RUNTIME_WITHOUT_TOOLKIT").fix.playbook is None
    older = diagnose(edited("debian13_cu130_problem", set_in("build.glibc", "2.40")))
    assert "NVCC_GLIBC_INCOMPATIBLE" not in [f.code for f in older]


def test_glibc_falls_back_to_the_python_envs_libc() -> None:
    # An older probe has no build.glibc; the python env's confstr says the same.
    def older_probe(data: dict[str, Any]) -> None:
        del data["build"]["glibc"]
        data["pythons"][0]["libc"] = "glibc 2.41"
    codes = [f.code for f in diagnose(edited("debian13_cu128_problem", older_probe))]
    assert "NVCC_GLIBC_INCOMPATIBLE" in codes


def test_apts_own_index_decides_when_the_repository_is_configured() -> None:
    def configured(nvcc: list[str]) -> Edit:
        return chain(set_in("apt.nvidia_sources", [nvidia_list(
            "/etc/apt/sources.list.d/cuda-debian12-x86_64.list", f"{NVIDIA}/debian12/x86_64/", KEYRING_SB)]),
            set_in("apt.nvidia_index", {"files": 1, "nvcc": nvcc}))
    lacking = diagnose(edited("problem_case", configured(["12-4", "12-6"])))
    assert only(lacking, "NVIDIA_REPO_LACKS_CUDA").evidence["index_nvcc"] == ["12-4", "12-6"]
    carried = diagnose(edited("problem_case", configured(["12-8"])))
    assert "NVIDIA_REPO_LACKS_CUDA" not in [f.code for f in carried]
    assert only(carried, "CUDA_RUNTIME_WITHOUT_TOOLKIT").fix.playbook == CUDA_TOOLKIT_PLAYBOOK


def test_sqv_with_a_sha1_keyed_repo_routes_to_pip_and_says_why() -> None:
    sqv = chain(set_in("os.id", "ubuntu"), set_in("os.version_id", "24.04"), set_in("apt.version", "3.0.0"))
    cu130 = chain(sqv, set_in("pythons.0.torch.cuda", "13.0"))
    assert only(diagnose(edited("problem_case", cu130)), "CUDA_RUNTIME_WITHOUT_TOOLKIT").fix.playbook == \
        CUDA_TOOLKIT_PIP_PLAYBOOK
    # torch cu128: NVIDIA's cu12 wheels hold no nvcc, so no playbook; the hint says what instead.
    findings = diagnose(edited("problem_case", sqv))
    runtime = only(findings, "CUDA_RUNTIME_WITHOUT_TOOLKIT")
    assert runtime.fix.playbook is None and "sqv rejects" in runtime.fix.hint and "cu130" in runtime.fix.hint
    assert "NVIDIA_REPO_NOT_CONFIGURED" not in [f.code for f in findings]
    assert only(findings, "APT_SHA1_KEY_REJECTED").evidence["repos"] == ["ubuntu2404"]


def test_rhel_family_gets_a_route_not_use_debian() -> None:
    finding = only(diagnose(edited("problem_case", CASES["RPM_DISTRO_TOOLKIT"].edit)), "RPM_DISTRO_TOOLKIT")
    assert finding.fix.playbook is None   # torch cu128: no pip toolkit for 12.x; dnf is the way
    assert "repos/rhel9/x86_64/cuda-rhel9.repo" in finding.fix.hint
    assert "cuda-cudart-devel-12-8" in finding.fix.hint
    # With no playbook before it, the hint is the route itself, and the pip wheels are not offered.
    assert finding.fix.hint.startswith("with dnf: ") and "pip wheels" not in finding.summary
    codes = [f.code for f in diagnose(edited("problem_case", CASES["RPM_DISTRO_TOOLKIT"].edit))]
    assert "UNSUPPORTED_DISTRO" not in codes and "NVIDIA_REPO_NOT_CONFIGURED" not in codes


def test_arm64_maps_to_sbsa_repo() -> None:
    findings = diagnose(edited("problem_case", set_in("os.machine", "aarch64")))
    assert "debian12/sbsa" in only(findings, "NVIDIA_REPO_NOT_CONFIGURED").fix.hint


def blackwell(cap: str, torch_cuda: str, nvcc: str) -> Edit:
    return chain(set_in("pythons.0.torch.cuda", torch_cuda), set_in("cuda.toolkits", [toolkit(nvcc)]),
                 set_in("cuda.default_link", f"/usr/local/cuda-{nvcc}"),
                 set_in("gpu.driver_version", "580.95.05"), set_in("gpu.driver_libs", []),
                 set_in("gpu.compute_caps", [cap]))


@pytest.mark.parametrize(("cap", "torch_cuda", "nvcc"), [
    ("10.3", "12.8", "12.8"),   # B300: sm_100 code runs on 10.3 (was a false ERROR)
    ("12.1", "12.8", "12.8"),   # GB10: sm_120 code runs on 12.1
    ("10.3", "12.9", "12.9"),   # 12.9 added sm_103 itself
    ("11.0", "13.0", "13.0"),   # Thor: sm_110 since 13.0
])
def test_blackwell_family_compatibility_is_no_error(cap: str, torch_cuda: str, nvcc: str) -> None:
    findings = diagnose(edited("healthy", blackwell(cap, torch_cuda, nvcc)))
    assert "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT" not in [f.code for f in findings]


def test_the_nvcc_a_build_would_use_decides_not_torchs_cuda() -> None:
    # torch cu128 on an RTX 5090 and the right 12.8 toolkit installed, but nvcc on PATH is an old 12.4:
    # a plain `pip install` builds with 12.4, which cannot target sm_120.
    def old_nvcc_on_path(data: dict[str, Any]) -> None:
        data["cuda"]["toolkits"] = [toolkit("12.8", "93"), toolkit("12.4", "131")]
        data["cuda"]["nvcc_on_path"] = {"path": "/usr/local/cuda-12.4/bin/nvcc", "version": "12.4",
                                        "release": "V12.4.131"}
        data["gpu"]["compute_caps"] = ["12.0"]
    finding = only(diagnose(edited("healthy", old_nvcc_on_path)), "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT")
    assert (finding.evidence["nvcc_version"], finding.evidence["nvcc_source"]) == ("12.4", "nvcc on PATH")
    assert "CUDA_HOME=/usr/local/cuda-12.8" in finding.fix.hint

    def cuda_home_in_environment(data: dict[str, Any]) -> None:
        data["cuda"]["toolkits"] = [toolkit("12.8", "93"), toolkit("12.4", "131")]
        data["cuda"]["env_cuda_home"] = "/usr/local/cuda-12.4"
        data["gpu"]["compute_caps"] = ["12.0"]
    finding = only(diagnose(edited("healthy", cuda_home_in_environment)), "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT")
    assert finding.evidence["nvcc_source"] == "CUDA_HOME"


def test_thor_needs_cuda_13() -> None:
    finding = only(diagnose(edited("healthy", blackwell("11.0", "12.8", "12.8"))),
                   "GPU_ARCH_UNSUPPORTED_BY_TOOLKIT")
    assert finding.evidence["minimum_nvcc"] == "13.0"


def test_driver_versions_are_printed_as_nvidia_writes_them() -> None:
    finding = only(diagnose(edited("toolkit_13_vs_cu128", chain(
        set_in("pythons.0.torch.cuda", "13.0"), set_in("gpu.driver_version", "580.0"),
        set_in("gpu.driver_libs", [])))), "DRIVER_BELOW_FULL_FEATURE")
    assert finding.evidence["full_feature_driver"] == "580.65.06"
    assert "580.65.06" in finding.summary and "580.65.6" not in finding.summary


def test_no_apt_key_advice_where_apt_has_none() -> None:
    def old_key(data: dict[str, Any]) -> None:
        data["apt"]["nvidia_keys"].append({"key": "7fa2af80", "file": "/etc/apt/trusted.gpg"})
    trixie = only(diagnose(edited("debian13_cu130_problem", old_key)), "APT_OLD_NVIDIA_KEY")
    assert "apt-key del" not in trixie.fix.hint and "/etc/apt/trusted.gpg" in trixie.fix.hint
    bookworm = only(diagnose(edited("problem_case", old_key)), "APT_OLD_NVIDIA_KEY")
    assert "apt-key del 7fa2af80" in bookworm.fix.hint


def test_mamba_ssm_without_selective_scan_cuda_is_a_complete_install() -> None:
    facts = edited("healthy", set_in("pythons.0.extensions.mamba_ssm",
                                     ext(True, compiled=False, module="selective_scan_cuda")))
    assert "EXTENSION_NOT_BUILT" not in [f.code for f in diagnose(facts)]


def test_build_host_rules_judge_only_targets_with_a_build_to_do() -> None:
    # The same shortcomings on a healthy target (nothing to build) are not findings.
    quiet = diagnose(edited("healthy", chain(
        set_in("build.ninja", False), set_in("build.mem_available_mb", 1000),
        set_in("build.tmp_fstype", "tmpfs"), set_in("build.tmp_free_mb", {"/tmp": 100}))))
    assert quiet == []


def test_gcc_14_is_fine_for_cuda_13_and_12_8_and_too_new_for_12_6() -> None:
    trixie = diagnose(facts_of(load_fixture("debian13_cu130_problem")))
    assert "HOST_COMPILER_TOO_NEW" not in [f.code for f in trixie]
    # 12.8's crt/host_config.h accepts gcc 14 (tests/unit/groundtruth reads it): no finding.
    gcc14 = chain(set_in("build.gxx_version", "14.2.0"), set_in("build.gxx_majors", [12, 14]))
    assert "HOST_COMPILER_TOO_NEW" not in [f.code for f in diagnose(edited("problem_case", gcc14))]
    finding = only(diagnose(edited("problem_case", chain(gcc14, set_in("pythons.0.torch.cuda", "12.6")))),
                   "HOST_COMPILER_TOO_NEW")
    assert finding.evidence["gxx_version"] == "14.2.0" and finding.evidence["newest_gcc"] == 13
    # The fix is CC/CXX (torch checks the compiler itself before nvcc runs), with the g++-12 installed.
    assert "CC=/usr/bin/gcc-12 CXX=/usr/bin/g++-12" in finding.fix.hint
    assert "NVCC_PREPEND_FLAGS" not in finding.fix.hint


def test_host_compiler_fix_names_a_package_the_distro_has() -> None:
    too_new = chain(set_in("build.gxx_version", "14.2.0"), set_in("pythons.0.torch.cuda", "12.6"))
    bookworm = only(diagnose(edited("problem_case", too_new)), "HOST_COMPILER_TOO_NEW")
    assert "install g++-12 (in Debian GNU/Linux 12 (bookworm)'s archive)" in bookworm.fix.hint
    jammy = only(diagnose(edited("apt_trouble", chain(too_new, set_in("build.gxx_version", "14.2.0")))),
                 "HOST_COMPILER_TOO_NEW")
    assert "install a g++ <= 13 from the distribution" in jammy.fix.hint


def test_an_installed_nvcc_that_refuses_gcc_is_broken_without_a_build_planned() -> None:
    # healthy: nothing to build or install, torch's 12.8 toolkit is there; a gcc 15 makes it unusable.
    gcc15 = set_in("build.gxx_version", "15.1.0")
    finding = only(diagnose(edited("healthy", gcc15)), "HOST_COMPILER_TOO_NEW")
    assert finding.evidence["nvcc_source"] == "torch's CUDA (installed)"


def test_cxx20_needs_gcc_10_from_torch_2_13() -> None:
    old_gcc = set_in("build.gxx_version", "9.4.0")
    assert "HOST_COMPILER_TOO_OLD" not in [f.code for f in diagnose(edited("problem_case", old_gcc))]
    finding = only(diagnose(edited("problem_case", chain(
        old_gcc, set_in("pythons.0.torch.version", "2.14.1+cu128")))), "HOST_COMPILER_TOO_OLD")
    assert "C++20" in finding.summary and "install g++-12" in finding.fix.hint


def test_a_bare_pip_nvcc_wheel_is_no_toolkit_but_a_complete_one_is() -> None:
    # The layout NVIDIA's 13.x wheels really have (nvidia/cu13/bin/nvcc; the cu12 ones carry no nvcc at
    # all, tests/unit/groundtruth): the nvcc wheel alone, without the runtime headers and CCCL, is no toolkit.
    cu130 = chain(set_in("pythons.0.torch.cuda", "13.0"), set_in("pythons.0.torch.version", "2.14.1+cu130"))
    bare = {"path": "/opt/jax/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc", "version": "13.0",
            "release": "V13.0.88", "complete": False}
    findings = diagnose(edited("problem_case", chain(cu130, set_in("pythons.0.pip_nvcc", [bare]))))
    assert only(findings, "CUDA_RUNTIME_WITHOUT_TOOLKIT").evidence["torch_cuda"] == "13.0"
    complete = {**bare, "complete": True}
    codes = [f.code for f in diagnose(edited("problem_case", chain(cu130, set_in("pythons.0.pip_nvcc",
                                                                                [complete]))))]
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" not in codes


def test_conda_nvcc_counts_as_a_toolkit() -> None:
    conda = {"path": "/opt/conda/envs/train/bin/nvcc", "version": "12.8", "release": "V12.8.93"}
    codes = [f.code for f in diagnose(edited("problem_case", set_in("pythons.0.conda_nvcc", conda)))]
    assert "CUDA_RUNTIME_WITHOUT_TOOLKIT" not in codes


def test_nvcc_on_path_of_another_major_is_an_error() -> None:
    finding = only(diagnose(edited("healthy", chain(
        set_in("cuda.toolkits", [toolkit("12.8", "93"), toolkit("13.0", "88")]),
        set_in("cuda.nvcc_on_path", {"path": "/usr/local/cuda-13.0/bin/nvcc", "version": "13.0",
                                     "release": "V13.0.88"})))), "BUILD_PICKS_OTHER_NVCC")
    assert finding.severity is Severity.ERROR and finding.evidence["set_in"] == "PATH"


def test_a_discovered_env_the_probe_inspected_is_no_finding() -> None:
    inspected = {"path": "/usr/bin/python3.11", "source": "process", "prefix": "/usr", "inspected": False,
                 "torch": {"version": "2.11.0+cu128", "cuda": "12.8", "path": None}}
    findings = diagnose(edited("healthy", set_in("discovered_pythons", [inspected])))
    assert findings == []   # its prefix (/usr) is python3's own


@pytest.mark.parametrize(("arch_list", "cap", "runs"), [
    (["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "8.9", True),   # cu128 on an L40S
    (["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "10.3", True),  # B300: sm_100
    (["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "6.1", False),  # cu128 on a P40
    (["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], "6.1", True),     # cu126 on a P40
    (["sm_80", "sm_90", "compute_90"], "12.0", True),                                   # PTX JIT forward
    (["sm_90a"], "9.0", True), (["sm_90a"], "10.0", False),                             # `a`: exact only
])
def test_wheel_arch_coverage(arch_list: list[str], cap: str, runs: bool) -> None:
    findings = diagnose(edited("healthy", chain(
        set_in("pythons.0.torch.arch_list", arch_list), set_in("gpu.compute_caps", [cap]))))
    assert ("TORCH_WHEEL_LACKS_ARCH" in [f.code for f in findings]) is not runs


def test_deep_arch_list_confirms() -> None:
    deep = {"cuda_available": True, "device_count": 1, "capabilities": ["6.0"],
            "arch_list": ["sm_75", "sm_80"], "error": None}
    finding = only(diagnose(edited("healthy", chain(
        set_in("pythons.0.torch.arch_list", None), set_in("gpu.compute_caps", ["6.0"]),
        set_in("pythons.0.deep", deep)))), "TORCH_WHEEL_LACKS_ARCH")
    assert finding.evidence["confirmed_by_deep"] is True


def test_a_rocm_torch_is_not_cpu_only() -> None:
    # torch/version.py of a ROCm build: cuda None, hip set (a 2.3.0.dev20240308+rocm6.0 nightly's values).
    rocm = diagnose(edited("healthy", chain(
        set_in("pythons.0.torch.cuda", None), set_in("pythons.0.torch.hip", "6.0.32830-d62f6a171"),
        set_in("pythons.0.torch.version", "2.3.0.dev20240308+rocm6.0"))))
    assert "TORCH_CPU_ONLY" not in [f.code for f in rocm]


def test_the_open_module_or_another_gpu_is_no_finding() -> None:
    b200 = chain(set_in("gpu.names", ["NVIDIA B200"]), set_in("gpu.compute_caps", ["10.0"]))
    open_node = NodeFacts(kernel_module_version="580.95.05", kernel_module_flavor="open", nvrm_line=OPEN_NVRM)
    assert "DRIVER_PROPRIETARY_MODULE" not in [f.code for f in diagnose(edited("healthy", b200), open_node)]
    proprietary = NodeFacts(kernel_module_version="570.124.06", kernel_module_flavor="proprietary",
                            nvrm_line=PROPRIETARY_NVRM)
    assert "DRIVER_PROPRIETARY_MODULE" not in [f.code for f in diagnose(facts_of(load_fixture("healthy")),
                                                                       proprietary)]   # an H200
    gh200 = set_in("gpu.names", ["NVIDIA GH200 480GB"])
    finding = only(diagnose(edited("healthy", gh200), proprietary), "DRIVER_PROPRIETARY_MODULE")
    assert "Grace Hopper" in finding.summary


def test_no_cuda_with_a_device_node_missing_is_the_partial_passthrough_finding_only() -> None:
    codes = [f.code for f in diagnose(edited("healthy", chain(
        set_in("pythons.0.deep", DEEP_NO_CUDA), set_in("gpu.devices", ["/dev/nvidia0", "/dev/nvidiactl"]))))]
    assert "GPU_PASSTHROUGH_PARTIAL" in codes and "CUDA_UNAVAILABLE_WITH_DEVICES" not in codes
    working = {**DEEP_NO_CUDA, "cuda_available": True}
    assert diagnose(edited("healthy", set_in("pythons.0.deep", working))) == []


def test_hub_kernels_of_a_release_that_maps_none_or_without_kernels_is_no_finding() -> None:
    later = {"transformers": "5.25.0", "kernels": "0.19.1",
             "hub_mapped": ["finegrained-fp8", "deep-gemm", "sonic-moe", "nvfp4"]}
    assert diagnose(edited("healthy", set_in("pythons.0.hub_kernels", later))) == []
    no_kernels = {**TRANSFORMERS_5_0_WITH_KERNELS, "kernels": None}
    assert diagnose(edited("healthy", set_in("pythons.0.hub_kernels", no_kernels))) == []


def test_causal_conv1d_on_a_b300_is_fine_with_a_cuda_12_build_or_on_another_gpu() -> None:
    b300 = chain(set_in("gpu.names", ["NVIDIA B300 SXM6 AC"]), set_in("gpu.compute_caps", ["10.3"]))
    assert "EXTENSION_WRONG_RESULTS" not in [f.code for f in diagnose(edited("healthy", b300))]  # cu128
    cu130 = chain(set_in("pythons.0.torch.cuda", "13.0"), set_in("pythons.0.torch.version", "2.14.1+cu130"))
    assert "EXTENSION_WRONG_RESULTS" not in [f.code for f in diagnose(edited("healthy", cu130))]  # an H200


@pytest.mark.parametrize(("cap", "hint"), [
    ("6.1", "torch 2.14 cu126"), ("7.0", "torch 2.14 cu126"), ("10.3", "torch 2.14 cu132"),
    ("12.0", "torch 2.14 cu132"),
])
def test_the_wheel_hint_names_a_torch_build_that_covers_the_gpu(cap: str, hint: str) -> None:
    lacking = ["sm_80"] if cap != "6.1" else ["sm_75", "sm_80"]
    finding = only(diagnose(edited("healthy", chain(
        set_in("pythons.0.torch.arch_list", lacking), set_in("gpu.compute_caps", [cap])))),
        "TORCH_WHEEL_LACKS_ARCH")
    assert hint in finding.fix.hint


def test_driver_table_runs_through_cuda_13_3() -> None:
    finding = only(diagnose(edited("healthy", chain(
        set_in("pythons.0.torch.cuda", "13.3"), set_in("gpu.driver_version", "595.71.05")))),
        "DRIVER_BELOW_FULL_FEATURE")
    assert finding.evidence["full_feature_driver"] == "610.43.02"


def test_cuda_home_set_to_the_symlink_is_judged_as_the_toolkit_it_points_at() -> None:
    facts = edited("healthy", chain(
        set_in("cuda.toolkits", [toolkit("12.8", "93"), toolkit("13.0", "88")]),
        set_in("cuda.default_link", "/usr/local/cuda-13.0"),
        set_in("cuda.env_cuda_home", "/usr/local/cuda"),
        set_in("cuda.env_cuda_home_target", "/usr/local/cuda-13.0"),
        set_in("cuda.env_cuda_home_file", "/etc/environment")))
    finding = only(diagnose(facts), "BUILD_PICKS_OTHER_NVCC")
    assert (finding.evidence["nvcc_source"], finding.evidence["set_in"]) == ("CUDA_HOME", "/etc/environment")
    assert finding.evidence["nvcc_version"] == "13.0" and finding.severity is Severity.ERROR


def test_ubuntu_2004s_repository_ends_at_cuda_12_9() -> None:
    focal = chain(set_in("os.id", "ubuntu"), set_in("os.version_id", "20.04"), set_in("os.codename", "focal"))
    cu130 = chain(focal, set_in("pythons.0.torch.cuda", "13.0"),
                  set_in("pythons.0.torch.version", "2.14.1+cu130"))
    lacks = only(diagnose(edited("problem_case", cu130)), "NVIDIA_REPO_LACKS_CUDA")
    assert lacks.evidence["nvidia_distro"] == "ubuntu2004" and "ends at CUDA 12.9" in lacks.evidence["why"]
    assert lacks.fix.playbook == CUDA_TOOLKIT_PIP_PLAYBOOK
    codes = [f.code for f in diagnose(edited("problem_case", focal))]   # torch cu128: apt serves it
    assert "NVIDIA_REPO_LACKS_CUDA" not in codes and "NVIDIA_REPO_NOT_CONFIGURED" in codes


def test_mamba_ssm_without_causal_conv1d_names_the_mamba_fast_path() -> None:
    facts = edited("healthy", chain(
        set_in("pythons.0.extensions.mamba_ssm", ext(True, compiled=True, module="selective_scan_cuda")),
        set_in("pythons.0.extensions.causal_conv1d", ext(False, module="causal_conv1d_cuda"))))
    finding = only(diagnose(facts), "EXTENSION_MISSING")
    assert finding.evidence["extension"] == "causal_conv1d" and "mamba_ssm" in finding.evidence["present"]
    assert "Mamba-family" in finding.summary and "both mamba-ssm and causal-conv1d" in finding.summary


# ---------------------------------------------------------------- PEP 668: the fix a user is handed runs

def pep668(*, managed: bool | None, installer: str | None = "pip", pip: str | None = "23.0.1",
           configured: str | None = None) -> Edit:
    return chain(set_in("pythons.0.externally_managed", managed),
                 set_in("pythons.0.torch_installer", installer), set_in("pythons.0.pip_version", pip),
                 set_in("pythons.0.pip_break_system_packages", configured))


def test_torch_installed_by_pip_into_a_marked_python_gets_break_system_packages_in_the_command() -> None:
    # Debian 12's python3 with torch put there by pip: the team already broke system packages for it.
    missing = only(diagnose(edited("problem_case", pep668(managed=True))), "EXTENSION_MISSING")
    assert missing.fix.playbook == BUILD_EXTENSIONS_PLAYBOOK
    assert missing.fix.vars == {"extensions": ["causal_conv1d"], "python": "python3", "cuda_version": "12.8",
                                "break_system_packages": "true"}
    assert "--var break_system_packages=true" in missing.fix.text()
    assert "pip install --break-system-packages --no-build-isolation causal-conv1d" in missing.fix.hint


@pytest.mark.parametrize(("installer", "pip", "said"), [
    (None, "23.0.1", "torch there is the distribution's (no INSTALLER)"),
    ("conda", "23.0.1", "torch there was installed by conda"),
    ("pip", "22.3.1", "pip 22.3.1 has no --break-system-packages (23.0.1+)"),
])
def test_a_marked_python_whose_torch_pip_may_not_touch_gets_the_venv_route_not_a_failing_playbook(
        installer: str | None, pip: str | None, said: str) -> None:
    facts = edited("problem_case", pep668(managed=True, installer=installer, pip=pip))
    missing = only(diagnose(facts), "EXTENSION_MISSING")
    assert missing.fix.playbook is None and missing.fix.vars == {}
    assert missing.fix.hint.startswith(f"python3 is externally managed (PEP 668) and {said}: ")
    assert ("python3 -m venv --system-site-packages /opt/torch-venv, then fleetfix apply "
            f"{BUILD_EXTENSIONS_PLAYBOOK} --var extensions=causal_conv1d "
            "--var python=/opt/torch-venv/bin/python --var cuda_version=12.8") in missing.fix.hint


def test_a_marked_python_whose_pip_is_gone_is_told_to_install_pip_not_a_venv() -> None:
    # Debian's `python3 -m venv` needs python3-venv (ensurepip): without pip it would fail too.
    facts = edited("problem_case", pep668(managed=True, installer="pip", pip=None))
    missing = only(diagnose(facts), "EXTENSION_MISSING")
    assert missing.fix.playbook is None
    assert missing.fix.hint == (
        "python3 is externally managed (PEP 668) and has no pip, although pip installed torch there: install "
        "pip (Debian/Ubuntu: apt-get install python3-pip python3-dev), then fleetfix apply "
        f"{BUILD_EXTENSIONS_PLAYBOOK} --var extensions=causal_conv1d --var python=python3 "
        "--var cuda_version=12.8 --var break_system_packages=true")


@pytest.mark.parametrize("edit", [pep668(managed=False, installer=None), pep668(managed=None, installer=None),
                                  pep668(managed=True, installer=None, configured="/etc/pip.conf")])
def test_an_unmarked_venv_an_older_probe_or_a_configured_pip_keep_the_plain_build(edit: Edit) -> None:
    missing = only(diagnose(edited("problem_case", edit)), "EXTENSION_MISSING")
    assert missing.fix.vars == {"extensions": ["causal_conv1d"], "python": "python3", "cuda_version": "12.8"}
    assert "pip install --no-build-isolation causal-conv1d" in missing.fix.hint


def test_the_other_build_findings_take_the_same_route() -> None:
    def not_built(data: dict[str, Any]) -> None:
        data["pythons"][0]["extensions"]["causal_conv1d"].update(present=True, compiled_present=False)
    facts = edited("problem_case", chain(not_built, pep668(managed=True)))
    finding = only(diagnose(facts), "EXTENSION_NOT_BUILT")
    assert finding.fix.vars["break_system_packages"] == "true"
    assert "pip install --break-system-packages --no-build-isolation --force-reinstall" in finding.fix.hint
    facts = edited("problem_case", chain(not_built, pep668(managed=True, installer=None)))
    finding = only(diagnose(facts), "EXTENSION_NOT_BUILT")
    assert finding.fix.playbook is None and "--system-site-packages" in finding.fix.hint
