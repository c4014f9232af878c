"""In-process decisions per second: our engine against pycasbin and cedarpy, same policy.

One agent holds 10 policies of 5 rules each (tool globs, regex, enum and min/max constraints,
time windows in three zones, denylists and allowlists). :data:`POLICIES` is written once in our
rule format; :func:`to_cedar` and :func:`to_casbin` translate it mechanically, so the three
engines evaluate the same policy, not three hand-written approximations. Before anything is
timed, every request of :data:`REQUESTS` must get the same answer from all three (allowed or
denied, and the deciding policy wherever the engine reports it); a mismatch stops the bench.

What the other engines cannot express, and how the translation copes (README has the list):

- Priority / first-decider order (decisions §1). Cedar has none (any ``forbid`` beats every
  ``permit``), so each policy with an allowlist becomes one ``permit`` whose ``unless`` holds the
  deny conditions of that policy and of every higher-priority one. pycasbin has it natively:
  ``priority(p.eft) || deny`` with the deny lines of a policy ranked before its allow lines.
- Regex: Cedar has only ``like`` with ``*``; a pattern is translated when it is a prefix /
  suffix / whole-string alternation of literals (every regex used here is), otherwise refused.
  pycasbin's ``regexMatch`` is Python ``re.match`` (anchored), so the pattern is prefixed with
  ``(?s:.*?)`` to make it the unanchored search RE2 does.
- Time windows: neither has a clock or time zones. The caller passes the hour and weekday in
  each zone the policies use (computed before timing starts, so it costs them nothing here).
- Type checks ("a finite number", "a string"): Cedar reports a type error, which makes the
  permit not apply (deny, as ours); pycasbin has no type predicates, so two one-line functions
  (``isNumber``, ``isString``) are registered with it.
- Numbers: Cedar has 64-bit integers only, so bounds and values are integers.
- Globs: casbin's ``globMatch`` stops ``*`` at ``/`` and reads ``[...]`` as a class; no tool
  name or pattern here holds either.
- Rate limits: left out of all three (Cedar and casbin keep no counters; ours would write one).
"""

from __future__ import annotations

import importlib
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from core.domain.compiler import compile_policy
from core.domain.engine import CompiledPolicy, Decision, evaluate, order_policies

AGENT = "ops-assistant"
CREATED = datetime(2025, 1, 1, tzinfo=UTC)
HOURS_8_18 = list(range(8, 19))
WEEKDAYS = [1, 2, 3, 4, 5]  # allowedDays counts Sunday as 0


def _policy(name: str, priority: int, *rules: dict[str, Any]) -> dict[str, Any]:
    assert len(rules) == 5, name
    return {"name": name, "priority": priority, "rules": list(rules)}


def _allow(*tools: str) -> dict[str, Any]:
    return {"type": "tool_allowlist", "tools": list(tools)}


def _deny(*tools: str) -> dict[str, Any]:
    return {"type": "tool_denylist", "tools": list(tools)}


def _params(tools: list[str], **parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "parameter_constraint", "tools": tools, "parameters": parameters}


def _window(tools: list[str], **window: Any) -> dict[str, Any]:
    return {"type": "time_based", "tools": tools, "timeWindow": window}


