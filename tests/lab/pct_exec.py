#!/usr/bin/python3
"""`pct exec` of the test bed's `pct` stand-in (tests/lab/pct.py has the rest and the whole story).

It is split out because it is the command every probe, `fleetfix exec` and play task pays for, once per
container: the node's `pct` wrapper runs this file directly for `exec`, so a call imports only what exec
needs (no pathlib, subprocess, shutil or the container module: ~60 -> ~30 ms of CPU per call, measured).
On one machine that is the test bed's CPU, shared with the controller under test (docs/performance.md).
The CT's state is read from the files tests/lab/container.py writes: lxc/ID.conf, ct/ID/run.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import stat
import sys
import time

if __package__:  # imported by the test suite
    from tests.lab import lxcreal
else:  # run by the node's `pct` wrapper (python3 -I: the script's own dir is not on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lxcreal  # type: ignore[no-redef]

EXIT_DIE = 255  # what a Perl `die` in PVE's CLI handler exits with
NODE_DIR_ENV = "FLEETFIX_LAB_NODE_DIR"  # container.NODE_DIR_ENV, set by the node's `pct` wrapper
NSENTER = "/usr/bin/nsenter"
PVE_CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # what PVE's CLI handler forces PATH to
PLAIN_EXEC_ENV = "FLEETFIX_LAB_PCT_PLAIN_EXEC"
_LAB_ENV_PREFIX = "FLEETFIX_LAB_"
_RELAYED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class PctDie(Exception):
    """A PVE-style fatal error: message printed as-is, exit 255."""


def parse_options(
    args: list[str], allowed: dict[str, bool], *, require_order: bool = False
) -> tuple[dict[str, str], list[str]]:
    """Split PVE-style `--name value` options (allowed: name -> takes a value) from positional args.

    Options may come anywhere (Getopt::Long's default), except that with require_order (PVE uses it for
    commands taking `extra-args`, like exec) the first positional word ends option parsing. Everything
    after `--` is positional verbatim.
    """
    options: dict[str, str] = {}
    positional: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            positional += args[index + 1 :]
            break
        if require_order and positional:
            positional += args[index:]
            break
        if arg.startswith("-") and len(arg) > 1:
            name, has_eq, value = arg.lstrip("-").partition("=")
            if name not in allowed:
                raise PctDie(f"Unknown option: {name}")
            if allowed[name] and not has_eq:
                index += 1
                if index >= len(args):
                    raise PctDie(f"Option {name} requires an argument")
                value = args[index]
            options[name] = value if allowed[name] else "1"
        else:
            positional.append(arg)
        index += 1
    return options, positional


def bool_option(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.lower() in ("1", "true", "yes", "on")


def check_vmid(text: str | None) -> int:
    if text is None or not re.fullmatch(r"[1-9][0-9]{2,8}", text):
        raise PctDie(
            "400 Parameter verification failed.\n"
            f"vmid: invalid format - value '{text}' does not look like a valid VM ID"
        )
    return int(text)


def missing_config(node_dir: str, vmid: int, conf_subdir: str = "lxc") -> PctDie:
    """load_config on a guest that is not on this node (conf_subdir "qemu-server" for qm)."""
    with open(os.path.join(node_dir, "nodename")) as handle:
        node_name = handle.read().strip()
    return PctDie(f"Configuration file 'nodes/{node_name}/{conf_subdir}/{vmid}.conf' does not exist")


def log_invocation(node_dir: str, argv: list[str], log_name: str = "pct.log") -> None:
    """Append argv to <node dir>/pct.log as one JSON line, for every pct command (pct.py calls this too;
    container.NodeState.pct_calls reads them). qm.py logs to qm.log the same way."""
    line = json.dumps(argv) + "\n"
    # One write() with O_APPEND: concurrent pct calls never interleave within a line.
    fd = os.open(os.path.join(node_dir, log_name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def running_pid1(node_dir: str, vmid: int, state_subdir: str = "ct") -> int | None:
    """The guest's init PID when it runs (same check as container.Container.pid1: PID and start time);
    state_subdir "vm" for a VM."""
    try:
        with open(os.path.join(node_dir, state_subdir, str(vmid), "run.json")) as handle:
            state = json.load(handle)
        with open(f"/proc/{state['pid1']}/stat") as handle:
            proc_stat = handle.read()
    except (OSError, ValueError, KeyError):
        return None
    fields = proc_stat[proc_stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X") or int(fields[19]) != state["pid1_start"]:
        return None
    return int(state["pid1"])


def exec_environment(keep_env: bool) -> dict[str, str]:
    if keep_env:
        env = {key: value for key, value in os.environ.items() if not key.startswith(_LAB_ENV_PREFIX)}
        env.pop("SSL_CERT_FILE", None)
        env.pop("SSL_CERT_DIR", None)
        env["PATH"] = PVE_CLI_PATH
    else:
        # lxc-attach --clear-env: an empty environment plus its default PATH.
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    env["container"] = "lxc"
    return env


def cmd_exec(node_dir: str, args: list[str]) -> int:
    vmid = check_vmid(args[0] if args else None)
    if not os.path.isfile(os.path.join(node_dir, "lxc", f"{vmid}.conf")):
        raise missing_config(node_dir, vmid)
    options, command = parse_options(args[1:], {"keep-env": True}, require_order=True)
    pid1 = running_pid1(node_dir, vmid)
    if pid1 is None:
        raise PctDie(f"container '{vmid}' not running!")
    if not command:
        raise PctDie("missing command")
    keep_env = bool_option(options.get("keep-env"), default=True)
    if lxcreal.is_real(node_dir, vmid):
        # Real pct: clean_environment(), then exec lxc-attach, which keeps or clears the environment
        # itself and adds container=lxc.
        argv = lxcreal.attach_argv(node_dir, vmid, keep_env, command)
        env = exec_environment(True)
        env.pop("container")
    else:
        # `--wd` bare: the target's cwd, inside the chroot.
        argv = [NSENTER, f"--target={pid1}", "--mount", "--uts", "--ipc", "--pid", "--root", "--wd", "--"]
        argv += command
        env = exec_environment(keep_env)
    if os.environ.get(PLAIN_EXEC_ENV) == "1" or os.isatty(0):
        restore_default_signals()
        os.execve(argv[0], argv, env)
    return _run_watched(argv, env)


def restore_default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ, and exec keeps ignored signals: undo that for the command."""
    for signum in (signal.SIGPIPE, signal.SIGXFSZ, *_RELAYED_SIGNALS):
        signal.signal(signum, signal.SIG_DFL)


