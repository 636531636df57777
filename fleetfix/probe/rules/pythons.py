"""Python environment notes: interpreters that are missing or broken, torch absent or CPU-only."""

from __future__ import annotations

from collections.abc import Iterator

from fleetfix.probe.rules.base import Context, Finding, Severity, finding


def python_problems(ctx: Context) -> Iterator[Finding]:
    for env in ctx.facts.pythons:
        if not env.found:
            yield finding(
                "PYTHON_NOT_FOUND", Severity.INFO,
                f"python interpreter {env.interpreter!r} not found on this target",
                {"interpreter": env.interpreter},
                hint="set the container's `python` var in the inventory to the interpreter or venv in use",
            )
        elif env.error:
            yield finding(
                "PYTHON_PROBE_FAILED", Severity.WARNING,
                f"could not inspect {env.interpreter}: {env.error}",
                {"interpreter": env.interpreter, "executable": env.executable, "error": env.error},
                hint="check that it is a working Python 3 interpreter",
            )


def torch_notes(ctx: Context) -> Iterator[Finding]:
    working = [e for e in ctx.facts.pythons if e.found and not e.error]
    if working and not ctx.facts.torch_envs:
        yield finding(
            "TORCH_NOT_FOUND", Severity.INFO,
            "no inspected python environment has torch: nothing CUDA-related to check",
            {"interpreters": [e.interpreter for e in working]},
            hint="name the venv's interpreter in the inventory if torch lives elsewhere",
        )
    for env in ctx.facts.torch_envs:
        if env.torch and not env.torch.cuda:
            yield finding(
                "TORCH_CPU_ONLY", Severity.INFO,
                f"torch {env.torch.version} in {env.interpreter} is a CPU-only build: no toolkit needed",
                {"interpreter": env.interpreter, "torch_version": env.torch.version},
                hint="install a CUDA build of torch if this target should use its GPU",
            )


def torch_in_uninspected_env(ctx: Context) -> Iterator[Finding]:
    """torch found (as text, by the probe's discovery) in a venv, conda env or running process that no
    inspected interpreter covers: whatever is wrong there is not judged, and the target can look
    healthy. The inventory stays the choice of what is inspected; this says what it leaves out."""
    inspected = {e.prefix for e in ctx.facts.pythons if e.prefix} | {
        e.executable for e in ctx.facts.pythons if e.executable}
    for found in ctx.facts.discovered_pythons:
        if found.torch is None or found.inspected or found.path in inspected or found.prefix in inspected:
            continue
        cuda = found.torch.cuda
        yield finding(
            "TORCH_IN_UNINSPECTED_ENV", Severity.WARNING if cuda else Severity.INFO,
            f"torch {found.torch.version or '?'}" + (f" (CUDA {cuda})" if cuda else " (CPU)")
            + f" is in {found.prefix} ({found.source}), which this probe did not inspect: its toolkit "
            "and extensions are not judged",
            {"path": found.path, "source": found.source, "prefix": found.prefix,
             "torch_version": found.torch.version, "torch_cuda": cuda,
             "inspected": sorted(e.interpreter for e in ctx.facts.pythons)},
            hint=f"add it to the target's inventory: pythons: [python3, {found.path}] (or python: "
                 f"{found.path}), then probe again",
        )
