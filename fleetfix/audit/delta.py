"""Facts as a delta against the target's earlier facts: the few leaves that move every night.

A target's facts are ~5 KB of JSON, and most of it is the same night after night; but a few leaves are not
(`build.mem_available_mb`, `build.disk_free_mb`, `dpkg.pending_updates`), so storing facts by content hash
alone would store nearly every target's facts again every night. The history stores a base document once
(content-addressed) and, per result, the leaves that differ from it.

A delta is only made when the two documents have the same shape: the same keys, in the same order, at every
level of nested objects (arrays and scalars are leaves, compared whole). Then applying the delta gives back
exactly the new document, key order included (reports print facts as stored). A change of shape (a tool
installed, a python env added) is a new base instead. Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Any

# [path, value] pairs: the value at `path` (a list of object keys) replaced by `value`.
Delta = list[list[Any]]


def leaf_delta(base: Any, new: Any) -> Delta | None:
    """The leaves of `new` that differ from `base`, or None when the two differ in shape (no delta can
    express that: store `new` as a base of its own)."""
    changes: Delta = []
    return changes if _diff(base, new, [], changes) else None


def _diff(base: Any, new: Any, path: list[str], changes: Delta) -> bool:
    if isinstance(base, dict) and isinstance(new, dict):
        if list(base) != list(new):  # keys added, removed or reordered: a shape change
            return False
        return all(_diff(base[key], new[key], [*path, key], changes) for key in new)
    if isinstance(base, dict) or isinstance(new, dict) or not path:
        return False  # an object became a leaf (or the reverse), or the whole document is a leaf
    # Leaves compare by value and type (JSON's 1 and 1.0 and true differ; Python's == does not see it).
    if type(base) is not type(new) or base != new:
        changes.append([path, new])
    return True


def apply_delta(base: dict[str, Any], delta: Delta) -> dict[str, Any]:
    """`base` with the delta's leaves replaced. Copies only the objects on the changed paths: the rest is
    shared with `base`, which is left as it was (a loaded base serves every result that refers to it)."""
    if not delta:
        return base
    result = dict(base)
    for path, value in delta:
        node = result
        for key in path[:-1]:
            child = dict(node[key])  # copy on the way down: the original belongs to the base
            node[key] = child
            node = child
        node[path[-1]] = value
    return result
