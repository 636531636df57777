"""A target's step checks evaluated in one round trip: one script that runs each check and reports them all.

Why: an apply with nothing to change is its checks, one `pct exec` (and one SSH channel) each; on a fleet
that is most of its wall. The runner (runner.py) sends the checks it may evaluate ahead of their steps in
one script, then steps through the playbook as before, taking a step's check result from the batch instead
of running it again, for as long as nothing has been changed since the batch ran.

The script (`batch_script`) runs each check as `/bin/sh -c CHECK` (the check passed as one quoted word, so a
check's syntax can never reach the batch's own), stdin /dev/null, stdout and stderr into files of a private
temporary directory on a tmpfs (/dev/shm, else /run: the batch must leave the guest's filesystems as it
found them, as its checks do; a guest with neither gets no batch), and only after every check has ended
prints the frame:

    fleetfix-checks NONCE
    INDEX RC START END          one line per check that ran, in order (START/END: /proc/uptime, or -)
    sizes
    <wc -c of each check's stdout file, then its stderr file, in order; then wc's total line>
    data
    <every file's bytes, in the same order, back to back>
    end NONCE

Nothing a check prints goes to the batch's stdout, and the parser (`parse_batch`) takes the files' bytes
by the sizes wc gave, then insists on the exact end line and nothing after it: output that grew after it
was measured (a background writer), a frame cut by the transport's output cap, or anything else out of
shape makes the whole batch unusable, and the runner then runs every step as it would have without it.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

# A check is passed to `sh -c` as one argument: Linux limits one argument to 128 KiB (MAX_ARG_STRLEN).
# A longer check is not batched; it runs as its own script, as before.
MAX_CHECK_CHARS = 100_000

# What the runner keeps of a batch's stdout: more than this and it is not used (each check then runs on
# its own, its output capped as any script's is).
MAX_BATCH_OUTPUT = 4 * 1024 * 1024


@dataclass(frozen=True)
class BatchedCheck:
    """One check's result from a batch: its exit status, its raw output, and how long it ran (None where
    the guest has no /proc/uptime)."""

    rc: int
    stdout: bytes
    stderr: bytes
    duration: float | None


def batchable(script: str) -> bool:
    """Whether a rendered check can travel as one `sh -c` argument."""
    return len(script) <= MAX_CHECK_CHARS and "\0" not in script


def new_nonce() -> str:
    return secrets.token_hex(8)


def batch_script(checks: Sequence[str], nonce: str, *, stop_at_failure: bool) -> str:
    """The script that runs checks in order (with stop_at_failure, none after the first that fails) and
    prints the frame described in the module's docstring."""
    lines = [
        # Only a tmpfs takes the outputs: a check changes nothing on the guest, nor may its batch.
        "d=''",
        "while read -r _ m t _; do",
        "  case $m:$t in /dev/shm:tmpfs) d=/dev/shm; break ;; /run:tmpfs) d=/run ;; esac",
        "done 2>/dev/null </proc/self/mounts",
        "[ -n \"$d\" ] && d=$(mktemp -d \"$d/fleetfix-checks.XXXXXX\") || exit 97",
        "trap 'rm -rf \"$d\"' EXIT",
        "h=''; f=''",
        "run() {",
        "  read a _ 2>/dev/null </proc/uptime || a=-",
        "  /bin/sh -c \"$2\" </dev/null >\"$d/$1.o\" 2>\"$d/$1.e\"",
        "  r=$?",
        "  read b _ 2>/dev/null </proc/uptime || b=-",
        "  h=\"$h$1 $r $a $b\n\"",
        "  f=\"$f $d/$1.o $d/$1.e\"",
        "  return $r",
        "}",
    ]
    joiner = " &&\n" if stop_at_failure else "\n"
    lines.append(joiner.join(f"run {index} {shlex.quote(check)}" for index, check in enumerate(checks, 1)))
    lines += [
        f"printf 'fleetfix-checks %s\\n%s' {nonce} \"$h\"",
        "printf 'sizes\\n'",
        "[ -z \"$f\" ] || wc -c $f || exit 98",  # $f: our own file names, split on purpose
        "printf 'data\\n'",
        "[ -z \"$f\" ] || cat $f || exit 98",
        f"printf 'end %s\\n' {nonce}",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


_RESULT = re.compile(rb"^([0-9]+) ([0-9]+) ([0-9.]+|-) ([0-9.]+|-)$")
_SIZE = re.compile(rb"^ *([0-9]+) (/(?:dev/shm|run)/fleetfix-checks\.[A-Za-z0-9]+)/([0-9]+)\.([oe])$")
_TOTAL = re.compile(rb"^ *[0-9]+ total$")


def parse_batch(output: bytes, nonce: str, count: int) -> list[BatchedCheck] | None:
    """The results of the checks that ran (a prefix of the `count` sent), or None when output is not
    exactly the frame batch_script prints."""
    head = f"fleetfix-checks {nonce}\n".encode()
    tail = f"end {nonce}\n".encode()
    if not output.startswith(head) or not output.endswith(tail):
        return None
    lines_end = output.find(b"\ndata\n", len(head) - 1)
    if lines_end < 0:
        return None
    lines = output[len(head):lines_end].split(b"\n")
    try:
        sizes_at = lines.index(b"sizes")
    except ValueError:
        return None
    ran: list[tuple[int, float | None]] = []
    for number, line in enumerate(lines[:sizes_at], 1):
        match = _RESULT.match(line)
        if match is None or int(match[1]) != number or number > count:
            return None
        ran.append((int(match[2]), _duration(match[3], match[4])))
    sizes: list[int] = []
    names = [f"/{number}.{kind}".encode() for number in range(1, len(ran) + 1) for kind in ("o", "e")]
    size_lines = lines[sizes_at + 1:]
    if names:  # two files a check, so wc always adds its total line
        if len(size_lines) != len(names) + 1 or _TOTAL.match(size_lines[-1]) is None:
            return None
    elif size_lines:
        return None
    directories = set()
    for name, line in zip(names, size_lines, strict=False):
        match = _SIZE.match(line)
        if match is None or b"/%s.%s" % (match[3], match[4]) != name:
            return None
        directories.add(match[2])
        sizes.append(int(match[1]))
    if len(directories) > 1:
        return None
    data = output[lines_end + len(b"\ndata\n"):len(output) - len(tail)]
    if len(data) != sum(sizes):
        return None
    results: list[BatchedCheck] = []
    at = 0
    for number, (rc, duration) in enumerate(ran):
        out_size, err_size = sizes[2 * number], sizes[2 * number + 1]
        stdout, stderr = data[at:at + out_size], data[at + out_size:at + out_size + err_size]
        at += out_size + err_size
        results.append(BatchedCheck(rc, stdout, stderr, duration))
    return results


def _duration(start: bytes, end: bytes) -> float | None:
    if start == b"-" or end == b"-":
        return None
    try:
        return max(0.0, float(end) - float(start))
    except ValueError:
        return None
