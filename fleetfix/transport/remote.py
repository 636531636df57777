"""The watchdog that makes a remote command's timeout actually kill it.

Why a watchdog on the remote side: closing an SSH exec channel does not stop the command. sshd (OpenSSH
9.2, measured) only closes the pipes; a `sleep 300` keeps running. The SSH `signal` channel request would
killpg the session, but sshd refuses it for root logins ("session signalling requires privilege
separation"), and Proxmox nodes are driven as root. So when a command has a timeout, it runs under a tiny
POSIX sh wrapper that starts a timer; when the timer fires, the wrapper prints a marker line to stderr and
`kill -KILL 0`s its own process group, which is the whole exec session (sshd makes every session a new
process group). The command runs in the foreground, so its stdin is the channel's; only the timer is a
background job. On normal exit the timer is stopped at once, so it never holds the channel open.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Written to stderr by the watchdog just before it kills the process group.
TIMEOUT_MARKER = "fleetfix: timed out after"

# $1: seconds; $2...: the command. The watchdog is a background subshell that sleeps, then kills the whole
# process group; when the command ends first, its TERM makes the subshell kill its sleep and exit. Races,
# each found by a test under load:
# - The stop can arrive between the timer's `sleep &` and `s=$!`, when the trap does not know the sleep
#   yet: the trap only marks it, and the timer kills its own sleep once it knows it.
# - The sleep is killed with KILL, never TERM: a stop right after `sleep &` reaches the forked shell before
#   it has exec'd sleep, while it still has the trap's handler, which only notes the signal, and exec then
#   forgets it. A TERM there was lost, and the subshell, waiting on a sleep that lived on, held the
#   command's stderr open until the timeout (hours for a build step): the channel's EOF never came.
#   dash's `wait` reports a child killed by a signal ("Killed") on stderr: not the command's output.
# The sleep gets /dev/null for its output so that nothing left of it could hold the channel open.
_WATCHDOG = (
    't=$1; shift; '
    '( s=; stop=; trap \'stop=1; kill -KILL "$s" 2>/dev/null\' TERM; '
    'sleep "$t" </dev/null >/dev/null 2>&1 & s=$!; '
    '[ -z "$stop" ] || { kill -KILL "$s" 2>/dev/null; exit 0; }; '
    'wait "$s" 2>/dev/null || exit 0; '
    f'echo "{TIMEOUT_MARKER} ${{t}}s: killing the command" >&2; '
    "kill -KILL 0 ) </dev/null & k=$!; "
    '"$@"; rc=$?; kill "$k" 2>/dev/null; exit "$rc"'
)


def watchdog_seconds(timeout: float) -> int:
    """Whole seconds (POSIX sleep takes integers), never below 1."""
    return max(1, math.ceil(timeout))


def with_watchdog(argv: Sequence[str], timeout: float | None) -> tuple[str, ...]:
    """argv, run under the kill-on-timeout wrapper when a timeout is set."""
    if timeout is None:
        return tuple(argv)
    return ("/bin/sh", "-c", _WATCHDOG, "sh", str(watchdog_seconds(timeout)), *argv)

