"""Fix texts fit the target's kind: a container is fixed with `pct` and its config on the node, a VM with `qm`
(PCI passthrough, its own driver, its disk grown inside too), a machine of its own with no Proxmox command."""

from __future__ import annotations

import pytest
from probe_testkit import edited, facts_of, load_fixture
from test_probe_rules import CASES, only, set_in

from fleetfix.probe import Finding, diagnose
from fleetfix.target import NODE, GuestRef

CT, VM = GuestRef.lxc(200), GuestRef.vm(300)
KINDS = {"lxc": CT, "vm": VM, "node": NODE}
# What a fix for each kind must never name: another kind's commands and config.
FOREIGN = {
    "lxc": ("qm ", "hostpci", "growpart"),
    "vm": ("pct ", "lxc.", "/etc/pve/lxc", "devN", "container"),
    "node": ("pct ", "qm ", "lxc.", "/etc/pve", "hostpci", "container", "the VM"),
}


def fired(code: str, guest: GuestRef) -> Finding:
    case = CASES[code]
    return only(diagnose(edited(case.fixture, case.edit), case.node, guest=guest), code)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("code", list(CASES))
def test_no_fix_names_another_kinds_commands(code: str, kind: str) -> None:
    finding = fired(code, KINDS[kind])
    for text in (finding.fix.hint, finding.summary):
        assert not [word for word in FOREIGN[kind] if word in text], text


def test_a_target_of_unknown_kind_is_a_machine_of_its_own() -> None:
    case = CASES["DISK_LOW"]
    assert only(diagnose(edited(case.fixture, case.edit)), "DISK_LOW") == fired("DISK_LOW", NODE)


def test_disk_low() -> None:
    assert fired("DISK_LOW", CT).fix.hint.endswith("grow the container's rootfs (pct resize 200 rootfs +10G)")
    vm = fired("DISK_LOW", VM).fix.hint
    assert "on the node, qm resize 300 <disk> +10G" in vm and "qm config 300" in vm
    # qm grows the volume only: the partition and the file system are grown inside the VM.
    assert "in the VM grow the partition and file system that hold /" in vm
    assert "growpart /dev/<device> <partition number>" in vm
    assert "resize2fs /dev/<partition> for ext4" in vm and "xfs_growfs <mount point> for XFS" in vm
    assert fired("DISK_LOW", NODE).fix.hint.endswith("or grow the file system holding /")


def test_gpu_not_visible() -> None:
    ct = fired("GPU_NOT_VISIBLE", CT).fix.hint
    assert "/etc/pve/lxc/200.conf" in ct and "lxc.mount.entry" in ct
    assert "pct set 200 --dev0 /dev/nvidia0" in ct
    vm = fired("GPU_NOT_VISIBLE", VM).fix.hint
    assert "qm set 300 --machine q35" in vm and "IOMMU" in vm
    assert "qm set 300 --hostpci0 <the GPU's PCI address on the node, from lspci>,pcie=1" in vm
    assert "qm reboot 300" in vm and "NVIDIA's driver installed in the VM" in vm
    assert "NVIDIA's driver is not loaded here" in fired("GPU_NOT_VISIBLE", NODE).fix.hint


def test_partial_devices_are_a_passthrough_line_for_a_container_and_the_drivers_own_elsewhere() -> None:
    ct = fired("GPU_PASSTHROUGH_PARTIAL", CT).fix.hint
    assert "/etc/pve/lxc/200.conf" in ct and "pct reboot 200" in ct and "<id>" not in ct
    for guest, where in ((VM, "in the VM"), (NODE, "on this machine")):
        hint = fired("GPU_PASSTHROUGH_PARTIAL", guest).fix.hint
        assert hint.startswith(where) and "nvidia-modprobe -u -c 0" in hint


def test_cuda_unavailable_with_devices() -> None:
    assert "pct reboot 200" in fired("CUDA_UNAVAILABLE_WITH_DEVICES", CT).fix.hint
    assert fired("CUDA_UNAVAILABLE_WITH_DEVICES", VM).fix.hint.startswith("in the VM, the driver cannot use")


def test_the_driver_to_upgrade_is_the_nodes_for_a_container_and_the_vms_own_for_a_vm() -> None:
    ct, vm, node = (fired("DRIVER_TOO_OLD", guest) for guest in (CT, VM, NODE))
    assert ct.fix.hint.startswith("upgrade the host (node) driver to >= 570.26")
    assert ct.fix.hint.endswith("the container cannot fix this") and ct.summary.startswith("host driver")
    assert vm.fix.hint.startswith("upgrade the NVIDIA driver inside VM 300 to >= 570.26")
    assert vm.summary.startswith("the VM's driver 515.105.01")
    assert node.fix.hint.startswith("upgrade this machine's NVIDIA driver to >= 570.26")
    below = fired("DRIVER_BELOW_FULL_FEATURE", VM).fix.hint
    assert below.endswith("or upgrade the NVIDIA driver inside VM 300 to >= 570.26 (the VM runs its own "
                          "driver on its passed-through GPU; the node's does not matter)")


def test_driver_libs_mismatch_in_a_vm_is_its_own_driver() -> None:
    # A VM gets no node facts: the NVML message decides, and the fix is the VM's own driver.
    edit = set_in("gpu.smi_error", "Failed to initialize NVML: Driver/library version mismatch")
    vm = only(diagnose(edited("healthy", edit), None, guest=VM), "DRIVER_LIBS_MISMATCH")
    assert vm.summary.startswith("the VM's NVIDIA driver libraries 570.124.06 do not match its loaded kernel")
    assert "reboot the VM (qm reboot 300)" in vm.fix.hint
    ct = fired("DRIVER_LIBS_MISMATCH", CT).fix.hint
    assert ct.startswith("install exactly 570.133.07 userspace libraries")


def test_build_memory() -> None:
    assert "pct set 200 --memory N, in MiB" in fired("BUILD_MEMORY_LOW", CT).fix.hint
    vm = fired("BUILD_MEMORY_LOW", VM).fix.hint
    assert "qm set 300 --memory N, in MiB" in vm and "qm reboot 300" in vm
    assert fired("BUILD_MEMORY_LOW", NODE).fix.hint.startswith("give this machine more memory")


def test_open_module_on_the_node_itself() -> None:
    assert fired("DRIVER_PROPRIETARY_MODULE", CT).fix.hint.startswith("on the node, install")
    assert fired("DRIVER_PROPRIETARY_MODULE", NODE).fix.hint.startswith("on this machine, install")


def test_kinds_change_no_code_severity_or_playbook() -> None:
    facts = facts_of(load_fixture("problem_case"))
    plain = diagnose(facts)
    for guest in (CT, VM):
        again = diagnose(facts, guest=guest)
        assert [(f.code, f.severity, f.fix.playbook, f.fix.vars) for f in again] == [
            (f.code, f.severity, f.fix.playbook, f.fix.vars) for f in plain]
