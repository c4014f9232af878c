"""``core.domain.jsonvalues.same``: equality as JSON means it, which decides whether an update of a
policy or an agent changes anything."""

from __future__ import annotations

from typing import Any

import pytest

from core.domain.jsonvalues import same

EQUAL = {
    "integral-float": (1, 1.0),
    "nested-integral-float": ({"max": [0, 2]}, {"max": [0.0, 2.0]}),
    "key-order": ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"d": 3, "c": 2}, "a": 1}),
    "null": (None, None),
    "booleans": ([True, False], [True, False]),
    "strings": ("é", "é"),
}
DIFFERENT = {
    "true-is-not-1": (True, 1),
    "false-is-not-0": (False, 0.0),
    "text-is-not-a-number": ("1", 1),
    "null-is-not-false": (None, False),
    "list-order": ([1, 2], [2, 1]),
    "a-missing-key": ({"a": 1}, {"a": 1, "b": None}),
    "a-longer-list": ([1], [1, 1]),
    "fraction": (0.5, 0),
    "nested-boolean": ({"enum": [1]}, {"enum": [True]}),
}


@pytest.mark.parametrize(("a", "b"), EQUAL.values(), ids=EQUAL.keys())
def test_equal_json_values(a: Any, b: Any) -> None:
    assert same(a, b)
    assert same(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT.values(), ids=DIFFERENT.keys())
def test_different_json_values(a: Any, b: Any) -> None:
    assert not same(a, b)
    assert not same(b, a)
