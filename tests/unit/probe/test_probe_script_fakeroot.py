"""The real probe.sh against fake file trees (FLEETFIX_PROBE_ROOT) and fake commands on PATH.

Each test builds the situation on disk the way apt, dpkg, NVIDIA's packages or pip would leave
it, runs the unmodified script under dash, and checks the parsed facts.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import pytest
from probe_testkit import FakeBin, fake_nvcc, probe_facts, run_probe, write

from fleetfix.errors import ProbeOutputError
from fleetfix.probe import (
    Facts,
    build_node_script,
    build_probe_script,
    diagnose,
    parse_facts,
    parse_node_facts,
)

KEY_7FA2AF80 = bytes.fromhex("F60F4B3D7FA2AF80")
KEY_3BF863CC = bytes.fromhex("A4B469963BF863CC")
NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos"


def probe(root: Path, fakebin: FakeBin, pythons: tuple[str, ...] = (), *, deep: bool = False,
          path: str | None = None, env: dict[str, str] | None = None) -> Facts:
    """The probe against a fake root with only fakebin (plus `path`) to find commands in."""
    return probe_facts(build_probe_script(pythons, deep=deep), root=root, path=path or str(fakebin.path),
                       hermetic=True, env=env)


def test_sources_list_and_deb822_entries(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "etc/apt/sources.list", (
        "deb http://deb.debian.org/debian bookworm main\n"
        f"# deb {NVIDIA}/debian12/x86_64/ /\n"
        f"deb {NVIDIA}/debian12/x86_64 /\n"
    ))
    write(fakeroot, "etc/apt/sources.list.d/cuda-debian12-x86_64.list",
          f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {NVIDIA}/debian12/x86_64/ /\n")
    write(fakeroot, "etc/apt/sources.list.d/spaced.list",
          f"deb [ arch=amd64 signed-by=/etc/apt/keyrings/nv.gpg ] {NVIDIA}/debian12/x86_64/ / main contrib\n")
    write(fakeroot, "etc/apt/sources.list.d/cuda.list.disabled", f"deb {NVIDIA}/debian12/x86_64/ /\n")
    write(fakeroot, "etc/apt/sources.list.d/nvidia.sources", (
        "# a comment\n"
        "Types: deb\n"
        f"URIs: {NVIDIA}/debian12/x86_64/ http://mirror.example/debian\n"
        "Suites: /\n"
        "Signed-By:\n"
        " -----BEGIN PGP PUBLIC KEY BLOCK-----\n"
        " mQINBGJYmlEBEADh\n"
        " -----END PGP PUBLIC KEY BLOCK-----\n"
        "\n"
        "types: deb deb-src\n"
        f"uris: {NVIDIA}/ubuntu2404/sbsa/\n"
        "suites: /\n"
        "enabled: no\n"
    ))
    sources = probe(fakeroot, fakebin).apt.nvidia_sources
    summary = [(s.file, s.line, s.format, s.uri, s.suite, s.signed_by, s.enabled) for s in sources]
    assert summary == [
        ("/etc/apt/sources.list", 3, "list", f"{NVIDIA}/debian12/x86_64", "/", None, True),
        ("/etc/apt/sources.list.d/cuda-debian12-x86_64.list", 1, "list", f"{NVIDIA}/debian12/x86_64/", "/",
         "/usr/share/keyrings/cuda-archive-keyring.gpg", True),
        ("/etc/apt/sources.list.d/spaced.list", 1, "list", f"{NVIDIA}/debian12/x86_64/", "/",
         "/etc/apt/keyrings/nv.gpg", True),
        ("/etc/apt/sources.list.d/nvidia.sources", 3, "deb822", f"{NVIDIA}/debian12/x86_64/", "/",
         "inline", True),
        ("/etc/apt/sources.list.d/nvidia.sources", 11, "deb822", f"{NVIDIA}/ubuntu2404/sbsa/", "/",
         None, False),
    ]
    assert sources[2].components == "main contrib"
    assert sources[4].types == "deb deb-src"


def test_no_sources_at_all(fakeroot: Path, fakebin: FakeBin) -> None:
    facts = probe(fakeroot, fakebin)
    assert facts.apt.nvidia_sources == []
    assert facts.apt.nvidia_repo_configured is False


def test_nvidia_keys_found_by_key_id_bytes(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "etc/apt/trusted.gpg", b"\x99\x01\x0d" + KEY_7FA2AF80 + b"\x00junk")
    write(fakeroot, "usr/share/keyrings/cuda-archive-keyring.gpg", b"\x99\x02" + KEY_3BF863CC)
    write(fakeroot, "usr/share/keyrings/debian-archive-keyring.gpg", b"\x99\x02 nothing of NVIDIA's")
    apt = probe(fakeroot, fakebin).apt
    assert {(k.key, k.file) for k in apt.nvidia_keys} == {
        ("7fa2af80", "/etc/apt/trusted.gpg"), ("3bf863cc", "/usr/share/keyrings/cuda-archive-keyring.gpg")}
    assert apt.keyring_file is True


def test_dpkg_interrupted_counts_journal_files(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("dpkg", "exit 0\n")
    write(fakeroot, "var/lib/dpkg/updates/tmp.i", "")
    assert probe(fakeroot, fakebin).dpkg.interrupted is False
    write(fakeroot, "var/lib/dpkg/updates/0001", "Package: x\n")
    write(fakeroot, "var/lib/dpkg/updates/0002", "Package: y\n")
    dpkg = probe(fakeroot, fakebin).dpkg
    assert (dpkg.present, dpkg.interrupted, dpkg.pending_updates) == (True, True, 2)


@pytest.mark.parametrize("with_stat", [True, False], ids=["device+inode", "inode-only"])
def test_dpkg_lock_holder_named_from_proc_locks(fakeroot: Path, fakebin: FakeBin, with_stat: bool) -> None:
    if with_stat:
        fakebin.link("stat", "/usr/bin/stat")
    lock = write(fakeroot, "var/lib/dpkg/lock-frontend", "")
    write(fakeroot, "var/lib/dpkg/lock", "")
    assert probe(fakeroot, fakebin).dpkg.lock_holders == []
    with lock.open("r+") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)   # what apt does
        holders = probe(fakeroot, fakebin).dpkg.lock_holders
    assert [(h.lock, h.pid) for h in holders] == [("/var/lib/dpkg/lock-frontend", os.getpid())]
    assert holders[0].command == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


def test_toolkits_links_and_distro_nvcc(fakeroot: Path, fakebin: FakeBin) -> None:
    fake_nvcc(fakeroot, "usr/local/cuda-12.8/bin/nvcc", "12.8", "V12.8.93")
    (fakeroot / "usr/local/cuda-12.4/lib64").mkdir(parents=True)        # runtime libs only, no nvcc
    (fakeroot / "usr/local/cuda-12").symlink_to("cuda-12.8")           # alternatives' major link
    write(fakeroot, "etc/alternatives/.keep", "")
    (fakeroot / "etc/alternatives/cuda").symlink_to("/usr/local/cuda-12.8")
    (fakeroot / "usr/local/cuda").symlink_to("/etc/alternatives/cuda")
    fake_nvcc(fakeroot, "usr/bin/nvcc", "12.0", "V12.0.140")
    cuda = probe(fakeroot, fakebin).cuda
    assert [(t.path, t.version, t.nvcc, t.release) for t in cuda.toolkits] == [
        ("/usr/local/cuda-12.4", "12.4", None, None),
        ("/usr/local/cuda-12.8", "12.8", "/usr/local/cuda-12.8/bin/nvcc", "V12.8.93"),
    ]
    assert cuda.default_link == "/usr/local/cuda-12.8"
    assert cuda.distro_nvcc is not None
    assert (cuda.distro_nvcc.path, cuda.distro_nvcc.version) == ("/usr/bin/nvcc", "12.0")


def test_nvcc_on_callers_path(fakeroot: Path, fakebin: FakeBin, tmp_path: Path) -> None:
    nvcc = fake_nvcc(tmp_path, "pathbin/nvcc", "12.6", "V12.6.85")
    facts = probe(fakeroot, fakebin, path=f"{fakebin.path}:{nvcc.parent}")
    assert facts.cuda.nvcc_on_path is not None
    assert (facts.cuda.nvcc_on_path.path, facts.cuda.nvcc_on_path.release) == (str(nvcc), "V12.6.85")


def test_packages_from_dpkg_query(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("dpkg-query", (
        "printf 'install ok installed\\tapt\\t2.6.1\\n'\n"
        "printf 'install ok installed\\tcuda-keyring\\t1.1-1\\n'\n"
        "printf 'install ok installed\\tcuda-nvcc-12-8\\t12.8.93-1\\n'\n"
        "printf 'deinstall ok config-files\\tcuda-nvcc-12-4\\t12.4.131-1\\n'\n"
        "printf 'install ok installed\\tlibcublas-dev-12-8\\t12.8.4.1-1\\n'\n"
        "printf 'install ok installed\\tlibcups2-dev\\t2.4.2-3\\n'\n"
    ))
    fakebin.script("apt-get", "exit 0\n")
    facts = probe(fakeroot, fakebin)
    assert (facts.apt.present, facts.apt.version) == (True, "2.6.1")
    assert (facts.apt.keyring_installed, facts.apt.keyring_version) == (True, "1.1-1")
    assert facts.apt.keyring_list is None  # dpkg's file list of it is not there
    assert [(p.name, p.version) for p in facts.cuda.packages] == [
        ("cuda-keyring", "1.1-1"), ("cuda-nvcc-12-8", "12.8.93-1"), ("libcublas-dev-12-8", "12.8.4.1-1")]


def test_apt_version_falls_back_to_apt_get(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("apt-get", "echo 'apt 3.0.3 (amd64)'\n")
    write(fakeroot, "usr/bin/sqv", "", mode=0o755)
    apt = probe(fakeroot, fakebin).apt
    assert (apt.version, apt.sqv, apt.uses_sqv) == ("3.0.3", True, True)


def test_gpu_from_nvidia_smi_devices_and_driver_libs(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("nvidia-smi", (
        "echo '570.124.06, NVIDIA H200, 9.0'\n"
        "echo '570.124.06, NVIDIA RTX PRO 6000 Blackwell, Workstation, 12.0'\n"
    ))
    for dev in ("dev/nvidia0", "dev/nvidiactl", "dev/nvidia-uvm"):
        write(fakeroot, dev, "")
    (fakeroot / "dev/nvidia-caps").mkdir()
    libs = fakeroot / "usr/lib/x86_64-linux-gnu"
    write(fakeroot, "usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06", "")
    (libs / "libcuda.so.1").symlink_to("libcuda.so.570.124.06")
    write(fakeroot, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.124.06", "")
    gpu = probe(fakeroot, fakebin).gpu
    assert gpu.devices == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    assert gpu.driver_version == "570.124.06"
    assert gpu.names == ["NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell, Workstation"]
    assert gpu.compute_caps == ["9.0", "12.0"]
    assert gpu.userspace_driver_versions == ["570.124.06"]
    assert len(gpu.driver_libs) == 2


def test_old_nvidia_smi_without_compute_cap(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("nvidia-smi", (
        'case "$1" in *compute_cap*)\n'
        '  echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;;\n'
        'esac\n'
        "echo '470.256.02, Tesla V100-SXM2-16GB'\n"
    ))
    gpu = probe(fakeroot, fakebin).gpu
    assert (gpu.driver_version, gpu.names, gpu.compute_caps) == ("470.256.02", ["Tesla V100-SXM2-16GB"], [])


def test_nvml_failure_is_reported_not_fatal(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("nvidia-smi",
                   "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    gpu = probe(fakeroot, fakebin).gpu
    assert gpu.smi_present is True
    assert gpu.driver_version is None
    assert gpu.smi_error == "Failed to initialize NVML: Driver/library version mismatch"


def test_awkward_text_is_escaped_into_valid_json(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "etc/os-release", (
        'ID=debian\nVERSION_ID="12"\n'
        'PRETTY_NAME="Debian \\"quoted\\" back\\\\slash\ttab caf\u00e9 $(id)"\n'
    ))
    facts = probe(fakeroot, fakebin)
    assert (facts.os.id, facts.os.version_id, facts.os.nvidia_distro) == ("debian", "12", "debian12")
    pretty = facts.os.pretty_name
    assert pretty is not None
    assert '\\"quoted\\"' in pretty and "back\\\\slash" in pretty and "$(id)" in pretty
    assert "\t" not in pretty and pretty.isascii()


def test_os_release_fallback_and_missing(fakeroot: Path, fakebin: FakeBin) -> None:
    assert probe(fakeroot, fakebin).os.id is None
    write(fakeroot, "usr/lib/os-release", "ID=ubuntu\nVERSION_ID='24.04'\nVERSION_CODENAME=noble\n")
    os_facts = probe(fakeroot, fakebin).os
    assert (os_facts.id, os_facts.version_id, os_facts.codename, os_facts.nvidia_distro) == (
        "ubuntu", "24.04", "noble", "ubuntu2404")


# ---------------------------------------------------------------- python environments

TORCH_VERSION_PY = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '2.11.0+cu128'
debug = False
cuda: Optional[str] = '12.8'
git_version = 'abc123'
hip: Optional[str] = None
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A fake site-packages: torch (importing it leaves a marker), fla, causal_conv1d without its
    compiled module, flash_attn with one, and a pip nvcc wheel."""
    site = tmp_path / "site"
    write(site, "torch/__init__.py", (
        "import os\n"
        "open(os.environ['TORCH_MARKER'], 'w').close()\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: False)\n"
    ))
    write(site, "torch/version.py", TORCH_VERSION_PY)
    write(site, "fla/__init__.py", "")
    write(site, "causal_conv1d/__init__.py", "import causal_conv1d_cuda\n")
    write(site, "flash_attn/__init__.py", "")
    write(site, "flash_attn_2_cuda.py", "")
    # Where NVIDIA's nvidia-cuda-nvcc 13.0.88 wheel puts it (its cu12 wheels hold ptxas alone).
    fake_nvcc(site, "nvidia/cu13/bin/nvcc", "13.0", "V13.0.88")
    return site


