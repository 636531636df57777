"""`@pctssh/NODE:CTID`: a pyinfra connector that reaches a Proxmox container through its node.

pyinfra has no Proxmox connector; this is the shape of its own `@dockerssh` one (pyinfra's SSH connector
to the node, each command wrapped in the node's container CLI), with `pct exec CTID -- sh -c CMD` in place
of `docker exec`: the route Ansible's `community.proxmox.proxmox_pct_remote` takes. Like pyinfra's other
SSH-based connectors it opens one SSH connection per inventory host, i.e. per container. Only what the
benchmark runs is here: shell commands, no file transfer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyinfra.api import QuoteString, StringCommand
from pyinfra.api.exceptions import InventoryError
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import extract_control_arguments, make_unix_command_for_host


class PctSSHConnector(BaseConnector):
    handles_execution = True

    def __init__(self, state: Any, host: Any) -> None:
        super().__init__(state, host)
        self.ssh = SSHConnector(state, host)

    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict[str, str], list[str]]]:
        node, _, ctid = (name or "").rpartition(":")
        if not node or not ctid.isdigit():
            raise InventoryError(f"@pctssh wants NODE:CTID, got {name!r}")
        yield f"@pctssh/{name}", {"ssh_hostname": node, "pct_ctid": ctid}, ["@pctssh"]

    def connect(self) -> None:
        self.ssh.connect()

    def disconnect(self) -> None:
        self.ssh.disconnect()

    def run_shell_command(self, command: Any, print_output: bool = False, print_input: bool = False,
                          **arguments: Any) -> Any:
        local_arguments = extract_control_arguments(arguments)
        inner = make_unix_command_for_host(self.state, self.host, command, **arguments)
        pct = StringCommand("pct", "exec", QuoteString(self.host.data.pct_ctid), "--", "sh", "-c",
                            QuoteString(inner))
        return self.ssh.run_shell_command(pct, print_output=print_output, print_input=print_input,
                                          **local_arguments)

    def put_file(self, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError("@pctssh runs commands only")

    def get_file(self, *args: Any, **kwargs: Any) -> bool:
        raise NotImplementedError("@pctssh runs commands only")
