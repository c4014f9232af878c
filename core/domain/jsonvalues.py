"""JSON values compared the way JSON means them, not the way Python does: ``1`` is ``1.0``,
``true`` is not ``1``, a mapping's key order does not matter. Called by ``core.store.policies`` and
``core.store.agents``, which leave a field alone when an update gives it the value it already has.
"""

from __future__ import annotations

from typing import Any


def same(a: Any, b: Any) -> bool:
    """Whether two values parsed from JSON (or read back from a JSON column) are equal."""
    if isinstance(a, bool) or isinstance(b, bool):  # bool is an int to Python, not to JSON
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b  # strings and null
