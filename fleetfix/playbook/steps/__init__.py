"""Step types: a step that is not a plain script step names its type by a key (`copy:`, `wheels:`).

A new type: a module implementing `base.StepType` (its spec, its load-time rules, its templates, its run),
and its line here. The model, the templates and the runner name no step type: they ask the registry.
"""

from __future__ import annotations

from fleetfix.playbook.steps import transfer, wheels
from fleetfix.playbook.steps.base import StepCall, StepEnd, StepType

STEP_TYPES: tuple[StepType, ...] = (
    transfer.COPY,
    transfer.FETCH,
    wheels.WHEELS,
)

__all__ = ["STEP_TYPES", "StepCall", "StepEnd", "StepType"]
