"""dpkg state rules: what makes any install fail before it starts (DOMAIN.md 6)."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.rules import guestkind
from fleetfix.probe.rules.base import Context, Finding, Severity, finding

# Free space below which installing the toolkit (and building an extension) is refused or risky.
# The minimal set (nvcc, cudart-dev, cccl) is a few hundred MB, but apt keeps the downloaded .debs in
# /var/cache/apt/archives while unpacking to /usr/local (usually one filesystem, so it counts twice),
# the optional libcu*-dev set for CUDAContext.h users is several GB, and an extension build tree is
# ~1 GB (causal-conv1d's .so alone is 263 MB). Under 2 GiB even the minimal set can fail mid-unpack
# ("No space left on device", DOMAIN.md 6, leaving dpkg interrupted); under 8 GiB the full set or a
# flash-attn build may not fit.
DISK_ERROR_MB = 2048
DISK_WARNING_MB = 8192


def dpkg_interrupted(ctx: Context) -> Iterator[Finding]:
    dpkg = ctx.facts.dpkg
    if dpkg.interrupted:
        yield finding(
            "DPKG_INTERRUPTED", Severity.ERROR,
            f"a dpkg run was interrupted ({dpkg.pending_updates} pending in /var/lib/dpkg/updates): every "
            "apt-get install fails with 'dpkg was interrupted, you must manually run dpkg --configure -a'",
            {"pending_updates": dpkg.pending_updates},
            hint="run `dpkg --configure -a` (then `apt-get -f install` if dependencies are unmet)",
        )


def dpkg_lock_held(ctx: Context) -> Iterator[Finding]:
    holders = ctx.facts.dpkg.lock_holders
    if not holders:
        return
    who = ", ".join(f"{h.command or '?'} (pid {h.pid})" for h in holders)
    yield finding(
        "DPKG_LOCK_HELD", Severity.WARNING,
        f"the dpkg/apt lock is held by {who}: an install now fails with 'Could not get lock' unless it waits",
        {"lock_holders": [h.model_dump() for h in holders]},
        hint="wait for it (the playbooks use -o DPkg::Lock::Timeout=600); never delete lock files",
    )


def disk_low(ctx: Context) -> Iterator[Finding]:
    if not ctx.installs_planned:
        return
    free = {path: mb for path, mb in ctx.facts.build.disk_free_mb.items() if mb is not None}
    if not free:
        return
    path, least = min(free.items(), key=lambda item: item[1])
    if least >= DISK_WARNING_MB:
        return
    severity = Severity.ERROR if least < DISK_ERROR_MB else Severity.WARNING
    need = f"at least {DISK_ERROR_MB}" if severity is Severity.ERROR else f"up to {DISK_WARNING_MB}"
    yield finding(
        "DISK_LOW", severity,
        f"only {least} MiB free on {path}: the toolkit install and extension build need {need} MiB",
        {"disk_free_mb": free, "error_below_mb": DISK_ERROR_MB, "warning_below_mb": DISK_WARNING_MB},
        hint=guestkind.disk_hint(ctx.guest, path),
    )