POLICIES: list[dict[str, Any]] = [
    _policy(
        "guardrails",
        1000,
        _deny("shell.*", "*.delete"),
        _deny("payments.transfer", "admin.*"),
        _params(["fs.*"], path={"regex": "^/(srv/app|var/data)/"}),
        _params(["http.*"], url={"regex": "^https://"}),
        _window(
            ["deploy.*"], allowedHours=HOURS_8_18, allowedDays=WEEKDAYS, timezone="Europe/Berlin"
        ),
    ),
    _policy(
        "read-only",
        900,
        _allow("fs.read", "fs.list", "search.*"),
        _params(["search.*"], limit={"min": 1, "max": 50}),
        _params(["fs.read"], encoding={"enum": ["utf-8", "ascii", "latin-1"]}),
        _deny("search.hr.*", "search.*.private"),
        _window(["search.web"], allowedDays=WEEKDAYS),
    ),
    _policy(
        "payments",
        800,
        _allow("payments.refund", "payments.quote"),
        _params(
            ["payments.*"], amount={"min": 1, "max": 500}, currency={"enum": ["USD", "EUR", "GBP"]}
        ),
        _params(["payments.refund"], order_id={"regex": "^ord_"}),
        _window(["payments.refund"], allowedHours=list(range(9, 18)), timezone="America/New_York"),
        _deny("payments.chargeback"),
    ),
    _policy(
        "mail",
        700,
        _allow("mail.send", "mail.draft"),
        _params(["mail.send"], to={"regex": "@example\\.com$"}),
        _params(["mail.*"], priority={"enum": ["low", "normal"]}),
        _deny("mail.forward"),
        _window(["mail.send"], allowedHours=list(range(7, 21)), timezone="Europe/Berlin"),
    ),
    _policy(
        "tickets",
        600,
        _allow("tickets.*"),
        _params(["tickets.update", "tickets.close"], ticket={"regex": "^(OPS|SUP)-"}),
        _params(["tickets.comment"], visibility={"enum": ["internal", "public"]}),
        _deny("tickets.bulk_*"),
        _params(["tickets.reassign"], level={"min": 1, "max": 3}),
    ),
    _policy(
        "deploy",
        500,
        _allow("deploy.staging", "deploy.status"),
        _params(["deploy.staging"], replicas={"min": 1, "max": 10}),
        _params(["deploy.*"], env={"enum": ["staging", "dev"]}),
        _deny("deploy.production"),
        _window(["deploy.staging"], allowedDays=WEEKDAYS),
    ),
    _policy(
        "database",
        400,
        _allow("db.query", "db.explain"),
        _params(["db.query"], sql={"regex": "^(SELECT|WITH) "}),
        _params(["db.*"], max_rows={"max": 1000}),
        _deny("db.write", "db.migrate"),
        _params(["db.*"], database={"enum": ["analytics", "reporting"]}),
    ),
    _policy(
        "http",
        300,
        _allow("http.get", "http.head"),
        _params(["http.*"], timeout_ms={"min": 100, "max": 30000}),
        _params(["http.get"], url={"regex": "^https://(api|docs)\\.example\\.com/"}),
        _deny("http.post", "http.put"),
        _deny("*.internal"),
    ),
    _policy(
        "calendar",
        200,
        _allow("calendar.*"),
        _params(["calendar.create"], duration_min={"min": 15, "max": 240}),
        _params(["calendar.create", "calendar.update"], visibility={"enum": ["private", "team"]}),
        _window(["calendar.*"], allowedHours=list(range(6, 23)), timezone="America/New_York"),
        _deny("calendar.share_external"),
    ),
    _policy(
        "fallback",
        100,
        _deny("*.admin", "*.sudo"),
        _allow("status.*", "help"),
        _params(["status.*"], verbose={"enum": ["yes", "no"]}),
        _window(["help"], allowedDays=[0, 1, 2, 3, 4, 5, 6]),
        _allow("echo"),
    ),
]

WORKDAY = datetime(2025, 3, 12, 14, 30, tzinfo=UTC)  # Wednesday: 15:30 Berlin, 10:30 New York
EVENING = datetime(2025, 3, 12, 23, 30, tzinfo=UTC)  # 00:30 Thursday Berlin, 19:30 New York
SATURDAY = datetime(2025, 3, 15, 12, 0, tzinfo=UTC)
SMALL_HOURS = datetime(2025, 3, 13, 5, 0, tzinfo=UTC)  # 01:00 New York


@dataclass(frozen=True)
class Request:
    tool: str
    params: dict[str, Any]
    now: datetime
    expect: str  # "allow <policy>", "deny <policy>" or "deny" (default deny): checked too


