"""The audit log's counting and paging, pure (decisions §9): how a time range is cut into whole
hours, whole minutes and the raw entries at its edges (``core.domain.auditcounts.pieces``), and
the list's sealed cursors (``core.domain.cursors``): what one holds comes back out, and any
change to it, or its use for other filters or another workspace, is refused."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from core.domain.auditcounts import GRAINS, HOUR, MINUTE, Piece, pieces
from core.domain.cursors import MAX_LENGTH, CursorError, Position, open_cursor, seal, secret_of

DAY0 = datetime(2026, 11, 21, tzinfo=UTC)


def at(hour: int, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    """An instant of the test's day (hours past 23 run into the next day)."""
    return DAY0 + timedelta(hours=hour, minutes=minute, seconds=second, microseconds=micro)


def raw(start: datetime | None, end: datetime | None) -> Piece:
    return Piece(None, start, end)


def hours(start: datetime | None, end: datetime | None) -> Piece:
    return Piece(HOUR, start, end)


def minutes(start: datetime | None, end: datetime | None) -> Piece:
    return Piece(MINUTE, start, end)


# ---------------------------------------------------------------------------------------------
# pieces


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        pytest.param(at(12), at(13), [hours(at(12), at(13))], id="one-whole-hour"),
        pytest.param(at(12), at(15), [hours(at(12), at(15))], id="whole-hours"),
        pytest.param(at(23), at(26), [hours(at(23), at(26))], id="whole-hours-across-days"),
        pytest.param(at(12, 5), at(12, 10), [minutes(at(12, 5), at(12, 10))], id="whole-minutes"),
        pytest.param(at(12, 5), at(12, 6), [minutes(at(12, 5), at(12, 6))], id="one-minute"),
        pytest.param(
            at(12, 5, 10, 500_000),
            at(12, 5, 40),
            [raw(at(12, 5, 10, 500_000), at(12, 5, 40))],
            id="inside-one-minute",
        ),
        pytest.param(at(12), at(12, 0, 0, 1), [raw(at(12), at(12, 0, 0, 1))], id="one-microsecond"),
        pytest.param(
            at(12, 5, 30),
            at(12, 6, 30),
            [raw(at(12, 5, 30), at(12, 6)), raw(at(12, 6), at(12, 6, 30))],
            id="a-minute-long-off-the-boundaries",
        ),
        pytest.param(
            at(12, 5, 30),
            at(12, 6, 10),
            [raw(at(12, 5, 30), at(12, 6)), raw(at(12, 6), at(12, 6, 10))],
            id="under-a-minute-across-a-minute",
        ),
        pytest.param(
            at(12, 59, 30),
            at(13, 0, 20),
            [raw(at(12, 59, 30), at(13)), raw(at(13), at(13, 0, 20))],
            id="under-a-minute-across-an-hour",
        ),
        pytest.param(
            at(12, 5, 30),
            at(12, 8, 15, 250_000),
            [
                raw(at(12, 5, 30), at(12, 6)),
                minutes(at(12, 6), at(12, 8)),
                raw(at(12, 8), at(12, 8, 15, 250_000)),
            ],
            id="raw-minutes-raw",
        ),
        pytest.param(
            at(11, 58, 30, 1),
            at(14, 1, 15, 999_999),
            [
                raw(at(11, 58, 30, 1), at(11, 59)),
                minutes(at(11, 59), at(12)),
                hours(at(12), at(14)),
                minutes(at(14), at(14, 1)),
                raw(at(14, 1), at(14, 1, 15, 999_999)),
            ],
            id="raw-minutes-hours-minutes-raw",
        ),
        pytest.param(
            at(12),
            at(14, 0, 0, 500_000),
            [hours(at(12), at(14)), raw(at(14), at(14, 0, 0, 500_000))],
            id="whole-hours-then-raw",
        ),
        pytest.param(
            at(11, 59, 59, 999_999),
            at(13),
            [raw(at(11, 59, 59, 999_999), at(12)), hours(at(12), at(13))],
            id="raw-then-whole-hour",
        ),
        pytest.param(
            at(12, 30),
            at(13, 30),
            [minutes(at(12, 30), at(13)), minutes(at(13), at(13, 30))],
            id="minutes-either-side-of-an-hour-boundary",
        ),
        pytest.param(
            at(23, 59, 50),
            at(24, 0, 10),
            [raw(at(23, 59, 50), at(24)), raw(at(24), at(24, 0, 10))],
            id="under-a-minute-across-midnight",
        ),
        pytest.param(at(12), at(12), [], id="empty"),
        pytest.param(at(12, 0, 0, 1), at(12), [], id="end-before-start"),
        pytest.param(None, None, [hours(None, None)], id="unbounded"),
        pytest.param(None, at(12), [hours(None, at(12))], id="to-an-hour"),
        pytest.param(at(12), None, [hours(at(12), None)], id="from-an-hour"),
        pytest.param(
            None,
            at(12, 30, 15),
            [hours(None, at(12)), minutes(at(12), at(12, 30)), raw(at(12, 30), at(12, 30, 15))],
            id="to-inside-a-minute",
        ),
        pytest.param(
            at(12, 30, 15),
            None,
            [raw(at(12, 30, 15), at(12, 31)), minutes(at(12, 31), at(13)), hours(at(13), None)],
            id="from-inside-a-minute",
        ),
    ],
)
def test_pieces_of_a_range(start, end, expected):
    assert pieces(start, end, GRAINS) == expected