def python_env(site: Path, tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(site), "TORCH_MARKER": str(tmp_path / "torch-imported")}


def test_python_env_without_importing_torch(fakeroot: Path, fakebin: FakeBin, site: Path,
                                            tmp_path: Path) -> None:
    fakebin.link("python3", sys.executable)
    facts = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path))
    env = facts.pythons[0]
    assert env.found and env.error is None
    assert env.torch is not None
    assert (env.torch.version, env.torch.cuda) == ("2.11.0+cu128", "12.8")
    assert env.torch.path == str(site / "torch")
    assert facts.torch is not None and facts.torch.cuda == "12.8"
    ext = env.extensions
    assert (ext["causal_conv1d"].present, ext["causal_conv1d"].compiled_present) == (True, False)
    assert (ext["flash_attn"].present, ext["flash_attn"].compiled_present) == (True, True)
    assert (ext["fla"].present, ext["fla"].compiled_present) == (True, None)
    assert ext["mamba_ssm"].present is False
    assert all(e.importable is None for e in ext.values())      # not checked without --deep
    assert [(n.version, n.release) for n in env.pip_nvcc] == [("13.0", "V13.0.88")]
    assert not (tmp_path / "torch-imported").exists()           # torch's __init__ never ran
    assert not list(site.rglob("__pycache__"))                  # and nothing was written


