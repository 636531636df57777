#!/usr/bin/python3
"""A stand-in for the QEMU guest agent (qemu-ga), installed in test-bed VMs as /usr/sbin/qemu-ga.

It runs *inside* the VM (its namespaces and root, tests/lab/vm.py starts it when the VM starts, like
systemd starts qemu-guest-agent.service) and answers on the listening socket it inherits as fd 3 (the
host side of QEMU's virtio-serial channel, /var/run/qemu-server/VMID.qga on a real node). One JSON request
per connection, one JSON answer, in QMP's shape: {"execute": NAME, "arguments": {...}} ->
{"return": ...} or {"error": {"class": "GenericError", "desc": ...}}.

Commands, after QEMU's qga/commands.c (docs/findings.md "Proxmox VMs (qm)"):

    guest-ping
    guest-exec         path, arg, input-data (base64), capture-output -> {"pid": N}
    guest-exec-status  pid -> {"exited": false} while it runs; once it has exited and both output pipes
                       are closed: exitcode or signal, out-data/err-data (base64, only when non-empty),
                       out-truncated/err-truncated (with the data); the entry is then forgotten

As in QEMU: the command is spawned with the agent's own environment (no caller's variables), PATH searched
in it, SIGPIPE back to default, in the agent's own process group (no setsid/setpgid: a `kill 0` from the
command kills the agent); stdin is the input data (then closed) or /dev/null; each stream keeps at most
16 MiB, the rest is read and dropped with the truncated flag set. There is no command to kill a process.

Standard library only: it runs on the VM's /usr/bin/python3.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading

LISTEN_FD = 3
MAX_OUTPUT = 16 * 1024 * 1024  # GUEST_EXEC_MAX_OUTPUT
IO_SIZE = 4096  # GUEST_EXEC_IO_SIZE
# What systemd gives a service without Environment= settings: no HOME, no LANG, this PATH.
AGENT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


class AgentError(Exception):
    pass


class Stream:
    """One captured output pipe: at most MAX_OUTPUT bytes kept, the rest drained and dropped."""

    def __init__(self, pipe: object) -> None:
        self.data = bytearray()
        self.truncated = False
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: object) -> None:
        fd = pipe.fileno()  # type: ignore[attr-defined]
        try:
            while True:
                chunk = os.read(fd, IO_SIZE)
                if not chunk:
                    break
                room = MAX_OUTPUT - len(self.data)
                if len(chunk) > room:
                    self.truncated = True
                self.data += chunk[: max(room, 0)]
        finally:
            os.close(fd)
            self.closed.set()


class Process:
    def __init__(self, argv: list[str], input_data: bytes | None) -> None:
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if input_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=AGENT_ENV,
                cwd="/",
                close_fds=True,
                restore_signals=True,  # SIGPIPE back to default, as guest_exec_task_setup does
            )
        except OSError as error:
            reason = error.strerror or str(error)
            raise AgentError(
                f"Guest agent command failed, error was 'Failed to execute child process "
                f"\u201c{argv[0]}\u201d ({reason})'"
            ) from None
        self.out = Stream(self.popen.stdout)
        self.err = Stream(self.popen.stderr)
        self.popen.stdout = self.popen.stderr = None  # the readers own (and close) the pipes
        if input_data is not None:
            threading.Thread(target=self._feed, args=(input_data,), daemon=True).start()

    def _feed(self, data: bytes) -> None:
        pipe = self.popen.stdin
        assert pipe is not None
        # The command may close its stdin early, like any reader may: nothing to report then.
        with contextlib.suppress(OSError):
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    def status(self) -> dict[str, object] | None:
        """The exec-status answer once everything is in, else None (still running)."""
        code = self.popen.poll()
        if code is None or not (self.out.closed.is_set() and self.err.closed.is_set()):
            return None
        answer: dict[str, object] = {"exited": True}
        if code >= 0:
            answer["exitcode"] = code
        else:
            answer["signal"] = -code
        for key, stream in (("out", self.out), ("err", self.err)):
            if stream.data:
                answer[f"{key}-data"] = base64.b64encode(bytes(stream.data)).decode()
                answer[f"{key}-truncated"] = stream.truncated
        return answer


class Agent:
    def __init__(self) -> None:
        self.processes: dict[int, Process] = {}
        self.lock = threading.Lock()

    def handle(self, request: dict[str, object]) -> object:
        name = request.get("execute")
        arguments = request.get("arguments") or {}
        assert isinstance(arguments, dict)
        if name == "guest-ping":
            return {}
        if name == "guest-exec":
            return self.exec(arguments)
        if name == "guest-exec-status":
            return self.exec_status(arguments)
        raise AgentError(f"The command {name} has not been found")

    def exec(self, arguments: dict[str, object]) -> object:
        path = arguments.get("path")
        args = arguments.get("arg") or []
        encoded = arguments.get("input-data")
        if not isinstance(path, str) or not isinstance(args, list):
            raise AgentError("Invalid parameter type for 'path', expected: string")
        input_data = base64.b64decode(encoded) if isinstance(encoded, str) else None
        process = Process([path, *map(str, args)], input_data)
        with self.lock:
            self.processes[process.popen.pid] = process
        return {"pid": process.popen.pid}

    def exec_status(self, arguments: dict[str, object]) -> object:
        pid = arguments.get("pid")
        with self.lock:
            process = self.processes.get(pid) if isinstance(pid, int) else None
            if process is None:
                raise AgentError(f"PID {pid} does not exist")
            answer = process.status()
            if answer is None:
                return {"exited": False}
            del self.processes[pid]  # type: ignore[arg-type]
            return answer

    def serve_one(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rwb") as stream:
            line = stream.readline()
            try:
                answer: dict[str, object] = {"return": self.handle(json.loads(line))}
            except AgentError as error:
                answer = {"error": {"class": "GenericError", "desc": str(error)}}
            except (ValueError, AssertionError):
                answer = {"error": {"class": "GenericError", "desc": "Invalid JSON syntax"}}
            stream.write(json.dumps(answer).encode() + b"\n")
            stream.flush()


def main() -> int:
    os.setsid()  # a service of its own, as systemd starts it: the commands it spawns share its group
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    listener = socket.socket(fileno=LISTEN_FD)
    agent = Agent()
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=agent.serve_one, args=(connection,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
