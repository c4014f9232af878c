"""Schemathesis against the service's own ``/v1/openapi.json``: every operation, with every check
schemathesis has (server errors, status codes, content types, headers, response schemas,
schema-invalid data refused, schema-valid data accepted, missing auth refused, unsupported
methods ...), on generated valid and invalid requests, authenticated with a real admin key. A 5xx,
or any response that contradicts the document, fails the operation's test.

``AGENTAUTH_FUZZ_EXAMPLES`` sets the generated requests per operation (the default keeps the
module to a few seconds); ``AGENTAUTH_FUZZ_SEED`` the seed (default 0, so a plain ``pytest`` run
is the same every time). ``make fuzz`` runs 1000 per operation with a random seed it prints.

Each operation gets a fresh workspace holding an agent with policies, a policy and a spare key;
about half of the generated ids are pointed at these, so reads, updates and deletes also meet
objects that exist and ``/v1/authorize`` runs the policy engine.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st

from api import create_app
from core.config import Settings
from core.domain import ids
from core.domain.clock import parse_instant
from core.domain.rules import compile_regex, known_timezones

#: a public address literal: webhooks may point there; nothing is looked up or delivered
PUBLIC_URL = "https://1.1.1.1/fuzz"
_URL = re.compile(r"[Hh][Tt][Tt][Pp][Ss]?://[!-~]+")
EXAMPLES = int(os.environ.get("AGENTAUTH_FUZZ_EXAMPLES", "25"))
SEED = int(os.environ.get("AGENTAUTH_FUZZ_SEED", "0"))


# --- the two formats the document names that schemathesis does not know -------------------


def _compiles_under_re2(pattern: str) -> bool:
    try:
        compile_regex(pattern)
    except ValueError:
        return False
    return True


_ATOMS = (".", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", r"\b", r"\.", r"\*", "[a-z]", "[^0-9]")
_QUANTIFIERS = ("", "", "*", "+", "?", "*?", "{2}", "{1,3}")
_LITERAL = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=3)
_PIECE = st.builds(str.__add__, st.sampled_from(_ATOMS) | _LITERAL, st.sampled_from(_QUANTIFIERS))
_BODY = st.lists(_PIECE, max_size=6).map("".join) | st.lists(_PIECE, min_size=2, max_size=3).map(
    "|".join
)
_RE2 = st.builds(
    "{}{}{}".format, st.sampled_from(("", "^")), _BODY, st.sampled_from(("", "$"))
).filter(_compiles_under_re2)

# "re2": a pattern RE2 compiles; "iana-time-zone": a name of the tzdata package
schemathesis.openapi.format("re2", _RE2)
schemathesis.openapi.format("iana-time-zone", st.sampled_from(sorted(known_timezones())))


# --- the document, as the app serves it ----------------------------------------------------


def _load_schema() -> Any:
    """Loaded at collection, before any fixture exists, from an app that only serves the
    document (it needs no database for that); a test below checks that the apps the fixtures
    build serve the very same one."""
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {
                "max-examples": EXAMPLES,
                "database": "none",
                # the requests carry a real key (below); a generated Authorization header would
                # only be overwritten. Missing and wrong keys are still sent, by ignored_auth
                "with-security-parameters": False,
            },
        }
    )
    app = create_app(Settings(database_url="sqlite://"))
    try:
        return schemathesis.openapi.from_wsgi("/v1/openapi.json", app, config=config)
    finally:
        app.extensions["agentauth"].close()


schema = _load_schema()


# --- what the generated requests meet -----------------------------------------------------


@pytest.fixture
def world(client, admin_headers) -> Iterator[dict[str, str]]:
    """An agent with a policy holding a rule of every type, broad enough that generated tool
    names meet each of them; a decision in the audit log; a spare key; and a webhook. The
    webhooks are deleted at the end, with the deliveries escalated calls queued for them: a
    server a later test starts on the run's database would make those."""
    agent = client.post("/v1/agents", json={"name": "fuzz"}, headers=admin_headers).get_json()
    rules = [
        {"type": "tool_denylist", "tools": ["*x*"]},
        {
            "type": "parameter_constraint",
            "tools": ["*a*"],
            "parameters": {"amount": {"min": 0, "max": 100}, "iban": {"regex": "^[A-Z]{2}"}},
        },
        {"type": "time_based", "tools": ["*e*"], "timeWindow": {"allowedHours": [22, 23]}},
        {"type": "rate_limit", "rateLimit": {"maxCalls": 50, "windowSeconds": 60}},
        {"type": "require_approval", "tools": ["*q*"], "approval": {"ttlSeconds": 600}},
        {"type": "tool_allowlist"},
    ]
    body = {"agent_id": agent["id"], "name": "everything", "rules": rules}
    policy = client.post("/v1/policies", json=body, headers=admin_headers).get_json()
    check = {"agent_id": agent["id"], "tool_name": "pay.refund", "parameters": {"amount": 5}}
    assert client.post("/v1/authorize", json=check, headers=admin_headers).status_code == 200
    asks = {"agent_id": agent["id"], "tool_name": "q.exec", "parameters": {}}
    escalated = client.post("/v1/authorize", json=asks, headers=admin_headers).get_json()
    key = {"name": "spare", "scopes": ["read-only"]}
    spare = client.post("/v1/api-keys", json=key, headers=admin_headers).get_json()
    hook = {"url": PUBLIC_URL, "events": ["approval.requested"]}
    webhook = client.post("/v1/webhooks", json=hook, headers=admin_headers).get_json()
    yield {
        "agents": agent["id"],
        "policies": policy["id"],
        "api-keys": spare["id"],
        "approvals": escalated["approvalId"],
        "webhooks": webhook["id"],
    }
    while hooks := client.get("/v1/webhooks", headers=admin_headers).get_json()["data"]:
        for made in hooks:
            client.delete(f"/v1/webhooks/{made['id']}", headers=admin_headers)


