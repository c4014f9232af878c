"""Reading request input: JSON bodies (strict: UTF-8, no duplicate keys, no NaN, bounded
depth, no NUL or lone surrogates, an object at the top) checked against the schema contract,
and query strings (known names only, each once, paging bounds)."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import IO, Any, cast

import flask
from flask import request
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from api.context import body_arrived
from core.domain.clock import parse_instant
from core.domain.errors import ValidationError
from core.domain.redaction import HOLDS_A_KEY, key_places, scrub
from core.domain.validation import require_uuid, require_valid
from schemas import format_path

MAX_DEPTH = 64
_DIGITS = re.compile(r"[0-9]{1,10}")
MAX_OFFSET = 2_147_483_647


class Request(flask.Request):
    """Flask's request, with a body of no announced length (chunked) held to the limit the way
    one with a ``Content-Length`` is: 413 once it runs past ``MAX_CONTENT_LENGTH``. (Werkzeug
    stops reading such a body at the limit and hands over what it read, so a body cut at 1 MiB
    could pass for a whole one.)"""

    @cached_property
    def stream(self) -> IO[bytes]:
        limit = self.max_content_length
        terminated = "wsgi.input_terminated" in self.environ  # the server ends the stream
        if self.content_length is None and terminated and limit is not None:
            return cast(IO[bytes], _Capped(self.environ["wsgi.input"], limit))
        return super().stream


class _Capped(io.RawIOBase):
    """A stream that raises 413 when more than ``limit`` bytes come out of ``source``."""

    def __init__(self, source: IO[bytes], limit: int) -> None:
        self._source = source
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        # one byte past the limit is asked for, so that a body of exactly the limit ends here
        want = min(len(buffer), self._left + 1)
        try:
            data = self._source.read(want)
        except Exception as exc:  # the server's own: a malformed chunk, the client gone
            raise BadRequest(f"the request body could not be read ({type(exc).__name__})") from None
        if len(data) > self._left:
            raise RequestEntityTooLarge()
        self._left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def read_body(ref: str, *, optional: bool = False) -> dict[str, Any]:
    """The request body as a dict valid against schema ``ref``, or ValidationError; with
    ``optional``, no body at all is ``{}``. From here on the request's instant is the moment
    its body was complete (:func:`api.context.body_arrived`)."""
    raw = body_bytes(request, optional=optional)
    body_arrived()
    if optional and not raw:
        return {}
    return parse_body(raw, ref)


def body_bytes(req: flask.Request, *, optional: bool = False) -> bytes:
    """The body of ``req``, whole, which must be JSON (refused by its Content-Type before it is
    read, unless ``optional`` and empty); Werkzeug's 413 past the body limit, 400 when the
    client sends less than it announced."""
    json_type = req.mimetype == "application/json" or req.mimetype.endswith("+json")
    if not json_type and not optional:  # refused before the body is read
        raise ValidationError.field("body", _NOT_JSON)
    raw = req.get_data(cache=True)
    if raw and not json_type:
        raise ValidationError.field("body", _NOT_JSON)
    return raw


_NOT_JSON = "Content-Type must be application/json"


#: bodies whose strings may hold an API key of this service, masked where they are stored: a
#: tool call is decided and audited whatever it holds (a refusal would leave the attempt out
#: of the audit log), and a person's decision on an approval is not refused for its comment
MASKED = frozenset({"authorize.json#/$defs/request", "approval.json#/$defs/decide"})


def parse_body(raw: bytes, ref: str) -> dict[str, Any]:
    """Body bytes as a dict valid against schema ``ref``, or ValidationError. A string that
    holds an API key of this service is refused (but in a tool call, see MASKED): what a body
    says is stored and shown again, in answers, lists and logs, and a key must never be."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError.field("body", "is not valid UTF-8") from None
    body = require_valid(ref, parse_json(text))
    if ref not in MASKED:  # walked whatever the text says: a JSON escape can spell a key
        places = key_places(body)
        if places:
            raise ValidationError.field(format_path(places[0]), HOLDS_A_KEY)
    return body


def parse_json(text: str) -> Any:
    """Strict JSON: ValidationError for anything a lenient parser would let through."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except RecursionError:
        raise ValidationError.field("body", f"is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ValidationError.field("body", f"is not valid JSON: {_reason(exc)}") from None
    _check_values(value)
    if not isinstance(value, dict):
        raise ValidationError.field("body", "must be a JSON object")
    return value


def _reason(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)[:200]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # masked before it is cut: a key cut short would escape the error body's scrub
            raise ValueError(f"duplicate key {scrub(key)[:64]!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_values(value: Any) -> None:
    """Depth, NUL characters, lone surrogates and infinite numbers, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValidationError.field("body", f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                _check_string(key)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            _check_string(item)
        elif isinstance(item, float) and item in (float("inf"), float("-inf")):
            raise ValidationError.field("body", "holds a number too large to represent")


def _check_string(text: str) -> None:
    if "\x00" in text:
        raise ValidationError.field("body", "strings must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError.field("body", "strings must not contain lone surrogates") from None


def read_query() -> dict[str, str]:
    """Query parameters by name; names the view does not take (``api.auth.takes_query``) and
    repeated names were already refused."""
    return request.args.to_dict()


def read_paging(query: dict[str, str], max_limit: int, default: int = 100) -> tuple[int, int]:
    """``(limit, offset)`` with limit in 1..max_limit and offset >= 0."""
    limit = _whole(query, "limit", default)
    if not 1 <= limit <= max_limit:
        raise ValidationError.field("limit", f"must be between 1 and {max_limit}")
    offset = _whole(query, "offset", 0)
    if offset > MAX_OFFSET:
        raise ValidationError.field("offset", f"must be at most {MAX_OFFSET}")
    return limit, offset


#: the largest whole number a query parameter takes (ten digits)
WHOLE_NUMBER_MAX = 9_999_999_999


def whole_number(query: dict[str, str], name: str, minimum: int = 0) -> int | None:
    """An optional whole-number query parameter of at least ``minimum``; None when absent."""
    raw = query.get(name)
    if raw is None:
        return None
    if raw.isascii() and raw.isdigit() and len(raw) > 10:
        raise ValidationError.field(name, f"must be at most {WHOLE_NUMBER_MAX}")
    value = _whole(query, name, 0)
    if value < minimum:
        raise ValidationError.field(name, f"must be a whole number from {minimum}")
    return value


def _whole(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw):
        raise ValidationError.field(name, "must be a whole number")
    return int(raw)


def path_id(value: str, field: str = "id") -> str:
    """A UUID from the URL path: malformed is 400, well-formed but unknown is the caller's 404."""
    return require_uuid(value, field)


def read_instant(query: dict[str, str], name: str) -> datetime | None:
    """The query's ISO 8601 date-time ``name`` (None when not given); 400 when it is not one."""
    raw = query.get(name)
    if raw is None:
        return None
    try:
        return parse_instant(raw)
    except ValueError:
        raise ValidationError.field(name, "must be an ISO 8601 date-time") from None


def back_from(moment: datetime, span: timedelta) -> datetime:
    """``span`` before ``moment``, or the first instant a datetime holds when that is before it
    (a range's default start, for a ``to`` near year 1)."""
    try:
        return moment - span
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)
