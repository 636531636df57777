"""Where fleetfix keeps its state on the controller: run records, the audit history, discovery caches.

Everything there is private to the user whatever the umask (under umask 000 it would be open to all):
directories fleetfix creates are 0700 (`private_dir`), files 0600 (`private_file`). mkdir's and open's
mode arguments are filtered by the umask, so the modes are set again with chmod, which is not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_STATE_DIR, else $XDG_STATE_HOME/fleetfix, else ~/.local/state/fleetfix."""
    env = os.environ if environ is None else environ
    if env.get("FLEETFIX_STATE_DIR"):
        return Path(env["FLEETFIX_STATE_DIR"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "fleetfix"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "fleetfix"


def private_dir(path: Path) -> Path:
    """path as a directory, creating it and every missing parent 0700. Existing directories are left as
    they are (a parent such as /srv is not ours to change)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(directory, 0o700)
    return path


def private_file(path: Path) -> None:
    """Create path empty with mode 0600 if it does not exist; tighten it to 0600 if it does and is ours
    (an older fleetfix, or a umask, left it readable by others)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(path, 0o600)
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
