"""Extension rules: compiled modules present and importable, partners installed (DOMAIN.md 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetfix.probe.facts import PythonEnv
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
    "mamba_ssm": "Mamba layers fall back to the slow reference scan",
}
# Which missing extension is implied by which present one. Only one way round: fla's GatedDeltaNet and
# mamba_ssm run their fast path through causal_conv1d, but causal_conv1d on its own is a complete install
# (transformers' Mamba-family models call it without fla), so it implies nothing. A team that wants fla
# everywhere lists it in the inventory's required_extensions.
PARTNERS: dict[str, tuple[str, ...]] = {
    "causal_conv1d": ("fla", "mamba_ssm"),
}
# Compiled modules a complete install may lack: since state-spaces/mamba PR #977 ("Make CUDA selective
# scan install explicit opt-in", MAMBA_KEEP_CUDA_BUILD) mamba_ssm installs without selective_scan_cuda,
# which only Mamba-1 needs; Mamba-2 runs on its Triton kernels (DOMAIN.md 3.2).
OPTIONAL_COMPILED: frozenset[str] = frozenset({"mamba_ssm"})


def _cuda_of(env: PythonEnv) -> str | None:
    return env.torch.cuda if env.torch else None


def _build_fix(env: PythonEnv, names: list[str]) -> dict[str, Any]:
    cuda = _cuda_of(env)
    variables: dict[str, Any] = {"extensions": names, "python": env.interpreter}
    if cuda:
        variables["cuda_version"] = cuda
    return {"playbook": BUILD_EXTENSIONS_PLAYBOOK, "vars": variables}


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
                    hint=f"rebuild from source: CUDA_HOME={cuda_dir} pip install --no-build-isolation "
                         f"--force-reinstall --no-cache-dir {name.replace('_', '-')}",
                )
            elif ext.present and ext.importable is False:
                yield finding(
                    "EXTENSION_IMPORT_FAILED", Severity.ERROR,
                    f"{name} in {env.interpreter} does not import: {ext.error or 'unknown error'}",
                    evidence, **_build_fix(env, [name]),
                    hint="rebuild it against the installed torch (an 'undefined symbol' means it was built "
                         "for another torch/ABI)",
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
            if name in ("causal_conv1d", "fla"):
                fallback += f"; transformers logs: '{QWEN_FAST_PATH_WARNING}'"
            compiled = env.extensions[name].compiled_module
            check = f"import {name}" + (f" and {compiled}" if compiled else "")
            yield finding(
                "EXTENSION_MISSING", Severity.WARNING,
                f"{name} is not installed in {env.interpreter} ({why}): {FALLBACKS.get(name, 'slow path')}",
                {"interpreter": env.interpreter, "extension": name, "present": sorted(present),
                 "fallback": fallback},
                **_build_fix(env, [name]),
                hint=f"build it: CUDA_HOME=/usr/local/cuda-{_cuda_of(env)} MAX_JOBS=4 pip install "
                     f"--no-build-isolation {name.replace('_', '-')}, then {check}",
            )
