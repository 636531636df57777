#!/usr/bin/python3
"""A stand-in for Proxmox VE's `pct`, for test-bed nodes (see tests/lab/container.py for the containers).

It follows pve-container's `src/PVE/CLI/pct.pm` (docs/DOMAIN.md 5.2) where fleetfix can observe it:

    pct exec ID [--keep-env 0|1] [--] CMD...   run CMD in the CT; stdin/stdout/stderr and the exit code pass
                                                through; caller env kept (+container=lxc), PATH forced to
                                                /sbin:/bin:/usr/sbin:/usr/bin, SSL_CERT_FILE/DIR removed
    pct list | status ID | start ID | stop ID | config ID
    pct snapshot ID NAME [--description D] | listsnapshot ID | rollback ID NAME [--start 0|1]
                                                (a rootfs/mpN volume on storage "local", a `dir` storage,
                                                makes snapshot die: "snapshot feature is not available")
    pct delsnapshot ID NAME [--force 0|1] | push ID SRC DST [--perms P] [--user U] [--group G]
    pct pull ID SRC DST [--perms P] [--user U] [--group G]
    pct template ID                             `template: 1` in the config; such a CT cannot start
    pct clone ID NEWID [--hostname H] [--full 0|1] [--storage S] [--description D]
                                                (a template's clone is linked unless --full 1; any other
                                                CT's is full: clone_vm in pve-container's API2/LXC.pm)
    pct destroy ID [--force 0|1] [--purge 0|1]  (a running CT only with --force 1)

Errors are PVE's one-line messages on stderr with exit status 255 (a Perl `die` in the CLI handler), except
inside push/pull's worker (a missing source, a destination that cannot be created): real pct prints those
on stderr and exits 0, and so does this stand-in.
Every invocation is appended to <node dir>/pct.log (one JSON argv per line) so tests can count calls.

`pct exec` and a lost SSH channel: real pct execs lxc-attach, and OpenSSH does not signal a non-PTY
session's processes when the channel closes, so a command that never writes keeps running. The test bed
must not leak processes, so without a terminal this stand-in forks: the child (its own process group) execs
`nsenter`, which forks the command inside the container (same process group); the parent only waits. It
relays SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to the group, and when the reader of its stdout or
stderr goes away (the channel closed) it sends the group SIGPIPE, then SIGKILL after a second. Its exit
status is the command's (a command killed by signal N kills the parent with N too), so exit codes and
signals stay honest. Processes that leave the group (setsid daemons) are only ended by stopping the CT.
With a terminal on stdin (ssh -t), or FLEETFIX_LAB_PCT_PLAIN_EXEC=1, it execs nsenter directly, like the
real pct.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import container as ctlib
import pct_exec
from pct_exec import EXIT_DIE, PctDie, bool_option, check_vmid, missing_config, parse_options

_SNAPNAME_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)  # pve-configid, max 40 chars


def _vmid(node: ctlib.NodeState, text: str | None, *, must_exist: bool = True) -> ctlib.Container:
    ct = node.container(check_vmid(text))
    if must_exist and not ct.exists():
        raise missing_config(str(node.dir), ct.ctid)
    return ct


# ----------------------------------------------------------------------------------------------------------
# list / status / start / stop / config
# ----------------------------------------------------------------------------------------------------------
def cmd_list(node: ctlib.NodeState, args: list[str]) -> int:
    parse_options(args, {})
    containers = node.containers()
    if not containers:
        return 0  # real pct prints nothing at all, not even the header
    row = "%-10s %-10s %-12s %-20s\n"
    out = row % ("VMID", "Status", "Lock", "Name")
    for ct in containers:
        config = ct.config().main
        out += row % (ct.ctid, ct.status, config.get("lock", ""), config.get("hostname", f"CT{ct.ctid}"))
    sys.stdout.write(out)
    return 0


def cmd_status(node: ctlib.NodeState, args: list[str]) -> int:
    options, positional = parse_options(args, {"verbose": False})
    ct = _vmid(node, positional[0] if positional else None)
    if options.get("verbose"):
        config = ct.config().main
        values = {
            "name": config.get("hostname", f"CT{ct.ctid}"),
            "status": ct.status,
            "vmid": str(ct.ctid),
            "type": "lxc",
            "pid": str(ct.pid1 or ""),
        }
        for key in sorted(values):
            if values[key]:
                print(f"{key}: {values[key]}")
    else:
        print(f"status: {ct.status}")
    return 0


def cmd_start(node: ctlib.NodeState, args: list[str]) -> int:
    _, positional = parse_options(args, {"skiplock": False, "debug": False})
    ct = _vmid(node, positional[0] if positional else None)
    if ct.running:
        raise PctDie(f"CT {ct.ctid} already running")
    if ct.config().main.get("template") == "1":
        # pve-container src/PVE/API2/LXC/Status.pm, vm_start
        raise PctDie("you can't start a CT if it's a template")
    ct.start()
    return 0


def cmd_stop(node: ctlib.NodeState, args: list[str]) -> int:
    _, positional = parse_options(args, {"skiplock": False, "overrule-shutdown": False})
    ct = _vmid(node, positional[0] if positional else None)
    if not ct.running:
        raise PctDie(f"CT {ct.ctid} not running")
    ct.stop()
    return 0


def cmd_config(node: ctlib.NodeState, args: list[str]) -> int:
    _, positional = parse_options(args, {"current": False, "snapshot": True})
    ct = _vmid(node, positional[0] if positional else None)
    config = ct.config().main
    for key in sorted(config):
        if key not in ("parent", "digest"):
            print(f"{key}: {config[key]}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# snapshots: a copy of the upper dir plus a "[name]" section in ID.conf, as PVE records them
# ----------------------------------------------------------------------------------------------------------
# The snapshot commands are the same in `qm` (PVE::AbstractConfig and PVE::GuestHelpers serve both): qm.py
# calls them with its own guest lookup (`find`) and its own rule for volumes that cannot snapshot.
Find = Callable[[ctlib.NodeState, "str | None"], ctlib.Container]
# How a guest's volumes are snapshotted (the stand-ins: a copy of the upper dir; a real QEMU VM: qcow2
# snapshots, qm.py). Take returns the keys it adds to the snapshot's config section.
Take = Callable[[ctlib.Container, str, dict[str, str]], dict[str, str]]
Restore = Callable[[ctlib.Container, str, dict[str, str]], None]
Resume = Callable[[ctlib.Container, str], None]
Drop = Callable[[ctlib.Container, str], None]


def _copy_upper(ct: ctlib.Container, name: str, options: dict[str, str]) -> dict[str, str]:
    ct.copy_upper_to(ct.snapshot_dir(name))
    return {}


def _restore_upper(ct: ctlib.Container, name: str, section: dict[str, str]) -> None:
    ct.restore_upper_from(ct.snapshot_dir(name))


def _drop_upper(ct: ctlib.Container, name: str) -> None:
    shutil.rmtree(ct.snapshot_dir(name).parent, ignore_errors=True)


def _snapshot_args(
    node: ctlib.NodeState, args: list[str], allowed: dict[str, bool], find: Find | None = None
) -> tuple[ctlib.Container, str, dict[str, str]]:
    options, positional = parse_options(args, allowed)
    ct = (find or _vmid)(node, positional[0] if positional else None)
    if len(positional) < 2:
        raise PctDie("400 not enough arguments")
    name = positional[1]
    if len(name) > 40 or not _SNAPNAME_RE.match(name):
        raise PctDie(f"400 Parameter verification failed.\nsnapname: invalid configuration ID '{name}'")
    return ct, name, options


# Storage IDs of a stock PVE install whose type cannot snapshot a CT volume ("local" is a `dir` storage:
# raw images, no snapshots). Any other storage (local-lvm = lvmthin, local-zfs = zfspool, ...) can.
_NO_SNAPSHOT_STORAGES = frozenset({"local"})


def _volumes_without_snapshots(config: dict[str, str]) -> list[str]:
    """Config keys (rootfs, mpN) whose volume's storage has no snapshot feature. Bind mounts (`/host/path`)
    are not volumes and are skipped here (whether real PVE skips them is unverified, DOMAIN.md 5.2)."""
    keys = []
    for key, value in config.items():
        if key == "rootfs" or re.fullmatch(r"mp\d+", key):
            volume = value.split(",", 1)[0]
            storage = volume.split(":", 1)[0] if ":" in volume else None
            if storage in _NO_SNAPSHOT_STORAGES:
                keys.append(key)
    return keys


def cmd_snapshot(
    node: ctlib.NodeState, args: list[str], find: Find | None = None,
    no_snapshots: Callable[[dict[str, str]], list[str]] = _volumes_without_snapshots,
    allowed: dict[str, bool] | None = None, take: Take = _copy_upper,
) -> int:
    ct, name, options = _snapshot_args(node, args, allowed or {"description": True}, find)
    config = ct.config()
    if name == "current":
        raise PctDie("unable to use snapshot name 'current' (reserved name)")
    if name in config.snapshots:
        raise PctDie(f"snapshot name '{name}' already used")
    if no_snapshots(config.main):
        # PVE::LXC::Config->snapshot_prepare: has_feature('snapshot') over every volume.
        raise PctDie("snapshot feature is not available")
    added = take(ct, name, options)
    section = {key: value for key, value in config.main.items() if key != "lock"}
    section.update(added)
    if "description" in options:
        section["description"] = options["description"]
    section["snaptime"] = str(int(time.time()))
    config.snapshots[name] = section
    config.main["parent"] = name
    ct.save_config(config)
    return 0


def cmd_listsnapshot(node: ctlib.NodeState, args: list[str], find: Find | None = None) -> int:
    _, positional = parse_options(args, {})
    ct = (find or _vmid)(node, positional[0] if positional else None)
    config = ct.config()
    entries: dict[str, dict[str, str]] = {name: dict(values) for name, values in config.snapshots.items()}
    current = {"description": "You are here!"}
    if "parent" in config.main:
        current["parent"] = config.main["parent"]
    entries["current"] = current
    # PVE::GuestHelpers::print_snapshot_tree
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for name, values in entries.items():
        parent = values.get("parent")
        if parent and parent in entries:
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)

    def by_time(name: str) -> tuple[int, int]:
        snaptime = entries[name].get("snaptime")
        return (1, 0) if snaptime is None else (0, int(snaptime))

    out: list[str] = []

    def show(prefix: str, name: str) -> None:
        values = entries[name]
        description = (values.get("description") or "no-description").splitlines()[-1:] or [""]
        snaptime = values.get("snaptime")
        timestring = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(snaptime))) if snaptime else ""
        width = max(30 - len(prefix), 0)
        out.append(f"{prefix} {name:<{width}} {timestring:<23} {description[0]}\n")
        for child in sorted(children.get(name, []), key=by_time):
            show(" " + prefix, child)

    for root in sorted(roots, key=by_time):
        show("`->", root)
    sys.stdout.write("".join(out))
    return 0


def cmd_rollback(
    node: ctlib.NodeState, args: list[str], find: Find | None = None, restore: Restore = _restore_upper,
    resume: Resume | None = None,
) -> int:
    ct, name, options = _snapshot_args(node, args, {"start": True}, find)
    config = ct.config()
    if name not in config.snapshots:
        raise PctDie(f"snapshot '{name}' does not exist")
    if ct.running:
        ct.stop()  # PVE: __snapshot_rollback_vm_stop -> vm_stop($vmid, 1)
    section = config.snapshots[name]
    restore(ct, name, section)
    restored = {
        key: value for key, value in section.items() if key not in ("snaptime", "description", "vmstate")
    }
    restored["parent"] = name
    config.main = restored
    ct.save_config(config)
    if "vmstate" in section and resume is not None:
        resume(ct, name)  # PVE: a snapshot with RAM state is started from it, whatever --start says
    if bool_option(options.get("start"), default=False) and not ct.running:
        ct.start()
    return 0


def cmd_delsnapshot(
    node: ctlib.NodeState, args: list[str], find: Find | None = None, drop: Drop = _drop_upper,
) -> int:
    ct, name, _ = _snapshot_args(node, args, {"force": True}, find)
    config = ct.config()
    if name not in config.snapshots:
        raise PctDie(f"snapshot '{name}' does not exist")
    removed = config.snapshots.pop(name)
    for section in (config.main, *config.snapshots.values()):
        if section.get("parent") == name:
            if "parent" in removed:
                section["parent"] = removed["parent"]
            else:
                section.pop("parent")
    drop(ct, name)
    ct.save_config(config)
    return 0


# ----------------------------------------------------------------------------------------------------------
# push / pull: run inside the CT's namespaces, so paths (and symlinks) resolve as the CT sees them
# ----------------------------------------------------------------------------------------------------------
_FILE_OPTIONS = {"perms": True, "user": True, "group": True}


def _ownership_script(options: dict[str, str]) -> str:
    script = ""
    if "perms" in options:
        perms = options["perms"]
        if not re.fullmatch(r"(0x[0-9a-fA-F]+|[0-7]+)", perms):
            raise PctDie(f"invalid mode: '{perms}'")
        mode = int(perms, 16) if perms.startswith("0x") else int(perms, 8)
        script += f' && chmod {mode:o} "$1"'
    if "user" in options or "group" in options:
        owner = options.get("user", "")
        group = options.get("group", "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]*", owner + group):
            raise PctDie("invalid user or group")
        script += f' && chown {owner}{":" + group if group else ""} "$1"'
    return script


def _worker_failed(message: str) -> int:
    """How real pct reports a failure inside its push/pull worker: the message on stderr, exit status 0.
    (pve-common: fork_worker prints the task's error to STDERR, the handler's return value is only the
    task id, and CLIHandler::run_cli_handler exits 0.)"""
    sys.stdout.flush()
    sys.stderr.write(message + "\n")
    return 0


def cmd_push(node: ctlib.NodeState, args: list[str]) -> int:
    options, positional = parse_options(args, _FILE_OPTIONS)
    ct = _vmid(node, positional[0] if positional else None)
    if len(positional) != 3:
        raise PctDie("400 not enough arguments")
    source, destination = positional[1], positional[2]
    if not ct.running:
        raise PctDie("can only push files to a running CT")
    fixups = _ownership_script(options)
    # Streamed to the CT, like File::Copy: no whole-file read. Like create_file(): O_TRUNC in place (not
    # atomic), then chmod/chown on the open file.
    script = 'umask 022 && cat > "$1"' + fixups
    try:
        with open(source, "rb") as handle:
            result = subprocess.run(
                ct.nsenter_argv(["/bin/sh", "-c", script, "push", destination]),
                stdin=handle,
                stderr=subprocess.PIPE,
                env={"PATH": ctlib.PVE_CLI_PATH},
            )
    except OSError:
        return _worker_failed(f"failed to open {source} for reading")
    if result.returncode != 0:
        return _worker_failed(
            f"failed to create file: {destination}: {result.stderr.decode(errors='replace').strip()}"
        )
    return 0


def cmd_pull(node: ctlib.NodeState, args: list[str]) -> int:
    options, positional = parse_options(args, _FILE_OPTIONS)
    ct = _vmid(node, positional[0] if positional else None)
    if len(positional) != 3:
        raise PctDie("400 not enough arguments")
    source, destination = positional[1], positional[2]
    if not ct.running:
        raise PctDie("can only pull files from a running VM")
    fixups = _ownership_script(options)
    # Like the real worker: the destination is created (and its perms set) before the source is opened,
    # so a missing source leaves an empty destination behind.
    try:
        with open(destination, "wb"):
            pass
        if fixups:
            subprocess.run(["/bin/sh", "-c", "true" + fixups, "pull", destination], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        return _worker_failed(f"failed to create file: {destination}: {error}")
    with open(destination, "wb") as sink:
        result = subprocess.run(
            ct.nsenter_argv(["/bin/cat", "--", source]), stdout=sink, stderr=subprocess.PIPE,
            env={"PATH": ctlib.PVE_CLI_PATH},
        )
    if result.returncode != 0:
        reason = result.stderr.decode(errors="replace").strip().rpartition(": ")[2] or "failed"
        return _worker_failed(f"failed to open {source}: {reason}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# template / clone / destroy (pve-container src/PVE/API2/LXC.pm: template, clone_vm, destroy_vm; the CLI
# maps `pct clone` to clone_vm with [vmid, newid] and `pct destroy` to destroy_vm, src/PVE/CLI/pct.pm)
# ----------------------------------------------------------------------------------------------------------
def cmd_template(node: ctlib.NodeState, args: list[str]) -> int:
    _, positional = parse_options(args, {})
    ct = _vmid(node, positional[0] if positional else None)
    config = ct.config()
    if config.snapshots:
        raise PctDie("unable to create template, because CT contains snapshots")
    if config.main.get("template") == "1":
        raise PctDie("you can't convert a template to a template")
    if ct.running:
        raise PctDie("you can't convert a CT to template if the CT is running")
    config.main["template"] = "1"
    ct.save_config(config)
    return 0


def cmd_clone(node: ctlib.NodeState, args: list[str]) -> int:
    options, positional = parse_options(
        args, {"hostname": True, "full": True, "storage": True, "description": True, "pool": True,
               "snapname": True, "target": True, "bwlimit": True})
    source = _vmid(node, positional[0] if positional else None)
    if len(positional) < 2:
        raise PctDie("400 not enough arguments")
    newid = check_vmid(positional[1])
    is_template = source.config().main.get("template") == "1"
    # clone_vm: `full` defaults to "not a template"; --storage only for a full clone; a running CT only
    # from a snapshot (not imitated: the stand-in refuses every clone of a running CT that way).
    full = bool_option(options.get("full"), default=not is_template)
    if "storage" in options and not full:
        raise PctDie("parameter 'storage' not allowed for linked clones")
    if full and source.running:
        raise PctDie("Full clone of a running container is only possible from a snapshot")
    clone = node.clone_container(source, newid, hostname=options.get("hostname"))
    if "storage" in options:
        config = clone.config()
        volume, comma, rest = config.main["rootfs"].partition(",")
        config.main["rootfs"] = f"{options['storage']}:{volume.split(':', 1)[1]}{comma}{rest}"
        clone.save_config(config)
    if "description" in options:
        config = clone.config()
        config.main["description"] = options["description"]
        clone.save_config(config)
    return 0


def cmd_destroy(node: ctlib.NodeState, args: list[str]) -> int:
    options, positional = parse_options(args, {"force": True, "purge": True,
                                               "destroy-unreferenced-disks": True})
    ct = _vmid(node, positional[0] if positional else None)
    if ct.running and not bool_option(options.get("force"), default=False):
        raise PctDie(f"unable to destroy CT {ct.ctid} - container is running")
    ct.destroy()
    return 0


COMMANDS = {
    "exec": lambda node, args: pct_exec.cmd_exec(str(node.dir), args),
    "list": cmd_list,
    "status": cmd_status,
    "start": cmd_start,
    "stop": cmd_stop,
    "config": cmd_config,
    "snapshot": cmd_snapshot,
    "listsnapshot": cmd_listsnapshot,
    "rollback": cmd_rollback,
    "delsnapshot": cmd_delsnapshot,
    "push": cmd_push,
    "pull": cmd_pull,
    "template": cmd_template,
    "clone": cmd_clone,
    "destroy": cmd_destroy,
}


def main(argv: list[str]) -> int:
    try:
        node = ctlib.NodeState.from_env()
        pct_exec.log_invocation(str(node.dir), argv)
        if not argv or argv[0] not in COMMANDS:
            raise PctDie(f"unknown command 'pct {argv[0] if argv else ''}'".rstrip())
        return COMMANDS[argv[0]](node, argv[1:])
    except (PctDie, ctlib.ContainerError) as error:
        sys.stdout.flush()
        sys.stderr.write(f"{error}\n")
        return EXIT_DIE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