def test_deep_imports_in_children(fakeroot: Path, fakebin: FakeBin, site: Path, tmp_path: Path) -> None:
    fakebin.link("python3", sys.executable)
    facts = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path), deep=True)
    env = facts.pythons[0]
    assert facts.deep is True
    assert env.deep is not None and env.deep.cuda_available is False
    assert (tmp_path / "torch-imported").exists()
    causal = env.extensions["causal_conv1d"]
    assert causal.importable is False
    assert causal.error is not None and "causal_conv1d_cuda" in causal.error
    assert env.extensions["flash_attn"].importable is True
    assert env.extensions["fla"].importable is True
    assert env.extensions["mamba_ssm"].importable is None        # absent: nothing to import
    assert not list(site.rglob("__pycache__"))


def test_extension_versions_from_dist_info_and_egg_info(fakeroot: Path, fakebin: FakeBin, site: Path,
                                                        tmp_path: Path) -> None:
    # What pip (wheel: .dist-info, names normalised), `setup.py develop` (.egg-info directory) and
    # old distutils (.egg-info file) leave; the first match along sys.path wins, as in importlib.metadata.
    write(site, "causal_conv1d-1.5.0.post8.dist-info/METADATA",
          "Metadata-Version: 2.1\nName: causal-conv1d\nVersion: 1.5.0.post8\n\nVersion: not-a-header\n")
    write(site, "Flash_Attn.egg-info/PKG-INFO", "Metadata-Version: 1.0\nName: flash_attn\nVersion: 2.7.4\n")
    write(site, "fla_core-0.1.egg-info", "Metadata-Version: 1.0\nName: fla-core\nVersion: 0.1\n")
    later = tmp_path / "later"
    write(later, "causal_conv1d-9.9.dist-info/METADATA", "Name: causal-conv1d\nVersion: 9.9\n")
    env = python_env(site, tmp_path) | {"PYTHONPATH": f"{site}:{later}"}
    fakebin.link("python3", sys.executable)
    ext = probe(fakeroot, fakebin, ("python3",), env=env).pythons[0].extensions
    assert ext["causal_conv1d"].version == "1.5.0.post8"
    assert ext["flash_attn"].version == "2.7.4"
    assert ext["fla"].version == "0.1"
    assert ext["mamba_ssm"].version is None


