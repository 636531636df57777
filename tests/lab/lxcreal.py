"""Real LXC containers for the test bed: started by `lxc-start`, entered by `lxc-attach`, as on a PVE node.

A container made with ``create_container(..., real_lxc=True)`` (tests/lab/container.py) keeps everything
the namespace stand-in has (its PVE config ``lxc/ID.conf``, the overlay's ``upper/`` dir, snapshots as
copies of it), but it is run by LXC itself: ``<node dir>/lxc-real/ID/config`` is an LXC config whose
rootfs is LXC's own overlay backend over the same lower and upper dirs (``overlay:LOWER:UPPER``; LXC puts
the overlay's workdir beside the upper dir), and the node's ``pct exec`` runs real ``lxc-attach``.

What the config takes from a PVE node and what it leaves out (PVE writes ``/var/lib/lxc/ID/config`` from
``/etc/pve/lxc/ID.conf`` and includes the distribution's ``/usr/share/lxc/config/*.common.conf``):

- ``lxc.include = /usr/share/lxc/config/common.conf``: LXC's common settings, as PVE's debian.common.conf
  includes them: the devices cgroup allow-list, dropped capabilities, the seccomp profile,
  ``lxc.mount.auto = cgroup:mixed proc:mixed sys:mixed``, ptys. So /proc, /sys and /dev are LXC's, not
  the stand-in's.
- ``lxc.net.0.type = none``: the container shares this machine's network namespace. A PVE container has a
  veth on a bridge; here the only network a test may use is loopback (the bed's apt repository on
  127.0.0.1), which a container with its own namespace could not reach.
- ``lxc.apparmor.profile = unconfined``: this machine has no AppArmor.
- ``lxc.init.cmd``: a small sh init (written into the upper dir as ``/usr/sbin/fleetfix-lab-init``: LXC
  splits ``lxc.init.cmd`` on spaces, so an inline script cannot be given) that idles and reaps, where a PVE
  container boots its distribution's init (systemd). Nothing in a test needs services.

The lxcpath is per node (``-P <node dir>/lxc-real``): LXC names a container's command socket after its
lxcpath and name, and two test-bed nodes may both have a CT 200, which on one machine would collide under
the default ``/var/lib/lxc``. That ``-P`` is the only word the bed's ``pct exec`` adds to real pct's
``lxc-attach -n ID --keep-env|--clear-env -- CMD`` (pve-container src/PVE/CLI/pct.pm, `exec`, read at
94f5585).

Standard library only, and nothing but `os` at import time: the `pct` stand-in imports this on every call.
"""

from __future__ import annotations

import os

LXC_REAL_SUBDIR = "lxc-real"
LXC_START = "/usr/bin/lxc-start"
LXC_STOP = "/usr/bin/lxc-stop"
LXC_WAIT = "/usr/bin/lxc-wait"
LXC_INFO = "/usr/bin/lxc-info"
LXC_ATTACH = "/usr/bin/lxc-attach"
LXC_COMMON_CONFIG = "/usr/share/lxc/config/common.conf"
INIT_PATH = "usr/sbin/fleetfix-lab-init"  # relative to the container's root
# PID 1: idle and reap whatever is reparented to it (dash's `wait` reaps any child); exit on SIGTERM.
INIT_SCRIPT = '#!/bin/sh\ntrap "exit 0" TERM\nwhile :; do sleep 2147483647 & wait; done\n'


class LxcError(RuntimeError):
    """An LXC tool failed (the message names the container and carries the tool's own words)."""


def lxcpath(node_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(node_dir), LXC_REAL_SUBDIR)


def config_path(node_dir: str | os.PathLike[str], ctid: int) -> str:
    return os.path.join(lxcpath(node_dir), str(ctid), "config")


def is_real(node_dir: str | os.PathLike[str], ctid: int) -> bool:
    """Whether this node's CT ctid is run by LXC (else it is a namespace stand-in)."""
    return os.path.isfile(config_path(node_dir, ctid))


