"""Fix texts that depend on what the target is: a container (its devices, memory and disk are set in its
config on the node, with `pct`), a VM (its own kernel and NVIDIA driver on a passed-through GPU; memory and
disk with `qm`, the file system grown inside it) or a machine of its own (a node, a plain SSH host,
`--local`: no Proxmox command at all).

Every Proxmox command form here is from pve-docs (docs/findings.md, "Fixes by guest kind", has each with
its source): `qm set VMID -hostpci0 ...,pcie=1` needs the q35 machine type, `qm disk resize` (alias
`qm resize`) grows only the volume, a changed `agent:` or `hostpciN:` takes effect at the VM's next fresh
start (`qm reboot` shuts it down and starts it again). The target's own id is in every command; what
fleetfix cannot know from inside the guest (the VM's disk key, the GPU's PCI address on the node) is a
placeholder in angle brackets.
"""

from __future__ import annotations

from fleetfix.target import GuestRef

CONTAINER = "lxc"
VM = "vm"


def _id(guest: GuestRef) -> str:
    return str(guest.id) if guest.id is not None else "<id>"


def _where(guest: GuestRef) -> str:
    """Where a VM's or this machine's own fix is done: inside it (a container's are done on its node)."""
    return "in the VM" if guest.kind == VM else "on this machine"


def driver_owner(guest: GuestRef) -> str:
    """Whose NVIDIA driver serves the target's GPU, for a summary: a container's is its node's."""
    return "the VM's driver" if guest.kind == VM else "host driver"


def libraries_owner(guest: GuestRef) -> str:
    return {CONTAINER: "container", VM: "the VM's"}.get(guest.kind, "this machine's")


def module_owner(guest: GuestRef) -> str:
    return "the host kernel module" if guest.kind == CONTAINER else "its loaded kernel module"


def driver_upgrade(guest: GuestRef, version: str) -> str:
    """Where a newer driver goes: the node for a container, the VM itself for a VM (it drives its own,
    passed-through GPU), this machine otherwise."""
    if guest.kind == CONTAINER:
        return f"upgrade the host (node) driver to >= {version}"
    if guest.kind == VM:
        return (f"upgrade the NVIDIA driver inside VM {_id(guest)} to >= {version} (the VM runs its own "
                "driver on its passed-through GPU; the node's does not matter)")
    return f"upgrade this machine's NVIDIA driver to >= {version}"


def driver_too_old_hint(guest: GuestRef, version: str) -> str:
    upgrade = f"{driver_upgrade(guest, version)}, or use a torch build for an older CUDA"
    return f"{upgrade}; the container cannot fix this" if guest.kind == CONTAINER else upgrade


def driver_libs_hint(guest: GuestRef, want: str) -> str:
    if guest.kind == CONTAINER:
        return (f"install exactly {want} userspace libraries in the container "
                f"(NVIDIA-Linux-<arch>-{want}.run --no-kernel-module) or bind-mount the host's; never "
                "install a driver package from the CUDA repo inside a container")
    # A VM or a machine of its own loads its own kernel module: libraries and module come from one driver
    # install there, and an upgraded driver's module is loaded only at the next boot.
    reboot = f"reboot the VM (qm reboot {_id(guest)})" if guest.kind == VM else "reboot this machine"
    where = _where(guest)
    return (f"{where}, the loaded kernel module and the userspace libraries must be one driver version: "
            f"after a driver upgrade, {reboot} to load the new module; otherwise reinstall one driver "
            "version (module and libraries together)")


def open_module_hint(guest: GuestRef) -> str:
    """DRIVER_PROPRIETARY_MODULE is judged from the node's module: for a container or the node itself."""
    if guest.kind == CONTAINER:
        return ("on the node, install the same driver version's open flavor (from NVIDIA's repo: "
                "nvidia-open; the .run file: --kernel-module-type=open) and reboot; the container needs no "
                "change")
    where = _where(guest)
    return (f"{where}, install the same driver version's open flavor (from NVIDIA's repo: nvidia-open; "
            "the .run file: --kernel-module-type=open) and reboot")