@pytest.mark.parametrize(("text", "version", "cuda"), [
    ('__version__ = "2.8.0+cu128"  # generated\ncuda = "12.8#x"\nhip = None\n', "2.8.0+cu128", "12.8#x"),
    ("__version__ = '2.8.0'\ncuda: Optional[str] = None\nif cuda == '1':\n    cuda = '9.9'\n", "2.8.0", None),
    ("def broken(:\n", None, None),
])
def test_torch_version_py_is_read_as_text(fakeroot: Path, fakebin: FakeBin, tmp_path: Path,
                                          text: str, version: str | None, cuda: str | None) -> None:
    site = tmp_path / "site"
    write(site, "torch/__init__.py", "raise SystemExit('torch must not be imported')\n")
    write(site, "torch/version.py", text)
    fakebin.link("python3", sys.executable)
    torch = probe(fakeroot, fakebin, ("python3",), env={"PYTHONPATH": str(site)}).pythons[0].torch
    assert torch is not None and (torch.version, torch.cuda, torch.hip) == (version, cuda, None)


def test_any_interpreter_name_comes_back_intact(fakeroot: Path, fakebin: FakeBin) -> None:
    # The Python side writes its JSON by hand (json imports re: a third of its start-up).
    name = 'py"th\\on\t\x01é€😀'
    fakebin.link(name, sys.executable)
    env = probe(fakeroot, fakebin, (name,)).pythons[0]
    assert env.error is None and env.interpreter == name