def unavailable_reason() -> str | None:
    """Why real LXC containers cannot run here, or None when they can."""
    missing = [tool for tool in (LXC_START, LXC_ATTACH, LXC_STOP, LXC_INFO) if not os.access(tool, os.X_OK)]
    if missing or not os.path.isfile(LXC_COMMON_CONFIG):
        return "real LXC containers need the lxc package (apt-get install lxc)"
    if os.geteuid() != 0:
        return "real LXC containers need root"
    return None


def render_config(ctid: int, hostname: str, lower: str, upper: str) -> str:
    """lower: one directory, or several joined with ':' (top first), as overlayfs's lowerdir takes them;
    LXC's overlay backend takes everything up to the last ':' as the lower part."""
    return (
        f"lxc.include = {LXC_COMMON_CONFIG}\n"
        "lxc.apparmor.profile = unconfined\n"
        f"lxc.uts.name = {hostname}\n"
        f"lxc.rootfs.path = overlay:{lower}:{upper}\n"
        f"lxc.init.cmd = /{INIT_PATH}\n"
        "lxc.net.0.type = none\n"
        "lxc.autodev = 1\n"
        f"lxc.log.file = {os.path.join(os.path.dirname(upper), 'lxc.log')}\n"
        "lxc.log.level = WARN\n"
    )


def write_config(node_dir: str | os.PathLike[str], ctid: int, config_text: str) -> None:
    path = config_path(node_dir, ctid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(config_text)


def install_init(upper: str) -> None:
    """Write the init into the upper dir (the lower dir is this machine's / or a template: never written)."""
    path = os.path.join(upper, INIT_PATH)
    parent = os.path.dirname(path)
    for directory in (os.path.dirname(parent), parent):
        if not os.path.isdir(directory):
            os.mkdir(directory, 0o755)
    with open(path, "w") as handle:
        handle.write(INIT_SCRIPT)
    os.chmod(path, 0o755)


def _run(argv: list[str], timeout: float) -> str:
    import subprocess  # only on start/stop: `pct exec` never needs it

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise LxcError(f"{argv[0]} timed out after {timeout:g}s") from error
    if done.returncode != 0:
        raise LxcError(f"{os.path.basename(argv[0])} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def start(node_dir: str | os.PathLike[str], ctid: int, timeout: float = 20.0) -> int:
    """lxc-start (daemonised), wait until RUNNING; returns the init's PID as this machine sees it."""
    common = ["-P", lxcpath(node_dir), "-n", str(ctid)]
    _run([LXC_START, *common], timeout)
    _run([LXC_WAIT, *common, "-s", "RUNNING", "-t", str(int(timeout))], timeout + 5)
    text = _run([LXC_INFO, *common, "-p", "-H"], timeout).strip()
    if not text.isdigit():
        raise LxcError(f"CT {ctid}: lxc-info gave no init PID ({text!r})")
    return int(text)


def stop(node_dir: str | os.PathLike[str], ctid: int, timeout: float = 20.0) -> None:
    """Hard stop, as `pct stop` does (lxc-stop --kill), then wait for LXC's monitor to tear it down."""
    common = ["-P", lxcpath(node_dir), "-n", str(ctid)]
    state = _run([LXC_INFO, *common, "-s", "-H"], timeout).strip()
    if state != "STOPPED":
        _run([LXC_STOP, *common, "--kill"], timeout)
    _run([LXC_WAIT, *common, "-s", "STOPPED", "-t", str(int(timeout))], timeout + 5)


def attach_argv(node_dir: str, ctid: int, keep_env: bool, command: list[str]) -> list[str]:
    """What real pct execs (pct.pm `exec`), plus the bed's lxcpath."""
    return [
        LXC_ATTACH, "-P", lxcpath(node_dir), "-n", str(ctid),
        "--keep-env" if keep_env else "--clear-env", "--", *command,
    ]
