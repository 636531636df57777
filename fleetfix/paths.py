"""Where fleetfix keeps its state on the controller: run records, the audit history, discovery caches.

Everything there is private to the user whatever the umask (under umask 000 it would be open to all):
directories fleetfix creates are 0700 (`private_dir`), files 0600 (`private_file`). mkdir's and open's
mode arguments are filtered by the umask, so the modes are set again with chmod, which is not.

A report file can be shared with one group instead (`--prometheus-group`: node_exporter runs as another
user): the file 0640 and the directories fleetfix creates for it 0750, with that group; still nothing
for others.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shlex
from collections.abc import Mapping
from pathlib import Path

from fleetfix.errors import ConfigError


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$FLEETFIX_STATE_DIR, else $XDG_STATE_HOME/fleetfix, else ~/.local/state/fleetfix."""
    env = os.environ if environ is None else environ
    if env.get("FLEETFIX_STATE_DIR"):
        return Path(env["FLEETFIX_STATE_DIR"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "fleetfix"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "fleetfix"


def private_dir(path: Path, group: int | None = None) -> Path:
    """path as a directory, creating it and every missing parent 0700 (with a group: 0750 and that group,
    so that its members can list and traverse them). Existing directories are left as they are (a parent
    such as /srv is not ours to change)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    mode = 0o700 if group is None else 0o750
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:  # another process made it meanwhile
            continue
        if group is not None:
            os.chown(directory, -1, group)
        os.chmod(directory, mode)
    return path


def group_id(name: str, option: str) -> int:
    """The id of the group `name` (or a number), checked to exist here; ConfigError names the option."""
    try:
        return grp.getgrgid(int(name)).gr_gid if name.isdigit() else grp.getgrnam(name).gr_gid
    except (KeyError, OverflowError):
        raise ConfigError(f"{option} {name!r}: no such group on this host (getent group {name})") from None


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def group_change_refused(gid: int, option: str) -> ConfigError:
    """Why this process cannot give a file to group gid (chown needs root, or a member of the group)."""
    name, user = grp.getgrgid(gid).gr_name, _user()
    return ConfigError(f"{option} {name}: user {user} may not give files to group {name}: run the audit as "
                       f"root, or add {user} to the group (usermod -aG {name} {user}) and log in again")


def check_shared_file(path: Path, gid: int, option: str) -> None:
    """Before any work: that a file written to path can be given to group gid, and that the group can
    read it there. A directory of ours that keeps the group out (made 0700 by a run without the option)
    would leave the 0640 file unreadable: named with its fix. Another user's directory (node_exporter's
    own), or one with an ACL, is taken as it is."""
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise group_change_refused(gid, option)
    directory = path.parent
    while not directory.is_dir() and directory != directory.parent:
        directory = directory.parent  # the folders under it are made 0750 with the group when it is written
    # The file's own folder is listed (the collector reads every *.prom in it); one above is only passed.
    need, bits = (0o5, "rx") if directory == path.parent else (0o1, "x")
    info = directory.stat()
    if info.st_uid != os.geteuid() or info.st_mode & need == need:
        return
    if info.st_gid == gid and (info.st_mode >> 3) & need == need:
        return
    try:
        os.getxattr(directory, "system.posix_acl_access")
        return
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
    name, quoted = grp.getgrgid(gid).gr_name, shlex.quote(str(directory))
    raise ConfigError(f"{option} {name}: {directory} (mode {info.st_mode & 0o7777:04o}) keeps group {name} "
                      f"out of it: chgrp {name} {quoted} && chmod g+{bits} {quoted}")


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
