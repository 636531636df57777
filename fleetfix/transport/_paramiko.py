"""paramiko, imported without invoke: every module of fleetfix takes paramiko's names from here.

paramiko.config imports invoke (about a third of paramiko's import time, which every `probe`/`apply` pays)
only to run ssh_config's `Match exec`, and fleetfix never reads an ssh_config through paramiko. So invoke
is hidden while paramiko loads: a None in sys.modules makes that import fail, which paramiko handles.
Nothing changes if invoke is loaded already, and it stays importable for the rest of the process.
"""

from __future__ import annotations

import sys

_HIDE_INVOKE = "invoke" not in sys.modules
if _HIDE_INVOKE:
    sys.modules["invoke"] = None  # type: ignore[assignment]
try:
    import paramiko
    from paramiko import HostKeys, PKey
    from paramiko.pkey import UnknownKeyType
    from paramiko.ssh_exception import (
        AuthenticationException,
        BadAuthenticationType,
        ChannelException,
        PasswordRequiredException,
        SSHException,
    )
finally:
    if _HIDE_INVOKE:
        del sys.modules["invoke"]

__all__ = [
    "AuthenticationException",
    "BadAuthenticationType",
    "ChannelException",
    "HostKeys",
    "PKey",
    "PasswordRequiredException",
    "SSHException",
    "UnknownKeyType",
    "paramiko",
]