def _existing(value: Any, world: dict[str, str], noun: str) -> Any:
    """About half of the well-formed ids become the id of an object that exists."""
    if isinstance(value, str) and ids.is_uuid(value) and int(value[-1], 16) % 2 == 0:
        return world[noun]
    return value


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    return value


def _future(text: Any, now: datetime) -> Any:
    """A date-time not well after ``now`` moved to a year from 2400 on with the same leap-ness
    (the year modulo 400), keeping the rest of the text as generated."""
    try:
        moment = parse_instant(text)
    except (TypeError, ValueError):
        return text
    if moment > now + timedelta(days=1) or not re.fullmatch(r"[0-9]{4}-", text[:5]):
        return text
    return f"{2400 + int(text[:4]) % 400}{text[4:]}"


def _in_order(query: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``query`` with its ``from`` not after its ``to`` (or now): the two swapped, or a ``from``
    alone after now left out. A value that is not a date-time is left as it is (invalid)."""
    found = dict(query)
    try:
        start = parse_instant(found["from"]) if "from" in found else None
        end = parse_instant(found["to"]) if "to" in found else now
    except (TypeError, ValueError):
        return found
    if start is not None and start > end:
        if "to" in found:
            found["from"], found["to"] = found["to"], found["from"]
        else:
            del found["from"]
    return found


def _fit(case: Any, world: dict[str, str], now: datetime) -> None:
    """What the document says in words but not in JSON Schema, applied to every generated
    request (valid or not; none of these edits changes whether it is): a constraint's ``min``
    is not above its ``max``; ``expiresAt`` is in the future; ``parameters`` of an
    authorization check hold no NUL at any depth (JSON Schema would need a recursive schema,
    which the contract's quick checks do not take; every named string field says it with a
    pattern). Also points ids at existing objects. Edits copies: a generated value may be
    shared with other examples; assigned back, they are checked against the document again."""
    noun = case.operation.path.split("/")[2] if case.operation.path.startswith("/v1/") else ""
    if case.query and "cursor" in case.query:
        # a cursor is a string the API gave, sealed to its walk (decisions §9): none other is
        # valid, which the document cannot say; the audit tests walk real ones
        case.query = {k: v for k, v in case.query.items() if k != "cursor"}
    if case.operation.path == "/v1/audit-logs/stats" and case.query:
        # stats hold at most 10,000 buckets, from before to: the default range (a day) does
        case.query = {k: v for k, v in case.query.items() if k not in ("from", "to")}
    if case.operation.path.endswith("/shadow-report") and case.query:
        # from is not after to (now, when not given), which the document says in words
        case.query = _in_order(case.query, now)
    if case.path_parameters and "id" in case.path_parameters:
        wanted = _existing(case.path_parameters["id"], world, noun)
        if wanted != case.path_parameters["id"]:
            case.path_parameters = {**case.path_parameters, "id": wanted}
    if not isinstance(case.body, dict):
        return
    body = copy.deepcopy(case.body)
    if "agent_id" in body:
        body["agent_id"] = _existing(body["agent_id"], world, "agents")
    if case.operation.path == "/v1/webhooks" and _is_url(body.get("url")):
        body["url"] = PUBLIC_URL  # valid stays valid, and taken without a DNS lookup
    if "expiresAt" in body:
        body["expiresAt"] = _future(body["expiresAt"], now)
    if case.operation.path == "/v1/authorize" and "parameters" in body:
        body["parameters"] = _without_nul(body["parameters"])
    rules = body.get("rules")
    for rule in rules if isinstance(rules, list) else []:
        parameters = rule.get("parameters") if isinstance(rule, dict) else None
        for constraint in parameters.values() if isinstance(parameters, dict) else []:
            if isinstance(constraint, dict):
                low, high = constraint.get("min"), constraint.get("max")
                if _is_number(low) and _is_number(high) and low > high:
                    constraint["min"], constraint["max"] = high, low
    if body != case.body:
        case.body = body


def _is_url(value: Any) -> bool:
    """A url the document takes (that its host must resolve to a public address, JSON Schema
    cannot say)."""
    return isinstance(value, str) and len(value) <= 2048 and bool(_URL.fullmatch(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@schema.parametrize()
@hypothesis.settings(
    # one app and workspace per operation, shared by its examples on purpose (state builds up);
    # and no verdict may depend on how fast a loaded machine generates data
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
def test_every_response_agrees_with_the_document(case, app, clock, admin_headers, world):
    _fit(case, world, clock.moment)
    response = case.call_and_validate(app=app, headers=admin_headers)
    stored = response.request.method in ("POST", "PATCH") and response.status_code in (200, 201)
    if stored and case.operation.path.startswith("/v1/policies"):
        _decide_under(response.json(), app, admin_headers)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # never in a tool name


def _decide_under(policy: dict[str, Any], app: Any, headers: dict[str, str]) -> None:
    """A policy the fuzzer got stored goes through the engine at once: authorization checks for
    tools its rules name, with parameters its constraints name (at most 10 a rule, so never
    past the 1000 a check takes), answered as documented."""
    tools: list[str] = []
    parameters: dict[str, Any] = {}
    for rule in policy["rules"]:
        tools += [
            _CONTROL.sub("", tool.replace("*", "x").replace("?", "y"))
            for tool in rule.get("tools", [])
        ]
        for name, constraint in list(rule.get("parameters", {}).items())[:10]:
            enum, low, high = constraint.get("enum"), constraint.get("min"), constraint.get("max")
            parameters[name] = (
                enum[0] if enum else next((b for b in (low, high) if b is not None), "")
            )
    operation = schema["/v1/authorize"]["POST"]
    for tool in [tool for tool in tools if tool][:3] or ["any.tool"]:
        body = {"agent_id": policy["agentId"], "tool_name": tool, "parameters": parameters}
        check = operation.Case(body=body, media_type="application/json")
        check.call_and_validate(app=app, headers=headers)


def test_the_document_fuzzed_is_the_one_the_app_serves(client):
    assert client.get("/v1/openapi.json").get_json() == schema.raw_schema