@pytest.mark.parametrize(
    ("start", "end", "grains", "expected"),
    [
        pytest.param(
            at(11, 58, 30),
            at(14, 1, 15),
            (MINUTE,),
            [
                raw(at(11, 58, 30), at(11, 59)),
                minutes(at(11, 59), at(14, 1)),
                raw(at(14, 1), at(14, 1, 15)),
            ],
            id="minutes-only",
        ),
        pytest.param(
            None,
            at(12, 0, 30),
            (MINUTE,),
            [minutes(None, at(12)), raw(at(12), at(12, 0, 30))],
            id="minutes-only-open-start",
        ),
        pytest.param(
            at(11, 58, 30), at(14, 1, 15), (), [raw(at(11, 58, 30), at(14, 1, 15))], id="no-grains"
        ),
        pytest.param(None, None, (), [raw(None, None)], id="no-grains-unbounded"),
        pytest.param(at(12), at(11), (), [], id="no-grains-empty"),
    ],
)
def test_pieces_in_the_grains_asked_for(start, end, grains, expected):
    assert pieces(start, end, grains) == expected


MICRO = timedelta(microseconds=1)


def floor(moment: datetime, seconds: int) -> datetime:
    return moment - (moment - DAY0) % timedelta(seconds=seconds)


instants = st.integers(min_value=0, max_value=3 * 86_400 * 10**6).map(
    lambda micros: DAY0 + timedelta(microseconds=micros)
)


@given(start=st.one_of(st.none(), instants), end=st.one_of(st.none(), instants))
@example(start=at(12, 59, 30), end=at(13, 0, 20))
@example(start=at(12, 5, 30), end=at(12, 6, 10))
@example(start=at(12, 30), end=at(13, 30))
@example(start=at(11, 58, 30, 1), end=at(14, 1, 15, 999_999))
def test_pieces_cover_the_range_in_order_none_straddling_a_boundary(start, end):
    """What a count relies on: a range is the sum of its pieces, and each piece's entries lie
    in one bucket of every coarser grain (a stats bucket, or the hour an offset is in)."""
    found = pieces(start, end, GRAINS)
    if start is not None and end is not None and start >= end:
        assert found == []
        return
    assert found, "a non-empty range has at least one piece"
    assert found[0].start == start
    assert found[-1].end == end
    for before, after in itertools.pairwise(found):
        assert before.end == after.start
        assert before.end is not None
    for piece in found:
        assert piece.start is None or piece.end is None or piece.start < piece.end
        if piece.grain is None:  # raw entries at an edge: inside one minute
            assert piece.start is not None
            assert piece.end is not None
            assert floor(piece.start, MINUTE) == floor(piece.end - MICRO, MINUTE)
            continue
        for bound in (piece.start, piece.end):  # whole buckets, aligned in UTC
            if bound is not None:
                assert (bound - DAY0) % timedelta(seconds=piece.grain) == timedelta(0)
        if piece.grain == MINUTE:  # whole minutes: inside one hour
            assert piece.start is not None
            assert piece.end is not None
            assert floor(piece.start, HOUR) == floor(piece.end - MICRO, HOUR)
    assert len([p for p in found if p.grain == HOUR]) <= 1
    assert len(found) <= 5


# ---------------------------------------------------------------------------------------------
# cursors

SECRET = secret_of(b"\x01" * 32)
WORKSPACE = "0b7f3c0e-8a43-5d7e-9a4b-6f3c2d1e0a9b"
FILTERS = '{"agent_id":"5f0c6a9e-0d4b-4c55-8f8e-3a2b1c0d9e8f","result":"denied"}'
POSITION = Position(4711, datetime(2026, 11, 21, 12, 34, 56, 789_012, tzinfo=UTC), "01" * 18)
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def sealed() -> str:
    return seal(POSITION, WORKSPACE, FILTERS, SECRET)


def changed(text: str, index: int) -> str:
    """``text`` with the character at ``index`` replaced by the base64url character whose value
    differs from it in the lowest bit only (the smallest change there is)."""
    value = ALPHABET.index(text[index])
    return text[:index] + ALPHABET[value ^ 1] + text[index + 1 :]


