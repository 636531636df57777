"""`become` on a node: its privileged commands run through `sudo` when the login is not root.

Least privilege (docs/security.md, "Least privilege on nodes"): the login may be an ordinary user allowed
by sudoers to run exactly `pct`, `qm` and `pvesh` as root. Every command fleetfix runs on a node on behalf
of a guest (`pct exec`, `pct snapshot`, `qm guest exec`, ...) and discovery's `pvesh` goes through the
node's *privileged* transport, this one; node facts for a guest's probe do not (they read /proc and
nvidia-smi, which needs no root). A node that is itself a target runs everything privileged: the point of
applying a playbook to a node is root work such as apt, so that needs a wider sudoers rule (documented).

How sudo is driven, verified against sudo's source (sudo-project/sudo):
- Without a password: `sudo -n -u USER -- argv`. `-n` never prompts: where a password would be needed,
  sudo prints `sudo: a password is required` and exits 1 (plugins/sudoers/logging.c), so nothing ever
  hangs waiting for a terminal.
- With a password (from the secret channel, never the command line): `sudo -n` is tried first; only if
  sudo answers exactly that it needs a password is the command sent again as `sudo -S -k -p '' -u USER --
  argv` with the password as the first line of stdin, followed by the command's own stdin. sudo reads its
  password from stdin one byte at a time up to the newline (src/tgetpass.c, getln: `read(fd, &c, 1)`), so
  the rest of stdin reaches the command untouched; `-k` makes it ask even with cached credentials. Asking
  `-n` first means the password line is only ever sent to a sudo that has just said it will read it: with
  a NOPASSWD rule it would otherwise become the command's first line of input.
- sudo's own refusals (not in sudoers, not allowed for this command, wrong password, sudo missing) are
  told from the command's output by exact lines, as PctTransport tells pct's own errors, and raised as
  `BecomeError` naming the command, with the docs' sudoers lines as the hint.

The remote watchdog of a timed command runs as the login user, outside sudo, so it cannot kill a command
that sudo runs as root: a guest's command is still killed by the watchdog inside the guest (PctTransport),
but the node-side backstop only ends the login's own processes. See docs/security.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleetfix.errors import BecomeError
from fleetfix.target import Become
from fleetfix.transport.base import CommandResult, OutputSink, Transport

PASSWORD_REQUIRED = "sudo: a password is required"
# sudo's refusals, whole stderr lines (the sudoers plugin's wording, English locale: LANG is not passed).
_REFUSED = (
    re.compile(r"Sorry, user \S+ is not allowed to execute .* as \S+ on \S+\."),
    re.compile(r"\S+ is not in the sudoers file\..*"),
    re.compile(r"sudo: \d+ incorrect password attempts?"),
    re.compile(r"sudo: no password was provided"),
    re.compile(PASSWORD_REQUIRED),
)


def sudo_argv(become: Become, argv: Sequence[str], *, with_password: bool = False) -> tuple[str, ...]:
    """The node-side argv that runs argv as become.user."""
    if become.method != "sudo":
        raise ValueError(f"unsupported become method {become.method!r}")
    flags = ("-S", "-k", "-p", "") if with_password else ("-n",)
    return ("sudo", *flags, "-u", become.user, "--", *argv)


def refusal(result: CommandResult) -> str | None:
    """sudo's own refusal line, when sudo refused to run the command at all; None when it ran."""
    if result.exit_code == 0 or result.timed_out or result.stdout:
        return None
    if result.exit_code == 127 and result.stderr.strip().endswith("sudo: command not found"):
        return "sudo is not installed"
    for line in result.stderr.splitlines():
        line = line.strip()
        if any(pattern.fullmatch(line) for pattern in _REFUSED):
            return line
    return None


class BecomeTransport:
    """A node's privileged transport: every command through sudo (wraps the node's own transport)."""

    def __init__(self, node: Transport, become: Become, *, password: str | None = None,
                 node_name: str | None = None) -> None:
        self.node, self.become, self._password = node, become, password
        self.label = node.label
        self.node_name = node_name or node.label

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        # Output is streamed only once sudo is known to let the command run: a refusal is not output.
        attempt = self.node.execute(sudo_argv(self.become, argv), stdin=stdin, timeout=timeout,
                                    on_output=None if self._password is not None else on_output)
        refused = refusal(attempt)
        if refused == PASSWORD_REQUIRED and self._password is not None:
            secret = self._password.encode() + b"\n"
            attempt = self.node.execute(sudo_argv(self.become, argv, with_password=True),
                                        stdin=secret + stdin, timeout=timeout, on_output=on_output)
            refused = refusal(attempt)
        elif refused is None and self._password is not None and on_output is not None:
            # It ran on the first try: its output is passed on now, as it would have streamed.
            for stream, text in (("stdout", attempt.stdout), ("stderr", attempt.stderr)):
                if text:
                    on_output(stream, text.encode())  # type: ignore[arg-type]
        if refused is not None:
            raise BecomeError(f"{self.node_name}: sudo -u {self.become.user} {argv[0]}: {refused}")
        return attempt
