"""Package repository rules: can this target install NVIDIA's toolkit, and what breaks apt on the way
(DOMAIN.md 1)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from fleetfix.probe.facts import AptSource
from fleetfix.probe.rules.base import (
    Context,
    Finding,
    Severity,
    apt_cleanup_fix,
    dash,
    finding,
)
from fleetfix.probe.rules.route import toolkit_fix, toolkit_hint, toolkit_route


def unsupported_distro(ctx: Context) -> Iterator[Finding]:
    os = ctx.facts.os
    if not ctx.toolkit_needed() or (os.nvidia_distro and os.nvidia_arch):
        return
    if os.nvidia_rpm_distro and os.nvidia_arch:
        return   # RPM_DISTRO_TOOLKIT: NVIDIA has a dnf repository for it
    yield finding(
        "UNSUPPORTED_DISTRO", Severity.ERROR,
        f"{os.pretty_name or os.id or 'this OS'} on {os.machine or '?'} has no NVIDIA CUDA apt repository "
        "to install the toolkit from",
        {"os_id": os.id, "version_id": os.version_id, "machine": os.machine,
         "nvidia_distro": os.nvidia_distro, "nvidia_arch": os.nvidia_arch},
        **toolkit_fix(ctx, cuda := ctx.toolkit_needed()[0]),
        hint=("the pip toolkit wheels work on any glibc Linux (the playbook assembles CUDA_HOME); or a "
              "supported base (Debian 11-13, Ubuntu LTS; x86_64 or aarch64/sbsa)"
              if toolkit_route(ctx, cuda).way == "pip" else toolkit_hint(ctx, cuda)),
    )


def repo_lacks_cuda(ctx: Context) -> Iterator[Finding]:
    os = ctx.facts.os
    for cuda in ctx.toolkit_needed():
        route = toolkit_route(ctx, cuda)
        if not route.repo_lacks:
            continue
        yield finding(
            "NVIDIA_REPO_LACKS_CUDA", Severity.ERROR,
            f"NVIDIA's apt repository for {os.nvidia_distro}/{os.nvidia_arch} has no CUDA {cuda} "
            f"({route.why}): `apt-get install cuda-nvcc-{dash(cuda)}` cannot succeed here",
            {"torch_cuda": cuda, "nvidia_distro": os.nvidia_distro, "nvidia_arch": os.nvidia_arch,
             "why": route.why, "index_nvcc": ctx.facts.apt.nvidia_index.nvcc},
            **toolkit_fix(ctx, cuda),
            hint=("install NVIDIA's CUDA wheels into torch's env (cuda-toolkit-pip.yaml); a torch build "
                  "for a CUDA this repository carries is the other way"
                  if route.way == "pip" else toolkit_hint(ctx, cuda)),
        )


def rpm_distro_toolkit(ctx: Context) -> Iterator[Finding]:
    os = ctx.facts.os
    if ctx.facts.apt.present or not (os.nvidia_rpm_distro and os.nvidia_arch):
        return
    for cuda in ctx.toolkit_needed():
        repo = f"https://developer.download.nvidia.com/compute/cuda/repos/{os.nvidia_rpm_distro}/{os.nvidia_arch}"
        fix = toolkit_fix(ctx, cuda)  # the pip toolkit where its wheels hold an nvcc (13.0 on), else none
        or_pip = " or from the pip wheels" if fix else ""
        yield finding(
            "RPM_DISTRO_TOOLKIT", Severity.ERROR,
            f"{os.pretty_name or os.id} has no apt: CUDA {cuda}'s toolkit comes from NVIDIA's dnf repository "
            f"{os.nvidia_rpm_distro}/{os.nvidia_arch}{or_pip}, not from any Debian recipe",
            {"os_id": os.id, "version_id": os.version_id, "nvidia_rpm_distro": os.nvidia_rpm_distro,
             "nvidia_arch": os.nvidia_arch, "torch_cuda": cuda},
            **fix,
            hint=f"{'or ' if fix else ''}with dnf: "
                 f"`dnf config-manager --add-repo {repo}/cuda-{os.nvidia_rpm_distro}.repo && "
                 f"dnf install -y cuda-nvcc-{dash(cuda)} cuda-cudart-devel-{dash(cuda)} "
                 f"cuda-cccl-{dash(cuda)}`"
                 f" (no driver packages), then CUDA_HOME=/usr/local/cuda-{cuda}",
        )


def repo_not_configured(ctx: Context) -> Iterator[Finding]:
    apt, os = ctx.facts.apt, ctx.facts.os
    needed = ctx.toolkit_needed()
    if not needed or apt.nvidia_repo_configured or not apt.present:
        return
    if not (os.nvidia_distro and os.nvidia_arch):
        return   # UNSUPPORTED_DISTRO says it: there is no repo to configure
    cuda = needed[0]
    if toolkit_route(ctx, cuda).way != "apt":
        return   # configuring it would not help: NVIDIA_REPO_LACKS_CUDA / APT_SHA1_KEY_REJECTED say why
    yield finding(
        "NVIDIA_REPO_NOT_CONFIGURED", Severity.ERROR,
        f"no apt source points at NVIDIA's CUDA repo: `apt-get install cuda-nvcc-{dash(cuda)}` fails with "
        f"'E: Unable to locate package cuda-nvcc-{dash(cuda)}'",
        {"nvidia_sources": [s.model_dump() for s in apt.nvidia_sources],
         "keyring_installed": apt.keyring_installed, "keyring_file": apt.keyring_file,
         "nvidia_distro": os.nvidia_distro, "nvidia_arch": os.nvidia_arch},
        **toolkit_fix(ctx, cuda),
        hint=f"install cuda-keyring_1.1-1 from .../compute/cuda/repos/{os.nvidia_distro}/{os.nvidia_arch}/, "
             "then apt-get update",
    )


def _duplicates(sources: list[AptSource]) -> dict[tuple[str, str], list[AptSource]]:
    groups: dict[tuple[str, str], list[AptSource]] = defaultdict(list)
    for source in sources:
        if "deb" in source.types.split():
            for suite in source.suite.split() or [""]:
                groups[(source.uri.rstrip("/"), suite)].append(source)
    return {key: group for key, group in groups.items() if len(group) > 1}


def _where(sources: list[AptSource]) -> list[str]:
    return [f"{s.file}:{s.line}" for s in sources]


def signed_by_conflicts(ctx: Context) -> Iterator[Finding]:
    for (uri, suite), group in _duplicates(ctx.facts.apt.enabled_sources).items():
        keys = {s.signed_by for s in group}
        evidence = {"uri": uri, "suite": suite, "entries": [s.model_dump() for s in group]}
        hint = ("keep the cuda-keyring entry (/etc/apt/sources.list.d/cuda-<distro>-<arch>.list) and delete "
                f"the others: {', '.join(_where(group))}")
        if len(keys) > 1:
            yield finding(
                "APT_SIGNED_BY_CONFLICT", Severity.ERROR,
                f"{len(group)} entries for {uri} with different Signed-By: apt fails with 'Conflicting "
                "values set for option Signed-By' and 'The list of sources could not be read'",
                evidence, **apt_cleanup_fix(ctx), hint=hint,
            )
        else:
            yield finding(
                "APT_DUPLICATE_SOURCE", Severity.WARNING,
                f"{len(group)} identical entries for {uri}: apt warns that the target is configured "
                "multiple times",
                evidence, **apt_cleanup_fix(ctx), hint=hint,
            )


def nvidia_key_missing(ctx: Context) -> Iterator[Finding]:
    apt = ctx.facts.apt
    trusted = {hit.key for hit in apt.nvidia_keys if hit.file.startswith("/etc/apt/trusted.gpg")}
    # Entries without signed-by are checked against apt's global keyrings; the 2022 key must be there.
    unsigned = [s for s in apt.enabled_sources
                if s.is_cuda_repo and s.signed_by is None and s.repo_distro != "debian13"]
    if unsigned and "3bf863cc" not in trusted:
        yield finding(
            "APT_NVIDIA_KEY_MISSING", Severity.ERROR,
            "NVIDIA source entries without signed-by and no current NVIDIA key in apt's keyrings: apt-get "
            "update fails with 'NO_PUBKEY A4B469963BF863CC' and 'The repository ... is not signed'",
            {"entries": [s.model_dump() for s in unsigned], "trusted_nvidia_keys": sorted(trusted)},
            **apt_cleanup_fix(ctx),
            hint=f"remove {', '.join(_where(unsigned))}, {_drop_old_key(ctx)}, then install cuda-keyring",
        )


def _drop_old_key(ctx: Context) -> str:
    """apt-key exists only up to apt 2.8 (Debian 13's apt 3 has none): advise it only where it is."""
    apt = ctx.facts.apt
    files = sorted({hit.file for hit in apt.nvidia_keys if hit.key == "7fa2af80"})
    if apt.apt_key is False or (apt.apt_key is None and (apt.major or 0) >= 3):
        where = ", ".join(files) or "none found"
        return f"delete the keyring file holding 7fa2af80 ({where}); this apt has no apt-key"
    return "`apt-key del 7fa2af80` (or delete the keyring file)"


def nvidia_ml_repo(ctx: Context) -> Iterator[Finding]:
    ml = [s for s in ctx.facts.apt.enabled_sources if s.is_machine_learning_repo]
    if ml:
        yield finding(
            "APT_NVIDIA_ML_REPO", Severity.ERROR,
            "an entry points at NVIDIA's retired machine-learning repo: apt-get update fails with "
            "'NO_PUBKEY F60F4B3D7FA2AF80'",
            {"entries": [s.model_dump() for s in ml]}, **apt_cleanup_fix(ctx),
            hint=f"delete {', '.join(_where(ml))}: cuDNN, NCCL and TensorRT now live in the CUDA repo",
        )


def old_nvidia_key(ctx: Context) -> Iterator[Finding]:
    old = [hit for hit in ctx.facts.apt.nvidia_keys if hit.key == "7fa2af80"]
    if old:
        yield finding(
            "APT_OLD_NVIDIA_KEY", Severity.WARNING,
            "NVIDIA's pre-2022 signing key 7fa2af80 (apt-key era) is still trusted; it signs nothing now",
            {"keys": [hit.model_dump() for hit in old]}, **apt_cleanup_fix(ctx),
            hint=f"{_drop_old_key(ctx)} and rely on cuda-keyring",
        )


def sha1_key_rejected(ctx: Context) -> Iterator[Finding]:
    apt, os = ctx.facts.apt, ctx.facts.os
    if not apt.uses_sqv:
        return
    # Every NVIDIA Debian-family repo except debian13 is signed by 3bf863cc, bound with SHA-1,
    # which sqv rejects since 2026-02-01 (DOMAIN.md 1.5).
    affected = sorted({s.repo_distro or "?" for s in apt.enabled_sources
                       if s.is_cuda_repo and s.repo_distro != "debian13"})
    would_configure = (not apt.nvidia_repo_configured and bool(ctx.toolkit_needed())
                       and os.nvidia_distro not in (None, "debian13"))
    if not affected and not would_configure:
        return
    repos = affected or [os.nvidia_distro or "?"]
    yield finding(
        "APT_SHA1_KEY_REJECTED", Severity.ERROR,
        f"apt {apt.version or '3.x'} verifies with sqv, which rejects the SHA-1-bound NVIDIA key of the "
        f"{', '.join(repos)} repo: apt-get update fails with 'SHA1 is not considered secure'",
        {"apt_version": apt.version, "sqv": apt.sqv, "repos": repos, "os_id": os.id,
         "version_id": os.version_id},
        hint="escalate: do not weaken apt (no AllowInsecureRepositories, no moved sqv SHA-1 cutoff). Use "
             "the debian13 repo if it carries the needed toolkit, or the pip nvcc wheels",
    )
