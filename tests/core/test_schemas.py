"""The quick checks compiled from schemas/ agree with the full validator: whatever they accept,
the schema accepts (they only ever skip work, never change an answer)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import fast_check, validate

REF = "authorize.json#/$defs/request"
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
field_values = {
    "agent_id": st.sampled_from([UUID, UUID.upper(), UUID[:-1], "x", ""]) | json_values,
    "tool_name": st.text(min_size=0, max_size=300) | json_values,
    "parameters": st.dictionaries(st.text(max_size=5), json_values, max_size=4) | json_values,
    "extra": json_values,
}
bodies = st.fixed_dictionaries({}, optional={name: values for name, values in field_values.items()})


@settings(max_examples=500)
@given(bodies)
def test_the_quick_check_never_accepts_what_the_schema_refuses(body):
    quick = fast_check(REF)
    assert quick is not None
    if quick(body):
        assert validate(REF, body) == []


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=255))
def test_the_quick_check_accepts_ordinary_requests(tool):
    body = {"agent_id": UUID, "tool_name": tool, "parameters": {"a": 1}}
    assert fast_check(REF)(body) == (validate(REF, body) == [])


def test_schemas_with_keywords_it_does_not_know_get_no_quick_check():
    assert fast_check("policy.json#/$defs/create") is None