def test_a_torch_directory_in_the_cwd_is_not_the_envs_torch(fakeroot: Path, fakebin: FakeBin,
                                                           tmp_path: Path) -> None:
    write(tmp_path, "torch/version.py", "__version__ = '0.0.0+fake'\ncuda = '9.9'\n")
    fakebin.link("python3", sys.executable)
    done = run_probe(build_probe_script(("python3",)), root=fakeroot, path=str(fakebin.path),
                     hermetic=True, cwd=tmp_path)
    torch = parse_facts(done.stdout).pythons[0].torch
    assert torch is None or torch.version != "0.0.0+fake"


def test_interpreter_that_is_not_python3(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.script("python3", "echo 'SyntaxError: invalid syntax' >&2\necho garbage\nexit 1\n")
    env = probe(fakeroot, fakebin, ("python3",)).pythons[0]
    assert env.found is True
    assert env.error is not None and "printed no probe result" in env.error


def test_a_hung_tool_is_bounded(fakeroot: Path, fakebin: FakeBin) -> None:
    fakebin.link("sleep", "/bin/sleep")
    fakebin.script("nvidia-smi", "sleep 30\n")     # a wedged GPU makes nvidia-smi hang
    facts = probe(fakeroot, fakebin, env={"FLEETFIX_PROBE_TIMEOUT": "1"})
    assert facts.gpu.smi_error == "nvidia-smi timed out after 1s"
    assert facts.build.cpus is not None


# ---------------------------------------------------------------- node facts


@pytest.mark.parametrize(("line", "version", "flavor"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.135  Tue Nov 12 20:31:54 UTC 2024",
     "550.135", "proprietary"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:50:14 UTC 2025", "580.95.05", "open"),
])
def test_node_script_reads_kernel_module(fakeroot: Path, fakebin: FakeBin, line: str, version: str,
                                         flavor: str) -> None:
    write(fakeroot, "proc/driver/nvidia/version", line + "\nGCC version:  gcc version 12.2.0\n")
    done = run_probe(build_node_script(), root=fakeroot, path=str(fakebin.path))
    node = parse_node_facts(done.stdout)
    assert (node.kernel_module_version, node.kernel_module_flavor, node.nvrm_line) == (version, flavor, line)
    assert node.hostname == os.uname().nodename


def test_node_without_driver(fakeroot: Path, fakebin: FakeBin) -> None:
    node = parse_node_facts(run_probe(build_node_script(), root=fakeroot, path=str(fakebin.path)).stdout)
    assert node.kernel_module_version is None and node.nvrm_line is None


def test_node_output_must_be_ours() -> None:
    with pytest.raises(ProbeOutputError, match="header"):
        parse_node_facts("Welcome to Proxmox!\nhostname\tpve1\n")


def test_cuda_home_for_logins_and_apts_own_index_of_nvidia_repos(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "etc/environment", 'LANG=C.UTF-8\nCUDA_HOME="/usr/local/cuda-12.4"\n')
    write(fakeroot, "etc/profile.d/cuda.sh", "export PATH=/usr/local/cuda/bin:$PATH\n")
    lists = "var/lib/apt/lists/developer.download.nvidia.com_compute_cuda_repos_debian12_x86_64_Packages"
    write(fakeroot, lists, "Package: cuda-nvcc-12-4\nVersion: 12.4.131-1\n\nPackage: cuda-nvcc-12-8\n"
                           "Version: 12.8.93-1\n\nPackage: cuda-nvcc-12-8\nVersion: 12.8.61-1\n\n"
                           "Package: cuda-nvcc-dev-fake\n\n")
    facts = probe(fakeroot, fakebin)
    assert (facts.cuda.env_cuda_home, facts.cuda.env_cuda_home_file) == ("/usr/local/cuda-12.4",
                                                                         "/etc/environment")
    assert (facts.apt.nvidia_index.files, facts.apt.nvidia_index.nvcc) == (1, ["12-4", "12-8"])
    assert facts.apt.nvidia_index.carries("12.8") is True and facts.apt.nvidia_index.carries("13.0") is False
    assert facts.apt.apt_key is False   # no apt-key among the fake commands


def test_cuda_home_through_the_default_symlink_names_the_toolkit(fakeroot: Path, fakebin: FakeBin) -> None:
    fake_nvcc(fakeroot, "usr/local/cuda-12.8/bin/nvcc", "12.8", "V12.8.93")
    fake_nvcc(fakeroot, "usr/local/cuda-13.0/bin/nvcc", "13.0", "V13.0.88")
    (fakeroot / "usr/local/cuda").symlink_to("cuda-13.0")          # relative, as update-alternatives makes
    write(fakeroot, "etc/environment", "CUDA_HOME=/usr/local/cuda/\n")
    facts = probe(fakeroot, fakebin)
    assert facts.cuda.env_cuda_home == "/usr/local/cuda/"
    assert facts.cuda.env_cuda_home_target == "/usr/local/cuda-13.0"
    assert facts.cuda.toolkit_at(facts.cuda.env_cuda_home_target) is not None


def test_no_index_and_no_cuda_home_are_unknown_not_false(fakeroot: Path, fakebin: FakeBin) -> None:
    facts = probe(fakeroot, fakebin)
    assert facts.cuda.env_cuda_home is None
    assert facts.apt.nvidia_index.files == 0 and facts.apt.nvidia_index.carries("12.8") is None


def test_a_bare_pip_nvcc_is_incomplete_until_runtime_headers_and_cccl_are_beside_it(
    fakeroot: Path, fakebin: FakeBin, site: Path, tmp_path: Path,
) -> None:
    fakebin.link("python3", sys.executable)
    [bare] = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path)).pythons[0].pip_nvcc
    assert bare.complete is False        # the nvcc wheel alone, as JAX pulls it in
    # The paths of nvidia-cuda-runtime 13.0.96's and nvidia-cuda-cccl 13.0.85's wheels.
    write(site, "nvidia/cu13/include/cuda_runtime_api.h", "")
    write(site, "nvidia/cu13/include/cccl/cub/cub.cuh", "")
    [complete] = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path)).pythons[0].pip_nvcc
    assert complete.complete is True


