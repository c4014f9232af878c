"""What a policy file's YAML means: the values users write and what they read as (YAML 1.1's
core schema, as PyYAML reads it, with keys and timestamps kept as the text written), and what
is refused, located at file:line:col."""

from __future__ import annotations

import math
from typing import Any

import pytest

from controller.load import SourceFile, parse_file

VALUES = [
    ("yes", True),
    ("No", False),
    ("on", True),
    ("OFF", False),
    ("true", True),
    ("y", "y"),  # a single letter stays text
    ("~", None),
    ("null", None),
    ("", None),
    ("12", 12),
    ("-0", 0),
    ("+5", 5),
    ("0x1F", 31),
    ("017", 15),  # YAML 1.1 octal
    ("0o17", "0o17"),  # YAML 1.2 octal is text in 1.1
    ("0b101", 5),
    ("1_000", 1000),
    ("190:20:30", 685230),  # sexagesimal
    ("99999999999999999999", 99999999999999999999),
    ("1.5", 1.5),
    ("6.8523015e+5", 685230.15),
    ("1e3", "1e3"),  # no dot: text in YAML 1.1
    ("-.inf", -math.inf),
    ("2026-11-21", "2026-11-21"),  # timestamps stay the text written
    ("2026-11-21T09:00:00Z", "2026-11-21T09:00:00Z"),
    ("'12'", "12"),
    ('"true"', "true"),
    ("!!str 12", "12"),
    ("!!int '12'", 12),
    ("!!timestamp 2026-11-21", "2026-11-21"),
    ("agent-0001", "agent-0001"),
]


def _read(text: str) -> Any:
    loaded = parse_file(SourceFile("p.yaml", text.encode()))
    assert [p for p in loaded.problems if p.path == "$"] == []
    return loaded.documents[0].body


@pytest.mark.parametrize(("written", "value"), VALUES, ids=[w or "empty" for w, _ in VALUES])
def test_a_value_reads_as_yaml_1_1_with_timestamps_as_text(written: str, value: Any):
    body = _read(f"as-value: {written}\nas-item:\n  - {written}\n")
    for read in (body["as-value"], body["as-item"][0]):
        assert type(read) is type(value)
        assert read == value


def test_nan_reads_as_a_float():
    assert math.isnan(_read("x: .nan\n")["x"])


def test_mapping_keys_are_the_text_written():
    body = _read("on: 1\nyes: 2\n1: 3\nnull: 4\n2026-11-21: 5\n~: 6\n'<<': 7\n")
    assert body == {"on": 1, "yes": 2, "1": 3, "null": 4, "2026-11-21": 5, "~": 6, "<<": 7}


def test_the_same_value_twice_reads_the_same():
    assert _read("a: [yes, 8, 8, yes, 0x1F]\nb: [0x1F, 8, yes]\n") == {
        "a": [True, 8, 8, True, 31],
        "b": [31, 8, True],
    }


REFUSED = {
    "duplicate-key": ("a: 1\nb: 2\na: 3\n", "p.yaml:3:1: $: duplicate key 'a' in the document"),
    "duplicate-on": ("x:\n  on: 1\n  'on': 2\n", "p.yaml:3:3: $: duplicate key 'on' in x"),
    "merge-key": (
        "base: &b {x: 1}\nother:\n  <<: *b\n",
        "p.yaml:3:3: $: merge keys (<<) are not supported",
    ),
    "custom-tag": ("a: !x 1\n", "p.yaml:1:4: $: the tag !x is not allowed here"),
    "python-tag": (
        "a: !!python/object:os.system x\n",
        "p.yaml:1:4: $: the tag tag:yaml.org,2002:python/object:os.system is not allowed here",
    ),
    "binary": (
        "a: !!binary aGk=\n",
        "p.yaml:1:4: $: the tag tag:yaml.org,2002:binary is not allowed here",
    ),
    "key-not-scalar": ("? [a]\n: 1\n", "p.yaml:1:3: $: a mapping key must be a plain value"),
    # text a tag cannot read is a located problem, not a traceback
    "bad-hex": ("a: 0x_\n", "p.yaml:1:4: $: the value '0x_' is not a valid int"),
    "bad-int": ("a:\n  - !!int abc\n", "p.yaml:2:5: $: the value 'abc' is not a valid int"),
    "empty-int": ("a: !!int ''\n", "p.yaml:1:4: $: the value '' is not a valid int"),
    "bad-bool": ("a: !!bool maybe\n", "p.yaml:1:4: $: the value 'maybe' is not a valid bool"),
    "bad-float": ("a: !!float x\n", "p.yaml:1:4: $: the value 'x' is not a valid float"),
    "huge-int": (
        "a: " + "1" * 5000 + "\n",  # past Python's 4,300 digits for int()
        "p.yaml:1:4: $: the value '" + "1" * 37 + "...' is not a valid int",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_is_refused_is_located(name: str):
    text, message = REFUSED[name]
    loaded = parse_file(SourceFile("p.yaml", text.encode()))
    assert loaded.documents == ()
    assert [str(p) for p in loaded.problems] == [message]


def test_a_refused_document_leaves_the_others_of_its_file_read():
    loaded = parse_file(SourceFile("p.yaml", b"a: !!int abc\n---\nb: 1\n"))
    assert [str(p) for p in loaded.problems if p.path == "$"] == [
        "p.yaml:1:4: $: the value 'abc' is not a valid int"
    ]
    assert [d.body for d in loaded.documents] == [{"b": 1}]