_REFUND = {"amount": 120, "currency": "EUR", "order_id": "ord_123"}
_DB = {"sql": "SELECT 1", "max_rows": 100, "database": "analytics"}

REQUESTS: list[Request] = [
    Request(
        "fs.read", {"path": "/srv/app/config.yaml", "encoding": "utf-8"}, WORKDAY, "allow read-only"
    ),
    Request("fs.read", {"path": "/etc/passwd", "encoding": "utf-8"}, WORKDAY, "deny guardrails"),
    Request("fs.list", {"path": "/var/data/out.csv"}, WORKDAY, "allow read-only"),
    Request("fs.delete", {"path": "/var/data/out.csv"}, WORKDAY, "deny guardrails"),
    Request("shell.exec", {"cmd": "ls"}, WORKDAY, "deny guardrails"),
    Request("search.web", {"query": "release notes", "limit": 10}, WORKDAY, "allow read-only"),
    Request("search.web", {"query": "release notes", "limit": 10}, SATURDAY, "deny read-only"),
    Request("search.docs", {"limit": 500}, WORKDAY, "deny read-only"),
    Request("search.hr.salaries", {"limit": 5}, WORKDAY, "deny read-only"),
    Request("search.team.private", {"limit": 5}, WORKDAY, "deny read-only"),
    Request("payments.refund", _REFUND, WORKDAY, "allow payments"),
    Request("payments.refund", {**_REFUND, "amount": 900}, WORKDAY, "deny payments"),
    Request("payments.refund", _REFUND, EVENING, "deny payments"),
    Request("payments.refund", {**_REFUND, "amount": "120"}, WORKDAY, "deny payments"),
    Request("payments.quote", {"amount": 40, "currency": "GBP"}, EVENING, "allow payments"),
    Request("payments.transfer", {"amount": 5}, WORKDAY, "deny guardrails"),
    Request("mail.send", {"to": "bob@example.com", "priority": "normal"}, WORKDAY, "allow mail"),
    Request("mail.send", {"to": "eve@evil.test", "priority": "normal"}, WORKDAY, "deny mail"),
    Request("mail.draft", {"priority": "urgent"}, WORKDAY, "deny mail"),
    Request("mail.forward", {"priority": "low"}, WORKDAY, "deny mail"),
    Request("tickets.update", {"ticket": "OPS-42"}, WORKDAY, "allow tickets"),
    Request("tickets.update", {"ticket": "HR-7"}, WORKDAY, "deny tickets"),
    Request("tickets.bulk_close", {}, WORKDAY, "deny tickets"),
    Request("tickets.reassign", {"level": 2}, SATURDAY, "allow tickets"),
    Request("deploy.staging", {"replicas": 3, "env": "staging"}, WORKDAY, "allow deploy"),
    Request("deploy.staging", {"replicas": 3, "env": "staging"}, SATURDAY, "deny guardrails"),
    Request("deploy.production", {"env": "prod"}, WORKDAY, "deny deploy"),
    Request("db.query", _DB, WORKDAY, "allow database"),
    Request("db.query", {**_DB, "sql": "DROP TABLE users"}, WORKDAY, "deny database"),
    Request("db.query", {**_DB, "max_rows": 5000}, WORKDAY, "deny database"),
    Request("db.write", {"database": "analytics"}, WORKDAY, "deny database"),
    Request(
        "http.get",
        {"url": "https://api.example.com/v1/items", "timeout_ms": 2000},
        WORKDAY,
        "allow http",
    ),
    Request(
        "http.get",
        {"url": "http://api.example.com/", "timeout_ms": 2000},
        WORKDAY,
        "deny guardrails",
    ),
    Request("http.get", {"url": "https://evil.test/", "timeout_ms": 2000}, WORKDAY, "deny http"),
    Request(
        "http.post", {"url": "https://api.example.com/", "timeout_ms": 2000}, WORKDAY, "deny http"
    ),
    Request(
        "calendar.create", {"duration_min": 30, "visibility": "team"}, WORKDAY, "allow calendar"
    ),
    Request(
        "calendar.create", {"duration_min": 30, "visibility": "team"}, SMALL_HOURS, "deny calendar"
    ),
    Request("calendar.admin", {}, WORKDAY, "allow calendar"),  # above fallback's *.admin deny
    Request("metrics.admin", {}, WORKDAY, "deny fallback"),
    Request("status.health", {"verbose": "no"}, WORKDAY, "allow fallback"),
    Request("help", {}, SATURDAY, "allow fallback"),
    Request("echo", {"text": "hi"}, WORKDAY, "allow fallback"),
    Request("unknown.tool", {}, WORKDAY, "deny"),
]