def test_python_headers_are_looked_up_for_the_interpreter(
    fakeroot: Path, fakebin: FakeBin, site: Path, tmp_path: Path,
) -> None:
    import sysconfig
    fakebin.link("python3", sys.executable)
    env = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path)).pythons[0]
    expected = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    assert env.python_h is expected
    assert env.conda_nvcc is None


def test_discovers_venvs_and_conda_envs_with_torch_read_as_text(fakeroot: Path, fakebin: FakeBin) -> None:
    for prefix in ("opt/train/venv", "opt/conda/envs/infer", "root/.venv"):
        write(fakeroot, f"{prefix}/bin/python3", "#!/bin/sh\nexit 99\n")   # never run: it would fail
        (fakeroot / prefix / "bin/python3").chmod(0o755)
    write(fakeroot, "opt/train/venv/lib/python3.11/site-packages/torch/version.py", TORCH_VERSION_PY)
    write(fakeroot, "opt/conda/envs/infer/lib/python3.12/site-packages/torch/version.py",
          "__version__ = '2.9.1+cpu'\ncuda = None\n")
    facts = probe(fakeroot, fakebin)
    found = {d.path: d for d in facts.discovered_pythons}
    train = found["/opt/train/venv/bin/python3"]
    assert (train.source, train.prefix, train.inspected) == ("venv", "/opt/train/venv", True)
    assert train.torch is not None and (train.torch.version, train.torch.cuda) == ("2.11.0+cu128", "12.8")
    infer = found["/opt/conda/envs/infer/bin/python3"]
    assert infer.source == "conda" and infer.torch is not None and infer.torch.cuda is None
    assert infer.inspected is True
    bare = found["/root/.venv/bin/python3"]
    assert bare.torch is None and bare.inspected is False      # no torch: not worth inspecting
    # The envs with torch were handed to the full inspection, tagged with how they were found (paths
    # below the fake root do not exist on this machine, so each comes back as not found).
    assert [(p.interpreter, p.discovered) for p in facts.pythons] == [
        ("/opt/train/venv/bin/python3", "venv"), ("/opt/conda/envs/infer/bin/python3", "conda")]


