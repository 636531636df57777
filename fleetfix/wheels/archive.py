"""A wheel's zip directory judged before any member is decompressed: how much it would unpack to.

A zip file declares each member's uncompressed size in its central directory, and Python's zipfile never
decompresses a member past that size (it stops there, and the CRC check fails for a member that would
give more). So the declared sizes bound every later read of the wheel: the CRC pass over all members,
the dist-info files read into memory, pip's unpacking in the target. Deflate compresses a run of zeros
about 1000:1, so a 4 GiB download (the transfer limit) could declare terabytes: refused here, from the
directory alone, before anything is decompressed. A wheel a guest built is judged by the same limits
(`wheelcache`, through `members_problem`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 8 * 1024**3  # one file in the wheel: a large CUDA extension module is a few hundred MB
MAX_TOTAL_BYTES = 16 * 1024**3  # everything unpacked: torch's own wheels unpack to a few GB
MAX_METADATA_BYTES = 16 * 1024**2  # a .dist-info file, read whole into memory


def archive_problem(path: Path) -> str | None:
    """Why the wheel at path unpacks to too much (or is not a zip at all), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        return f"not a readable wheel ({error})"
    return members_problem(members)


def members_problem(members: Sequence[zipfile.ZipInfo]) -> str | None:
    """Why a zip directory with these members unpacks to too much, or None."""
    if len(members) > MAX_MEMBERS:
        return f"{len(members)} members, over the limit of {MAX_MEMBERS}"
    total = 0
    for member in members:
        limit = MAX_METADATA_BYTES if ".dist-info/" in member.filename else MAX_MEMBER_BYTES
        if member.file_size > limit:
            return f"{member.filename[:200]!r} unpacks to {member.file_size} bytes, over the limit of {limit}"
        total += member.file_size
    if total > MAX_TOTAL_BYTES:
        return f"it unpacks to {total} bytes, over the limit of {MAX_TOTAL_BYTES}"
    return None