def _is_pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _hang_up(child: int, grace: float = 1.0) -> int:
    """The channel is gone: end the command's process group; return the child's wait status.

    SIGPIPE first, as the command's next write would have got (so `... | head -1` on the node still sees
    141), then SIGKILL for whatever in the group ignored it, so nothing outlives the channel.
    """
    _signal_group(child, signal.SIGPIPE)
    status: int | None = None
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if status is None:
            pid, wait_status = os.waitpid(child, os.WNOHANG)
            status = wait_status if pid else None
        if status is not None and not _group_alive(child):  # reaped nsenter; the command is gone too
            return status
        time.sleep(0.01)
    _signal_group(child, signal.SIGKILL)
    return status if status is not None else os.waitpid(child, 0)[1]


def _run_watched(argv: list[str], env: dict[str, str]) -> int:
    """Fork+exec argv in its own process group and mirror its fate (see pct.py's docstring)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.setpgid(0, 0)
            restore_default_signals()
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    # Make sure the group exists before anything could be relayed to it (avoid a race with the child).
    with contextlib.suppress(OSError):
        os.setpgid(child, child)
    for signum in _RELAYED_SIGNALS:
        signal.signal(signum, lambda received, _frame: _signal_group(child, received))
    # Not SIGPIPE: we never write; the command gets its own SIGPIPE.
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    for fd in {1, 2}:
        if _is_pipe_or_socket(fd):
            poller.register(fd, 0)  # POLLERR/POLLHUP are always reported: the reader went away
    reader_gone = False
    while not reader_gone:
        events = poller.poll()  # EINTR (a relayed signal) is retried by Python itself
        if any(fd == pidfd for fd, _ in events):
            break
        reader_gone = any(
            fd in (1, 2) and revents & (select.POLLERR | select.POLLHUP) for fd, revents in events
        )
    status = _hang_up(child) if reader_gone else os.waitpid(child, 0)[1]
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    fatal = os.WTERMSIG(status)
    if fatal in (signal.SIGKILL, signal.SIGSTOP):  # cannot be re-raised by handler; die the same way
        os.kill(os.getpid(), fatal)
    signal.signal(fatal, signal.SIG_DFL)
    import resource  # only here: a core dump of this stand-in would be noise

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), fatal)
    return 128 + fatal


def main(args: list[str]) -> int:
    """`pct exec ARGS...` as the node's wrapper runs it (args without "exec")."""
    try:
        node_dir = os.environ.get(NODE_DIR_ENV)
        if not node_dir:
            raise PctDie(f"{NODE_DIR_ENV} is not set: this pct stand-in only runs on a test-bed node")
        log_invocation(node_dir, ["exec", *args])
        return cmd_exec(node_dir, args)
    except PctDie as error:
        sys.stdout.flush()
        sys.stderr.write(f"{error}\n")
        return EXIT_DIE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
