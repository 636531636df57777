"""A report file shared with a group (`--prometheus-group`): node_exporter runs as another user and must
read the textfile that every audit replaces. Real users, groups and permission checks: needs root."""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetfix.audit.report as report_module
from fleetfix.audit.report import write_atomic
from fleetfix.errors import ConfigError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reads as another user and changes groups: root")

GROUP = "daemon"  # a group every Debian has; `nobody` is not in it (its group is nogroup)
GID = grp.getgrnam(GROUP).gr_gid
NOBODY = 65534


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder others may traverse (pytest's tmp_path sits under a 0700 one that keeps every reader out)."""
    path = Path(tempfile.mkdtemp(prefix="fleetfix-group-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


def read_as_nobody(path: Path, group: str | None) -> subprocess.CompletedProcess[str]:
    as_group = ["-g", group] if group else []
    return subprocess.run(["runuser", "-u", "nobody", *as_group, "--", "cat", str(path)],
                          capture_output=True, text=True, check=False)


def test_a_group_can_read_the_textfile_and_others_cannot_run_after_run(
    base: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = base / "textfile" / "fleetfix.prom"
    at_rename: list[os.stat_result] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:  # what the file is the moment its name appears
        at_rename.append(os.stat(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    for number in (1, 2):  # the second run replaces the file: a new inode, which must get the same again
        write_atomic(path, f"fleetfix_audit_run_complete {number}\n", group=GID)
        for info in (at_rename[-1], path.stat()):
            assert (oct(info.st_mode & 0o7777), info.st_gid) == ("0o640", GID)
        directory = path.parent.stat()
        assert (oct(directory.st_mode & 0o7777), directory.st_gid) == ("0o750", GID)  # made for the group
        member = read_as_nobody(path, GROUP)
        assert member.returncode == 0 and member.stdout == f"fleetfix_audit_run_complete {number}\n", member
        outsider = read_as_nobody(path, None)
        assert outsider.returncode != 0 and "Permission denied" in outsider.stderr


def test_without_a_group_the_file_and_its_new_folder_stay_private(base: Path) -> None:
    path = base / "textfile" / "fleetfix.prom"
    write_atomic(path, "x 1\n")
    assert oct(path.stat().st_mode & 0o7777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o7777) == "0o700"
    assert read_as_nobody(path, GROUP).returncode != 0


@pytest.mark.parametrize("checked_first", [True, False])
def test_a_user_outside_the_group_gets_one_line_with_the_fix(
    base: Path, monkeypatch: pytest.MonkeyPatch, checked_first: bool,
) -> None:
    out = base / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    if not checked_first:  # the fchown itself refused (the check before the audit said yes, wrongly)
        monkeypatch.setattr(report_module, "check_shared_file", lambda *args: None)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a real unprivileged process: nobody, in no group but nogroup
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                write_atomic(out / "fleetfix.prom", "x 1\n", group=GID)
                message = "written"
            except ConfigError as exc:
                message = str(exc)
            os.write(write_end, message.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        message = pipe.read()
    os.waitpid(child, 0)
    assert message == (f"--prometheus-group {GROUP}: user nobody may not give files to group {GROUP}: run "
                       f"the audit as root, or add nobody to the group (usermod -aG {GROUP} nobody) and log "
                       f"in again")
    assert list(out.iterdir()) == []  # no file, no temp file


def test_a_folder_of_ours_that_keeps_the_group_out_is_named_with_its_fix(base: Path) -> None:
    folder = base / "textfile"
    folder.mkdir(mode=0o700)  # as a run without the option made it
    for path, bits in ((folder / "new" / "fleetfix.prom", "x"), (folder / "fleetfix.prom", "rx")):
        fix = f"chgrp {GROUP} {folder} && chmod g+{bits} {folder}"  # pass a folder above; list the own
        with pytest.raises(ConfigError) as refused:
            write_atomic(path, "x 1\n", group=GID)
        assert str(refused.value) == (f"--prometheus-group {GROUP}: {folder} (mode 0700) keeps group {GROUP} "
                                      f"out of it: {fix}")
    assert not (folder / "new").exists()
    subprocess.run(["sh", "-c", fix], check=True)  # the fix it gave
    write_atomic(folder / "fleetfix.prom", "x 1\n", group=GID)
    assert read_as_nobody(folder / "fleetfix.prom", GROUP).stdout == "x 1\n"