def test_pinned_pythons_turn_discovery_off(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "opt/train/venv/bin/python3", "#!/bin/sh\nexit 99\n")
    (fakeroot / "opt/train/venv/bin/python3").chmod(0o755)
    write(fakeroot, "opt/train/venv/lib/python3.11/site-packages/torch/version.py", TORCH_VERSION_PY)
    facts = probe_facts(build_probe_script(("python3",), discover=False), root=fakeroot,
                        path=str(fakebin.path), hermetic=True)
    assert facts.discovered_pythons == []
    assert [p.interpreter for p in facts.pythons] == ["python3"]


def test_a_discovered_env_a_named_interpreter_covers_is_not_inspected_twice(
    fakeroot: Path, fakebin: FakeBin,
) -> None:
    write(fakeroot, "opt/train/venv/bin/python3", "#!/bin/sh\nexit 99\n")
    (fakeroot / "opt/train/venv/bin/python3").chmod(0o755)
    write(fakeroot, "opt/train/venv/lib/python3.11/site-packages/torch/version.py", TORCH_VERSION_PY)
    facts = probe(fakeroot, fakebin, ("/opt/train/venv/bin/python3",))
    assert [p.interpreter for p in facts.pythons] == ["/opt/train/venv/bin/python3"]
    assert [d.inspected for d in facts.discovered_pythons] == [True]


def test_the_wheels_arch_list_is_read_without_importing_torch_where_a_gpu_is(
    fakeroot: Path, fakebin: FakeBin, site: Path, tmp_path: Path,
) -> None:
    fakebin.link("python3", sys.executable)
    (site / "torch/lib").mkdir()
    (site / "torch/lib/libtorch_python.so").write_bytes(
        b"\x7fELF\0sm_80\0junk\0cpp_abi\0\0sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\0/torch/csrc/cuda/\0")
    no_gpu = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path)).pythons[0]
    assert no_gpu.torch is not None and no_gpu.torch.arch_list is None     # no GPU: not worth the grep
    write(fakeroot, "dev/nvidia0", "")
    env = probe(fakeroot, fakebin, ("python3",), env=python_env(site, tmp_path)).pythons[0]
    assert env.torch is not None
    assert env.torch.arch_list == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert not (tmp_path / "torch-imported").exists()


REAL_TORCH_PYTHON = Path("/opt/fleetfix-torch-2.14.1/bin/python3")


@pytest.mark.skipif(not REAL_TORCH_PYTHON.exists(),
                    reason="the real torch venv (tests/lab/realtorch.py) is not built here")