@pytest.mark.parametrize(
    "position",
    [
        pytest.param(POSITION, id="typical"),
        pytest.param(Position(1, datetime(2026, 1, 1, tzinfo=UTC), "a"), id="on-a-second"),
        pytest.param(
            Position(10**15, datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC), "x" * 36),
            id="before-the-epoch",
        ),
        pytest.param(
            Position(2, datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), "z"),
            id="last-instant",
        ),
        pytest.param(Position(3, datetime(1, 1, 1, tzinfo=UTC), "a"), id="first-instant"),
    ],
)
def test_a_cursor_opens_to_the_position_it_was_sealed_with(position):
    text = seal(position, WORKSPACE, FILTERS, SECRET)
    assert open_cursor(text, WORKSPACE, FILTERS, SECRET) == position
    assert len(text) <= MAX_LENGTH
    assert set(text) <= set(ALPHABET + "."), "a cursor goes into a query string as it is"


def test_the_same_position_seals_to_the_same_cursor():
    assert sealed() == sealed()


@pytest.mark.parametrize(
    "alter",
    [
        pytest.param(lambda text: changed(text, 0), id="body-first-character"),
        pytest.param(lambda text: changed(text, text.index(".") - 1), id="body-last-character"),
        pytest.param(lambda text: changed(text, text.index(".") + 1), id="tag-first-character"),
        pytest.param(lambda text: changed(text, len(text) - 1), id="tag-last-character"),
        pytest.param(lambda text: text[:-1], id="tag-shortened"),
        pytest.param(lambda text: text + "A", id="tag-lengthened"),
        pytest.param(lambda text: text[1:], id="body-shortened"),
        pytest.param(lambda text: "A" + text, id="body-lengthened"),
        pytest.param(lambda text: text.split(".")[0] + ".", id="tag-removed"),
        pytest.param(lambda text: "." + text.split(".")[1], id="body-removed"),
        pytest.param(lambda text: ".".join(reversed(text.split("."))), id="body-and-tag-swapped"),
        pytest.param(lambda text: text.replace(".", "", 1), id="dot-removed"),
        pytest.param(lambda text: text + "=", id="padding-added"),
    ],
)
def test_an_altered_cursor_is_refused(alter):
    with pytest.raises(CursorError):
        open_cursor(alter(sealed()), WORKSPACE, FILTERS, SECRET)


def test_a_cursor_changed_in_any_one_character_is_refused():
    text = sealed()
    accepted = []
    for index, character in enumerate(text):
        if character == ".":
            continue
        try:
            open_cursor(changed(text, index), WORKSPACE, FILTERS, SECRET)
        except CursorError:
            continue
        accepted.append((index, changed(text, index)))
    assert accepted == [], f"cursor {text!r}: these one-character changes were accepted"


@pytest.mark.parametrize(
    ("workspace", "filters", "secret"),
    [
        pytest.param("1c2d3e4f-0000-5000-8000-000000000000", FILTERS, SECRET, id="other-workspace"),
        pytest.param(
            WORKSPACE,
            '{"agent_id":"5f0c6a9e-0d4b-4c55-8f8e-3a2b1c0d9e8f"}',
            SECRET,
            id="fewer-filters",
        ),
        pytest.param(
            WORKSPACE, FILTERS.replace("denied", "allowed"), SECRET, id="other-filter-value"
        ),
        pytest.param(WORKSPACE, "{}", SECRET, id="no-filters"),
        pytest.param(WORKSPACE, FILTERS + " ", SECRET, id="filters-text-differs-by-a-space"),
        pytest.param(WORKSPACE, FILTERS, secret_of(b"\x02" * 32), id="other-signing-key"),
    ],
)
def test_a_cursor_opens_only_where_it_was_made(workspace, filters, secret):
    with pytest.raises(CursorError):
        open_cursor(sealed(), workspace, filters, secret)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("garbage", id="no-dot"),
        pytest.param(".", id="only-a-dot"),
        pytest.param("a.b.c", id="two-dots"),
        pytest.param("YQ==.YQ==", id="padded-base64"),
        pytest.param("WzEsMiwzLCJ4Il0.AAAAAAAAAAAAAAAAAAAAAA", id="unsigned-body"),
        pytest.param("é.é", id="not-ascii"),
        pytest.param("a b.c d", id="spaces"),
        pytest.param("A" * (MAX_LENGTH + 1), id="too-long"),
        pytest.param("A" * 400 + "." + "A" * 200, id="too-long-with-a-dot"),
        pytest.param(None, id="not-a-string"),
        pytest.param(12345, id="a-number"),
    ],
)
def test_garbage_is_refused(text):
    with pytest.raises(CursorError):
        open_cursor(text, WORKSPACE, FILTERS, SECRET)


def test_a_cursor_longer_than_the_limit_is_refused_even_when_sealed():
    long_id = "x" * MAX_LENGTH
    text = seal(Position(1, POSITION.timestamp, long_id), WORKSPACE, FILTERS, SECRET)
    assert len(text) > MAX_LENGTH
    with pytest.raises(CursorError):
        open_cursor(text, WORKSPACE, FILTERS, SECRET)
