"""Extension rules: compiled modules present and importable, partners installed (DOMAIN.md 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetfix.probe.facts import PythonEnv, version_tuple
from fleetfix.probe.rules.base import BUILD_EXTENSIONS_PLAYBOOK, Context, Finding, Severity, finding

# Extension -> the slow path a model takes without it (DOMAIN.md 3.4, 3.5).
QWEN_FAST_PATH_WARNING = (
    "The fast path is not available because one of the required library is not installed. Falling back "
    "to torch implementation. To install follow https://github.com/fla-org/flash-linear-attention"
    "#installation and https://github.com/Dao-AILab/causal-conv1d"
)
FALLBACKS: dict[str, str] = {
    "causal_conv1d": (
        "Qwen3-Next / Qwen3.5 GatedDeltaNet layers fall back to the torch implementation "
        "(torch_causal_conv1d_update, F.silu(conv1d)); fla's ShortConvolution and Mamba2 use Triton's conv1d"
    ),
    "fla": (
        "Qwen3-Next / Qwen3.5 GatedDeltaNet layers fall back to torch_chunk_gated_delta_rule / "
        "torch_recurrent_gated_delta_rule"
    ),
    "flash_attn": "attention falls back to the sdpa/eager implementation",
    "mamba_ssm": (
        "Mamba-family layers (Mamba, Mamba2, FalconMamba, Jamba, Bamba, GraniteMoeHybrid) fall back to the "
        "slow reference scan: transformers takes their fast path only with both mamba-ssm and causal-conv1d"
    ),
}
# Which missing extension is implied by which present one. Only one way round: fla's GatedDeltaNet and
# mamba_ssm run their fast path through causal_conv1d (transformers 5.0's modeling_mamba.py:
# `is_fast_path_available = all((selective_state_update, selective_scan_fn, causal_conv1d_fn,
# causal_conv1d_update, mamba_inner_fn))`, the first two and the last from mamba-ssm); but causal_conv1d
# without mamba_ssm serves Qwen3-Next / Qwen3.5 (DOMAIN.md 3.5), so it implies nothing. A team that runs
# Mamba-family models lists mamba_ssm in the inventory's required_extensions.
PARTNERS: dict[str, tuple[str, ...]] = {
    "causal_conv1d": ("fla", "mamba_ssm"),
}
MAMBA_NEEDS_BOTH = (
    "Mamba-family models (Mamba, Mamba2, FalconMamba, Jamba, Bamba, GraniteMoeHybrid) take transformers' "
    "fast path only with both mamba-ssm and causal-conv1d, and fall back to the slow reference path"
)
# Compiled modules a complete install may lack: since state-spaces/mamba#977 ("Make CUDA selective
# scan install explicit opt-in", MAMBA_KEEP_CUDA_BUILD) mamba_ssm installs without selective_scan_cuda,
# which only Mamba-1 needs; Mamba-2 runs on its Triton kernels (DOMAIN.md 3.2).
OPTIONAL_COMPILED: frozenset[str] = frozenset({"mamba_ssm"})


def _cuda_of(env: PythonEnv) -> str | None:
    return env.torch.cuda if env.torch else None


# pip 23.0.1 added --break-system-packages (its NEWS: "Implement --break-system-packages to permit
# installing packages into EXTERNALLY-MANAGED Python installations", pypa/pip#11780); 23.0 enforced PEP 668
# without it.
BREAK_SYSTEM_PACKAGES_SINCE = (23, 0, 1)
VENV = "/opt/torch-venv"


def pep668_route(env: PythonEnv) -> str:
    """How the build can install into this env (docs/extensions.md, PEP 668): "plain" (pip installs as it
    is: not marked, in a venv, pip configured to break system packages, or an older probe that cannot
    say), "break" (marked, and torch was installed there by pip: the build does the same with
    --break-system-packages), or "venv" (marked and torch is the distribution's, or no pip or one too old
    for the flag: build in a venv that sees the system's packages instead)."""
    if not env.externally_managed or env.pip_break_system_packages:
        return "plain"
    pip = version_tuple(env.pip_version)
    if env.torch_installer == "pip" and pip is not None and pip >= BREAK_SYSTEM_PACKAGES_SINCE:
        return "break"
    return "venv"


def _venv_way(env: PythonEnv, names: list[str]) -> str:
    cuda = f" --var cuda_version={_cuda_of(env)}" if _cuda_of(env) else ""
    if env.torch_installer == "pip" and not env.pip_version:
        # pip put torch here and is gone since (or came from elsewhere): with pip back, the env is the
        # "break" case. A venv is no way round it: Debian's `python3 -m venv` needs python3-venv (ensurepip).
        return (f"{env.interpreter} is externally managed (PEP 668) and has no pip, although pip installed "
                "torch there: install pip (Debian/Ubuntu: apt-get install python3-pip python3-dev), then "
                f"fleetfix apply {BUILD_EXTENSIONS_PLAYBOOK} --var extensions={','.join(names)} "
                f"--var python={env.interpreter}{cuda} --var break_system_packages=true")
    if env.torch_installer == "pip":
        owner = f"pip {env.pip_version} has no --break-system-packages (23.0.1+)"
    elif env.torch_installer:
        owner = f"torch there was installed by {env.torch_installer}"
    else:
        owner = "torch there is the distribution's (no INSTALLER)"
    return (f"{env.interpreter} is externally managed (PEP 668) and {owner}: build in a venv that sees "
            f"the system's packages: {env.interpreter} -m venv --system-site-packages {VENV}, then "
            f"fleetfix apply {BUILD_EXTENSIONS_PLAYBOOK} --var extensions={','.join(names)} "
            f"--var python={VENV}/bin/python{cuda} (the extension then imports in {VENV}/bin/python)")


def _build_fix(env: PythonEnv, names: list[str]) -> dict[str, Any]:
    """The build-extensions fix, or none when the playbook would refuse this env (the hint says why and
    gives the venv route instead): the command a user is handed runs as written."""
    route = pep668_route(env)
    if route == "venv":
        return {}
    cuda = _cuda_of(env)
    variables: dict[str, Any] = {"extensions": names, "python": env.interpreter}
    if cuda:
        variables["cuda_version"] = cuda
    if route == "break":
        variables["break_system_packages"] = "true"
    return {"playbook": BUILD_EXTENSIONS_PLAYBOOK, "vars": variables}


def _pip_install(env: PythonEnv) -> str:
    return "pip install --break-system-packages" if pep668_route(env) == "break" else "pip install"


def _hint(env: PythonEnv, names: list[str], hint: str) -> str:
    return _venv_way(env, names) if pep668_route(env) == "venv" else hint


def extension_broken(ctx: Context) -> Iterator[Finding]:
    for env in ctx.facts.torch_envs:
        for name, ext in env.extensions.items():
            evidence = {"interpreter": env.interpreter, "extension": name, **ext.model_dump()}
            cuda_dir = f"/usr/local/cuda-{_cuda_of(env)}" if _cuda_of(env) else "$CUDA_HOME"
            if ext.present and ext.compiled_present is False and name not in OPTIONAL_COMPILED:
                yield finding(
                    "EXTENSION_NOT_BUILT", Severity.ERROR,
                    f"{name} is installed in {env.interpreter} without its compiled module "
                    f"{ext.compiled_module}: importing it fails at model load instead of falling back",
                    evidence, **_build_fix(env, [name]),
                    hint=_hint(env, [name], f"rebuild from source: CUDA_HOME={cuda_dir} {_pip_install(env)} "
                               "--no-build-isolation --force-reinstall --no-cache-dir "
                               f"{name.replace('_', '-')}"),
                )
            elif ext.present and ext.importable is False:
                yield finding(
                    "EXTENSION_IMPORT_FAILED", Severity.ERROR,
                    f"{name} in {env.interpreter} does not import: {ext.error or 'unknown error'}",
                    evidence, **_build_fix(env, [name]),
                    hint=_hint(env, [name], "rebuild it against the installed torch (an 'undefined symbol' "
                               "means it was built for another torch/ABI)"),
                )


def extension_missing(ctx: Context) -> Iterator[Finding]:
    for env in ctx.facts.torch_envs:
        if not _cuda_of(env):
            continue
        present = {name for name, ext in env.extensions.items() if ext.present}
        for name in env.extensions:
            if name in present:
                continue
            partners = sorted(set(PARTNERS.get(name, ())) & present)
            if not partners and name not in ctx.required:
                continue
            why = f"{', '.join(partners)} is installed and needs it" if partners else "required by inventory"
            fallback = FALLBACKS.get(name, "slow path")
            if name == "causal_conv1d" and "mamba_ssm" in partners:
                fallback += f"; {MAMBA_NEEDS_BOTH}"
            if name in ("causal_conv1d", "fla"):
                fallback += f"; transformers logs: '{QWEN_FAST_PATH_WARNING}'"
            compiled = env.extensions[name].compiled_module
            check = f"import {name}" + (f" and {compiled}" if compiled else "")
            summary = FALLBACKS.get(name, "slow path")
            if name == "causal_conv1d" and "mamba_ssm" in partners:
                summary = MAMBA_NEEDS_BOTH
            yield finding(
                "EXTENSION_MISSING", Severity.WARNING,
                f"{name} is not installed in {env.interpreter} ({why}): {summary}",
                {"interpreter": env.interpreter, "extension": name, "present": sorted(present),
                 "fallback": fallback},
                **_build_fix(env, [name]),
                hint=_hint(env, [name], f"build it: CUDA_HOME=/usr/local/cuda-{_cuda_of(env)} MAX_JOBS=4 "
                           f"{_pip_install(env)} --no-build-isolation {name.replace('_', '-')}, "
                           f"then {check}"),
            )


# Extensions whose import name differs from the name transformers' Hub mapping uses.
HUB_NAMES: dict[str, str] = {"causal_conv1d": "causal-conv1d", "mamba_ssm": "mamba-ssm"}


def extension_from_hub(ctx: Context) -> Iterator[Finding]:
    """transformers 5.0 with the `kernels` package importable loads causal-conv1d and mamba-ssm from the
    Hugging Face Hub (kernels-community/...) instead of the local build: its integrations/hub_kernels.py's
    lazy_load_kernel takes `get_kernel(repo_id, ...)` whenever `_kernels_available` (kernels imported),
    whatever USE_HUB_KERNELS says (that switch only gates the layer decorators), and falls back to the
    local package only when kernels is missing. A node that cannot reach the Hub then has no fast path
    from the extension it built. transformers 5.25 imports the local package first and maps no extension
    to the Hub, so the fact (the mapping's keys) tells the two kinds apart."""
    for env in ctx.facts.torch_envs:
        hub = env.hub_kernels
        if hub is None or not hub.kernels or not _cuda_of(env):
            continue
        local = sorted(name for name, ext in env.extensions.items() if ext.present and HUB_NAMES.get(name)
                       in hub.hub_mapped)
        if not local:
            continue
        yield finding(
            "EXTENSION_FROM_HUB", Severity.WARNING,
            f"transformers {hub.transformers or '?'} with kernels {hub.kernels} in {env.interpreter} takes "
            f"{', '.join(HUB_NAMES[n] for n in local)} from the Hugging Face Hub, not the local build: a "
            "node that cannot reach the Hub has no fast path for Mamba-family models",
            {"interpreter": env.interpreter, "transformers": hub.transformers, "kernels": hub.kernels,
             "hub_mapped": hub.hub_mapped, "local_extensions": local},
            hint=f"uninstall `kernels` from this env ({env.interpreter} -m pip uninstall kernels: "
                 "transformers then imports the local packages), or upgrade transformers to a release that "
                 "uses the local package first (5.25.0 does)",
        )


# causal-conv1d's setup.py compiles `arch=compute_103,code=sm_103` whenever nvcc >= 13.0 (read in the
# 1.7.0 sdist, the newest release); nvcc 13.x miscompiles causal_conv1d_fwd/update for sm_103, which then
# give wrong output on a B300 (Dao-AILab/causal-conv1d#105: max_abs_diff 0.4-0.6 in BF16, sm_100-only
# builds bit-exact; the fix, Dao-AILab/causal-conv1d#106, skips that gencode and was not in a release
# when last checked).
SM103_MISCOMPILE_FIXED_AFTER = (1, 7, 0)


def sm103_miscompiled(ctx: Context) -> Iterator[Finding]:
    deep_caps = {c for e in ctx.facts.pythons if e.deep for c in e.deep.capabilities}
    caps = set(ctx.facts.gpu.compute_caps) | deep_caps
    if "10.3" not in caps:
        return
    for env in ctx.facts.torch_envs:
        ext = env.extensions.get("causal_conv1d")
        cuda = version_tuple(_cuda_of(env))
        version = version_tuple((ext.version or "").split("+")[0].split(".post")[0]) if ext else None
        if not (ext and ext.present and ext.compiled_present and cuda and cuda[0] >= 13):
            continue
        if version is not None and version > SM103_MISCOMPILE_FIXED_AFTER:
            continue
        yield finding(
            "EXTENSION_WRONG_RESULTS", Severity.ERROR,
            f"causal-conv1d {ext.version or '?'} in {env.interpreter} on this B300 (sm_103): built for "
            f"torch's CUDA {_cuda_of(env)}, its setup.py adds an sm_103 cubin that nvcc 13.x miscompiles, "
            "and causal_conv1d_fwd/update then return wrong values without an error",
            {"interpreter": env.interpreter, "extension": "causal_conv1d", "version": ext.version,
             "torch_cuda": _cuda_of(env), "compute_caps": sorted(caps)},
            hint="rebuild it for sm_100 only (sm_100 code runs on a 10.3 GPU): drop the compute_103 gencode "
                 "from its setup.py as in Dao-AILab/causal-conv1d#106, then check its output against "
                 "F.conv1d on the GPU",
        )