def gpu_not_visible_hint(guest: GuestRef) -> str:
    ident = _id(guest)
    if guest.kind == CONTAINER:
        return (f"if this target should use a GPU, pass /dev/nvidia* through to container {ident} in "
                f"/etc/pve/lxc/{ident}.conf on the node (lxc.mount.entry lines with "
                "lxc.cgroup2.devices.allow "
                f"for their majors, or devN: pct set {ident} --dev0 /dev/nvidia0 ...); building extensions "
                "does not need a GPU")
    if guest.kind == VM:
        return (f"if this target should use a GPU, pass one through to VM {ident} (PCI(e) passthrough): on "
                "the node, IOMMU on (AMD: by default; Intel: by default from kernel 6.8, else intel_iommu=on "
                "on the kernel command line) and the GPU in its own IOMMU group; then "
                f"qm set {ident} --machine q35, qm set {ident} --hostpci0 <the GPU's PCI address on the "
                f"node, from lspci>,pcie=1, a fresh start (qm reboot {ident}) and NVIDIA's driver installed "
                "in the VM; building extensions does not need a GPU")
    return ("if this machine should use a GPU: no /dev/nvidia* means NVIDIA's driver is not loaded here; "
            "install it (and reboot); building extensions does not need a GPU")


def passthrough_partial_hint(guest: GuestRef) -> str:
    ident = _id(guest)
    if guest.kind == CONTAINER:
        return (f"add the missing devices to /etc/pve/lxc/{ident}.conf on the node (lxc.mount.entry ... "
                "create=file, or devN:) and allow nvidia-uvm's major, which is dynamic (ls -l "
                f"/dev/nvidia-uvm on the node); then restart the container (pct reboot {ident})")
    # In a VM or on a machine of its own the device nodes are the local driver's, not a passthrough's.
    where = _where(guest)
    return (f"{where}, the driver itself creates these device nodes: as root, nvidia-modprobe -c 0 loads "
            "the nvidia module and creates /dev/nvidia0 and /dev/nvidiactl, nvidia-modprobe -u -c 0 loads "
            "nvidia-uvm and creates /dev/nvidia-uvm; if that fails, see dmesg for why the module does not "
            "load")


def cuda_unavailable_hint(guest: GuestRef) -> str:
    if guest.kind == CONTAINER:
        return ("on the node, compare `ls -l /dev/nvidia*` (majors: 195 for nvidia*, nvidia-uvm's is "
                "dynamic) with the container's lxc.cgroup2.devices.allow lines: each major must be allowed "
                f"(c MAJOR:* rwm); then restart the container (pct reboot {_id(guest)})")
    where = _where(guest)
    return (f"{where}, the driver cannot use the GPU although its device nodes exist: see nvidia-smi's error "
            "and the kernel log (dmesg | grep -i nvrm)")


def memory_hint(guest: GuestRef) -> str:
    ident = _id(guest)
    if guest.kind == CONTAINER:
        return (f"give the container more memory for the build (pct set {ident} --memory N, in MiB) or build "
                "elsewhere and install the wheel")
    if guest.kind == VM:
        return (f"give the VM more memory for the build (qm set {ident} --memory N, in MiB; it takes effect "
                f"at the VM's next fresh start, qm reboot {ident}, unless memory hotplug is on) or build "
                "elsewhere and install the wheel")
    return "give this machine more memory (or swap) for the build, or build elsewhere and install the wheel"


def disk_hint(guest: GuestRef, path: str) -> str:
    ident = _id(guest)
    free = "free space first (`apt-get clean`, old kernels, pip caches)"
    if guest.kind == CONTAINER:
        return f"{free} or grow the container's rootfs (pct resize {ident} rootfs +10G)"
    if guest.kind == VM:
        # qm grows the volume only: the partition and the file system inside are the guest's to grow.
        return (f"{free} or grow the VM's disk: on the node, qm resize {ident} <disk> +10G (<disk>: the one "
                f"holding {path}, e.g. scsi0 or virtio0, as qm config {ident} lists it); then in the VM grow "
                f"the partition and file system that hold {path} (findmnt -T {path} names them): growpart "
                "/dev/<device> <partition number> (cloud-guest-utils), then resize2fs /dev/<partition> for "
                "ext4 or xfs_growfs <mount point> for XFS")
    return f"{free} or grow the file system holding {path}"
