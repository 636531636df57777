"""What a command asks to act on: the targeting options every fleet command shares, as one value.

Kept apart from the loader so the command line can build it without importing the inventory's models.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetfix.errors import ConfigError


@dataclass(frozen=True)
class TargetRequest:
    """The targeting options every fleet command shares (the CLI's `--inventory`, `--host`, ...)."""

    inventory: str | None = None
    limit: str | None = None
    host: str | None = None
    port: int = 22
    user: str = "root"
    identity: str | None = None
    known_hosts: str | None = None
    accept_new: bool = False
    ctids: tuple[int, ...] = ()
    vmids: tuple[int, ...] = ()
    connect_timeout: float = 10.0
    local: bool = False
    refresh: bool = False
    become: bool = False
    become_user: str | None = None
    become_password: str | None = None  # a reference: @env:NAME or @file:PATH

    def check(self) -> None:
        """Refuse contradictory options before anything is read: --local names the one target, so -i or
        --host besides it would be silently ignored; --become-user/--become-password need --become."""
        if not self.become and (self.become_user or self.become_password):
            raise ConfigError("--become-user and --become-password need --become")
        if self.become_password is not None and not self.become_password.startswith(("@env:", "@file:")):
            raise ConfigError("--become-password: expected @env:NAME or @file:PATH (a password on the "
                              "command line would show in ps and in shell history)")
        if self.local and (self.inventory or self.host):
            clashing = (("-i/--inventory", self.inventory), ("--host", self.host))
            given = " and ".join(flag for flag, value in clashing if value)
            raise ConfigError(f"--local cannot be combined with {given}: --local acts on this machine only")
