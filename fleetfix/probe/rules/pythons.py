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
                hint="name the interpreter in use: `--python PATH` on the probe's command line, or "
                     "`python` / `pythons` in the target's inventory vars",
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
            "no python environment found here has torch: nothing CUDA-related to check",
            {"interpreters": [e.interpreter for e in working],
             "discovered": [d.path for d in ctx.facts.discovered_pythons]},
            hint="nothing to do if this target runs no torch; torch in a place the probe does not search "
                 "is inspected once its interpreter is named: `--python PATH` on the probe's command line, "
                 "or `pythons` in the inventory (docs/inventory.md)",
        )
    for env in ctx.facts.torch_envs:
        # A ROCm build sets torch.version.hip and leaves torch.version.cuda None: a GPU build all the same.
        if env.torch and not env.torch.cuda and not env.torch.hip:
            yield finding(
                "TORCH_CPU_ONLY", Severity.INFO,
                f"torch {env.torch.version} in {env.interpreter} is a CPU-only build: no toolkit needed",
                {"interpreter": env.interpreter, "torch_version": env.torch.version},
                hint="install a CUDA build of torch if this target should use its GPU",
            )