def test_the_real_cu130_wheels_arch_list(fakeroot: Path, fakebin: FakeBin) -> None:
    write(fakeroot, "dev/nvidia0", "")
    env = probe(fakeroot, fakebin, (str(REAL_TORCH_PYTHON),)).pythons[0]
    assert env.torch is not None and env.torch.cuda == "13.0"
    assert env.torch.arch_list == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.mark.parametrize(("init", "abi"), [
    # torch >= 2.7 hard-codes it; older torch asks its compiled module, which the probe never imports.
    ('def compiled_with_cxx11_abi() -> builtins.bool:\n    r"""doc"""\n    return True\n', True),
    ("def compiled_with_cxx11_abi():\n    return False\n", False),
    ("def compiled_with_cxx11_abi():\n    return _C._GLIBCXX_USE_CXX11_ABI\n", None),
    ("x = 1\n", None),
])
def test_wheel_cache_key_facts_without_importing_torch(fakeroot: Path, fakebin: FakeBin, tmp_path: Path,
                                                       init: str, abi: bool | None) -> None:
    site = tmp_path / "site"
    write(site, "torch/__init__.py", "raise SystemExit('torch must not be imported')\n" + init)
    write(site, "torch/version.py", TORCH_VERSION_PY)
    fakebin.link("python3", sys.executable)
    facts = probe(fakeroot, fakebin, ("python3",), env={"PYTHONPATH": str(site)})
    env = facts.pythons[0]
    assert env.torch is not None and env.torch.cxx11_abi is abi
    assert env.python_tag == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert env.libc is not None and env.libc.startswith("glibc ")
    assert facts.torch is not None
    assert (facts.torch.cxx11_abi, facts.torch.python_tag) == (abi, env.python_tag)
    assert facts.torch.libc == env.libc


def test_versioned_gxx_beside_the_default(fakeroot: Path, fakebin: FakeBin) -> None:
    # Debian's g++-N packages install /usr/bin/g++-N: a host compiler nvcc accepts may already be there.
    for name in ("g++-12", "g++-14", "g++-wrapper", "gcc-13"):
        write(fakeroot, f"usr/bin/{name}", "#!/bin/sh\n", mode=0o755)
    write(fakeroot, "usr/bin/g++-9", "not executable\n")
    assert probe(fakeroot, fakebin).build.gxx_majors == [12, 14]


def test_a_rocm_torchs_hip_version_is_read(fakeroot: Path, fakebin: FakeBin, tmp_path: Path) -> None:
    site = tmp_path / "site"
    write(site, "torch/__init__.py", "raise SystemExit('torch must not be imported')\n")
    # A ROCm build's generated version.py: cuda None, hip set (values of a 2.3.0.dev20240308+rocm6.0 one).
    write(site, "torch/version.py", TORCH_VERSION_PY.replace("'2.11.0+cu128'", "'2.3.0.dev20240308+rocm6.0'")
          .replace("cuda: Optional[str] = '12.8'", "cuda: Optional[str] = None")
          .replace("hip: Optional[str] = None", "hip: Optional[str] = '6.0.32830-d62f6a171'"))
    fakebin.link("python3", sys.executable)
    facts = probe(fakeroot, fakebin, ("python3",), env={"PYTHONPATH": str(site)})
    torch = facts.pythons[0].torch
    assert torch is not None and (torch.cuda, torch.hip) == (None, "6.0.32830-d62f6a171")
    assert "TORCH_CPU_ONLY" not in [f.code for f in diagnose(facts)]


def test_the_keyring_list_is_the_installed_keyrings_own_from_dpkgs_file_list(fakeroot: Path, fakebin: FakeBin
                                                                              ) -> None:
    fakebin.script("dpkg-query", "printf 'install ok installed\\tcuda-keyring\\t1.1-1\\n'\n")
    write(fakeroot, "var/lib/dpkg/info/cuda-keyring.list", "/.\n/etc\n/etc/apt/sources.list.d\n"
          "/etc/apt/sources.list.d/cuda-debian12-x86_64.list\n/usr/share/keyrings/cuda-archive-keyring.gpg\n")
    assert probe(fakeroot, fakebin).apt.keyring_list == "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
    fakebin.script("dpkg-query", "printf 'deinstall ok config-files\\tcuda-keyring\\t1.1-1\\n'\n")
    assert probe(fakeroot, fakebin).apt.keyring_list is None  # only an installed keyring's