# --------------------------------------------------------------------------------- ours


def compile_ours(policies: Sequence[dict[str, Any]]) -> list[CompiledPolicy]:
    """What the API's policy cache holds for the agent: compiled once, in evaluation order."""
    return order_policies(
        compile_policy(
            id=p["name"],
            name=p["name"],
            priority=p["priority"],
            enabled=True,
            created_at=CREATED,
            rules=p["rules"],
        )
        for p in policies
    )


# -------------------------------------------------------------------------------- cedar


def _cedar_str(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Cedar string literal


def _like_escape(literal: str) -> str:
    """Text matched literally inside a Cedar ``like`` pattern."""
    return literal.replace("\\", "\\\\").replace('"', '\\"').replace("*", "\\*")


def _like(pattern: str) -> str:
    """Our glob as a Cedar ``like`` pattern: ``*`` is the wildcard in both; ``?`` has no
    counterpart in Cedar."""
    if "?" in pattern:
        raise ValueError(f"Cedar's like has no '?': cannot express tool pattern {pattern!r}")
    return '"' + "*".join(_like_escape(part) for part in pattern.split("*")) + '"'


def _cedar_tools(tools: Sequence[str] | None) -> str:
    if tools is None or "*" in tools:
        return "true"
    parts = [
        f"context.tool like {_like(t)}" if "*" in t else f"context.tool == {_cedar_str(t)}"
        for t in tools
    ]
    return "(" + " || ".join(parts) + ")"


_META = set(".^$*+?()[]{}|\\")


def _regex_literal(text: str, pattern: str) -> str:
    """The string a run of regex literals matches; ValueError on any other construct."""
    out, chars = [], iter(text)
    for char in chars:
        if char == "\\":
            char = next(chars, "")
            if not char or char.isalnum():  # \d, \w, \b... are classes, not literals
                raise ValueError(f"Cedar has no regular expressions: cannot express {pattern!r}")
        elif char in _META:
            raise ValueError(f"Cedar has no regular expressions: cannot express {pattern!r}")
        out.append(char)
    return "".join(out)


def regex_alternatives(pattern: str) -> tuple[bool, list[str], bool]:
    """``(anchored_start, literal alternatives, anchored_end)`` for a regex made of literals and
    at most one ``(a|b|...)`` group of literals; ValueError for anything else, which Cedar's
    ``like`` could not express."""
    body = pattern
    start = body.startswith("^")
    body = body[1:] if start else body
    end = body.endswith("$") and not body.endswith("\\$")
    body = body[:-1] if end else body
    group = re.fullmatch(r"(?P<head>[^()]*)(?:\((?P<alts>[^()]*)\)(?P<tail>[^()]*))?", body)
    if group is None:
        raise ValueError(f"Cedar has no regular expressions: cannot express {pattern!r}")
    head = _regex_literal(group["head"], pattern)
    if group["alts"] is None:
        return start, [head], end
    tail = _regex_literal(group["tail"], pattern)
    alternatives = [head + _regex_literal(alt, pattern) + tail for alt in group["alts"].split("|")]
    return start, alternatives, end


def _cedar_regex(value: str, pattern: str) -> str:
    start, alternatives, end = regex_alternatives(pattern)
    likes = []
    for literal in alternatives:
        like = ("" if start else "*") + _like_escape(literal) + ("" if end else "*")
        likes.append(f'{value} like "{like}"')
    return "(" + " || ".join(likes) + ")"


def _cedar_number(bound: Any) -> str:
    if not isinstance(bound, int) or isinstance(bound, bool):
        raise ValueError(f"Cedar has integers only: cannot express bound {bound!r}")
    return str(bound)


def _cedar_constraint(name: str, spec: dict[str, Any]) -> str:
    value = f"context.params[{_cedar_str(name)}]"
    holds = [f"context.params has {_cedar_str(name)}"]
    if "regex" in spec:
        holds.append(_cedar_regex(value, spec["regex"]))
    if "enum" in spec:
        holds.append(f"[{', '.join(_cedar_str(v) for v in spec['enum'])}].contains({value})")
    if "min" in spec:
        holds.append(f"{value} >= {_cedar_number(spec['min'])}")
    if "max" in spec:
        holds.append(f"{value} <= {_cedar_number(spec['max'])}")
    return "(" + " && ".join(holds) + ")"


def _zone_key(zone: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", zone)


def _cedar_window(window: dict[str, Any]) -> str:
    clock = f"context.clock.{_zone_key(window.get('timezone', 'UTC'))}"
    holds = []
    if "allowedHours" in window:
        holds.append(f"{sorted(window['allowedHours'])}.contains({clock}.hour)")
    if "allowedDays" in window:
        holds.append(f"{sorted(window['allowedDays'])}.contains({clock}.day)")
    return "(" + " && ".join(holds) + ")"


def deny_condition(
    rule: dict[str, Any],
    tools: Callable[[Sequence[str] | None], str],
    constraint: Callable[[str, dict[str, Any]], str],
    window: Callable[[dict[str, Any]], str],
) -> str | None:
    """The condition under which ``rule`` denies, or None for an allowlist, in a target
    language given by its three translations (Cedar here, CEL in bench/cerbos.py)."""
    scope = tools(rule.get("tools"))
    kind = rule["type"]
    if kind == "tool_allowlist":
        return None
    if kind == "tool_denylist":
        return scope
    if kind == "parameter_constraint":
        holds = " && ".join(constraint(n, s) for n, s in rule["parameters"].items())
        return f"({scope} && !({holds}))"
    if kind == "time_based":
        return f"({scope} && !{window(rule['timeWindow'])})"
    raise ValueError(f"{kind} rules are left out of the comparison")


def _cedar_denies(rule: dict[str, Any]) -> str | None:
    return deny_condition(rule, _cedar_tools, _cedar_constraint, _cedar_window)


def to_cedar(policies: Sequence[dict[str, Any]]) -> str:
    """Cedar policy text: one ``permit`` per allowlist rule, whose ``unless`` carries every deny
    condition of its own policy and of all higher-priority ones (Cedar has no priorities)."""
    ordered = sorted(policies, key=lambda p: -p["priority"])
    out: list[str] = []
    denies_so_far: list[str] = []
    principal = f"principal == Agent::{_cedar_str(AGENT)}"
    for policy in ordered:
        rules = policy["rules"]
        denies_so_far += [d for d in map(_cedar_denies, rules) if d is not None]
        unless = " ||\n    ".join(denies_so_far) or "false"
        for index, rule in enumerate(rules):
            if rule["type"] != "tool_allowlist":
                continue
            out.append(
                f'@id("{policy["name"]}#{index}")\n'
                f'permit ({principal}, action == Action::"call", resource)\n'
                f"  when {{ {_cedar_tools(rule.get('tools'))} }}\n"
                f"  unless {{\n    {unless}\n  }};\n"
            )
    return "\n".join(out)


def clock_context(now: datetime, zones: Sequence[str]) -> dict[str, dict[str, int]]:
    """Hour and weekday (Sunday 0) of ``now`` in each zone: the clock the caller supplies."""
    out = {}
    for zone in zones:
        local = now.astimezone(UTC if zone == "UTC" else ZoneInfo(zone))
        out[_zone_key(zone)] = {"hour": local.hour, "day": (local.weekday() + 1) % 7}
    return out


def policy_zones(policies: Sequence[dict[str, Any]]) -> list[str]:
    zones = {
        rule["timeWindow"].get("timezone", "UTC")
        for p in policies
        for rule in p["rules"]
        if rule["type"] == "time_based"
    }
    return sorted(zones)


def cedar_request(request: Request, zones: Sequence[str]) -> dict[str, Any]:
    context = {
        "tool": request.tool,
        "params": request.params,
        "clock": clock_context(request.now, zones),
    }
    return {
        "principal": {"type": "Agent", "id": AGENT},
        "action": {"type": "Action", "id": "call"},
        "resource": {"type": "Tool", "id": request.tool},
        "context": json.dumps(context),  # pre-serialised: cedarpy would json.dumps a dict itself
    }


# ------------------------------------------------------------------------------- casbin

CASBIN_MODEL = """
[request_definition]
r = agent, tool, params, clock

[policy_definition]
p = priority, agent, tool, cond, eft

[policy_effect]
e = priority(p.eft) || deny

[matchers]
m = r.agent == p.agent && globMatch(r.tool, p.tool) && eval(p.cond)
"""


def _py(value: Any) -> str:
    """A literal for a casbin condition. casbin rewrites ``p.``/``r.``, ``!``, ``&&`` and
    ``||`` anywhere in the text, literals included, so literals holding them are refused."""
    text = repr(value)
    if re.search(r"\b[pr]\d*\.|!|&&|\|\|", text):
        raise ValueError(f"casbin would rewrite the literal {text}")
    return text


def _searching(pattern: str) -> str:
    """For ``re.match`` (casbin's regexMatch), the unanchored search RE2 does; a final ``$``
    becomes ``\\Z`` because Python's ``$`` also matches before a trailing newline, RE2's not."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return "(?s:.*?)(?:" + pattern + ")"


def _casbin_constraint(name: str, spec: dict[str, Any]) -> str:
    value = f"r.params[{_py(name)}]"
    holds = [f"{_py(name)} in r.params"]
    if "regex" in spec:
        # regexMatch is re.match (anchored at the start); RE2 here searches, as JSON Schema does
        holds += [f"isString({value})", f"regexMatch({value}, {_py(_searching(spec['regex']))})"]
    if "enum" in spec:
        holds.append(f"isString({value}) and {value} in {_py(tuple(spec['enum']))}")
    if "min" in spec or "max" in spec:
        holds.append(f"isNumber({value})")
    if "min" in spec:
        holds.append(f"{value} >= {_py(spec['min'])}")
    if "max" in spec:
        holds.append(f"{value} <= {_py(spec['max'])}")
    return "(" + " and ".join(holds) + ")"


def _casbin_cond(rule: dict[str, Any]) -> tuple[str, str]:
    """``(condition, effect)`` of a rule, for the lines of each of its tool patterns."""
    kind = rule["type"]
    if kind == "tool_allowlist":
        return "True", "allow"
    if kind == "tool_denylist":
        return "True", "deny"
    if kind == "parameter_constraint":
        holds = " and ".join(_casbin_constraint(n, s) for n, s in rule["parameters"].items())
        return f"not ({holds})", "deny"
    if kind == "time_based":
        window = rule["timeWindow"]
        clock = f"r.clock[{_py(_zone_key(window.get('timezone', 'UTC')))}]"
        inside = []
        if "allowedHours" in window:
            inside.append(f"{clock}['hour'] in {_py(tuple(sorted(window['allowedHours'])))}")
        if "allowedDays" in window:
            inside.append(f"{clock}['day'] in {_py(tuple(sorted(window['allowedDays'])))}")
        return f"not ({' and '.join(inside)})", "deny"
    raise ValueError(f"{kind} rules are left out of the comparison")


def to_casbin(policies: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Policy lines ``[priority, agent, tool glob, condition, effect]``. Priority ranks policies
    (higher first) and, inside one, deny lines before allow lines: casbin's priority effect lets
    the first matching line decide, which is decisions §1."""
    lines = []
    ordered = sorted(policies, key=lambda p: -p["priority"])
    for rank, policy in enumerate(ordered):
        for rule in policy["rules"]:
            cond, effect = _casbin_cond(rule)
            for tool in rule.get("tools") or ["*"]:
                if re.search(r"[/\[\\?]", tool):
                    raise ValueError(f"casbin's globMatch reads {tool!r} differently")
                priority = rank * 2 + (1 if effect == "allow" else 0)
                lines.append([str(priority), AGENT, tool, cond, effect])
    return lines


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def casbin_enforcer(policies: Sequence[dict[str, Any]]) -> Any:
    casbin = importlib.import_module("casbin")  # untyped: Any to mypy

    model = casbin.Model()
    model.load_model_from_text(CASBIN_MODEL)
    enforcer = casbin.Enforcer(model, enable_log=False)
    enforcer.add_function("isNumber", _is_number)
    enforcer.add_function("isString", _is_string)
    for line in to_casbin(policies):
        enforcer.add_policy(*line)
    enforcer.model.sort_policies_by_priority()
    return enforcer


# ---------------------------------------------------------------------------- agreement


@dataclass
class Engines:
    """The three engines, each with its request list prepared the way it takes requests."""

    ours: list[CompiledPolicy]
    cedar_policies: Any
    cedar_entities: Any
    cedar_requests: list[dict[str, Any]]
    casbin: Any
    casbin_requests: list[tuple[Any, ...]]
    casbin_rank_names: list[str]


def build_engines(policies: Sequence[dict[str, Any]], requests: Sequence[Request]) -> Engines:
    import cedarpy

    zones = policy_zones(policies)
    ranked = [p["name"] for p in sorted(policies, key=lambda p: -p["priority"])]
    return Engines(
        ours=compile_ours(policies),
        cedar_policies=cedarpy.PolicySet.from_str(to_cedar(policies)),
        cedar_entities=cedarpy.Entities.from_json_str("[]"),
        cedar_requests=[cedar_request(r, zones) for r in requests],
        casbin=casbin_enforcer(policies),
        casbin_requests=[(AGENT, r.tool, r.params, clock_context(r.now, zones)) for r in requests],
        casbin_rank_names=ranked,
    )


def _outcome_label(allowed: bool, policy: str | None) -> str:
    return ("allow" if allowed else "deny") + (f" {policy}" if policy else "")


def check_agreement(
    engines: Engines, policies: Sequence[dict[str, Any]], requests: Sequence[Request]
) -> list[str]:
    """Every policy the API would refuse, and every disagreement between the engines (and with
    each request's expectation)."""
    import cedarpy

    from core.domain.validation import problems_of

    problems = [
        f"policy {p['name']!r} would be refused by the API: {problem}"
        for p in policies
        for problem in problems_of("policy.json#/$defs/update", {"rules": p["rules"]})
    ]
    cedar_results = cedarpy.is_authorized_batch(
        engines.cedar_requests, engines.cedar_policies, engines.cedar_entities
    )
    for index, request in enumerate(requests):
        decision = evaluate(engines.ours, request.tool, request.params, request.now)
        if not isinstance(decision, Decision):  # no rate_limit rule in the mix: never pending
            problems.append(f"{request.tool}: a grant pending on rate limits")
            continue
        ours = _outcome_label(decision.allowed, decision.policy_id)
        allowed, line = engines.casbin.enforce_ex(*engines.casbin_requests[index])
        casbin_policy = engines.casbin_rank_names[int(line[0]) // 2] if line else None
        casbin = _outcome_label(allowed, casbin_policy)
        result = cedar_results[index]
        if result.diagnostics.errors and result.allowed:
            problems.append(f"{request.tool}: cedar allowed despite errors")
        reasons = result.diagnostics.id_annotations_by_reason.values()
        permits = sorted(
            reasons, key=lambda ident: engines.casbin_rank_names.index(ident.split("#")[0])
        )
        # Cedar names the permits that apply; the first by priority is the deciding policy.
        # It names nothing for a deny, so a deny is compared on the outcome only.
        cedar = _outcome_label(result.allowed, permits[0].split("#")[0] if permits else None)
        expected_cedar = ours if decision.allowed else "deny"
        if not (ours == request.expect == casbin and cedar == expected_cedar):
            problems.append(
                f"{request.tool} {json.dumps(request.params)} at {request.now:%a %H:%M}Z: "
                f"expected {request.expect!r}; ours {ours!r}, casbin {casbin!r}, cedar {cedar!r}"
                f" ({decision.reason})"
            )
    return problems


# ------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Rate:
    engine: str
    decisions_per_second: float
    note: str

    @property
    def microseconds(self) -> float:
        return 1e6 / self.decisions_per_second


def measure(run_mix: Callable[[], int], seconds: float, repeats: int = 3) -> float:
    """Decisions per second of ``run_mix`` (one pass over the request mix, returns how many
    decisions it made): the median of ``repeats`` runs of about ``seconds`` each."""
    run_mix()  # warm caches (compiled programs, casbin's function map, cedar's first call)
    rates = []
    for _ in range(repeats):
        decisions, elapsed = 0, 0.0
        start = time.perf_counter()
        while elapsed < seconds:
            decisions += run_mix()
            elapsed = time.perf_counter() - start
        rates.append(decisions / elapsed)
    return statistics.median(rates)


def time_engines(engines: Engines, requests: Sequence[Request], seconds: float) -> list[Rate]:
    import cedarpy

    prepared = [(r.tool, r.params, r.now) for r in requests]
    compiled = engines.ours

    def ours() -> int:
        for tool, params, now in prepared:
            evaluate(compiled, tool, params, now)  # no rate_limit rule: always the decision
        return len(prepared)

    cedar_policies, cedar_entities = engines.cedar_policies, engines.cedar_entities
    cedar_requests = engines.cedar_requests

    def cedar_single() -> int:
        for request in cedar_requests:
            cedarpy.is_authorized(request, cedar_policies, cedar_entities)
        return len(cedar_requests)

    batch = cedar_requests * 10

    def cedar_batch() -> int:
        cedarpy.is_authorized_batch(batch, cedar_policies, cedar_entities)
        return len(batch)

    enforce = engines.casbin.enforce
    casbin_requests = engines.casbin_requests

    def casbin() -> int:
        for request in casbin_requests:
            enforce(*request)
        return len(casbin_requests)

    return [
        Rate("agentauth (core.domain.engine.evaluate)", measure(ours, seconds), "compiled once"),
        Rate(
            "cedarpy is_authorized",
            measure(cedar_single, seconds),
            "parsed PolicySet/Entities handles, context pre-serialised",
        ),
        Rate(
            "cedarpy is_authorized_batch",
            measure(cedar_batch, seconds),
            f"{len(batch)} requests per call",
        ),
        Rate(
            "pycasbin enforce",
            measure(casbin, seconds / 2, repeats=3),
            "priority effect, eval() conditions",
        ),
    ]


def rule_mix(policies: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for policy in policies:
        for rule in policy["rules"]:
            counts[rule["type"]] = counts.get(rule["type"], 0) + 1
    return counts


def cedar_floor(engines: Engines, seconds: float) -> float:
    """cedarpy's best batch rate with a single trivial permit: the cost of crossing into Rust,
    parsing the request and context and returning the answer, with (almost) no policy work."""
    import cedarpy

    trivial = cedarpy.PolicySet.from_str("permit (principal, action, resource);")
    batch = engines.cedar_requests * 10

    def run() -> int:
        cedarpy.is_authorized_batch(batch, trivial, engines.cedar_entities)
        return len(batch)

    return measure(run, seconds)
