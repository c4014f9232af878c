"""Rendering plans for people and programs: ``text`` (colored on a terminal), ``json``
(versioned, see ``JSON_FORMAT_VERSION`` and README), ``markdown`` (a pull-request comment,
summary first, at most :data:`MARKDOWN_LIMIT` characters). Called by the plan and diff verbs.
Just over 300 lines: the three formats show the same plan and change together.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from controller.evidence import DAYS, Evidence
from controller.impact import AgentImpact, Flip
from controller.plan import ABSENT, Action, Change, FieldChange, Plan
from schemas import Problem

JSON_FORMAT_VERSION = 1
MARKDOWN_LIMIT = 65_000
_SIGNS = {
    Action.CREATE: "+",
    Action.UPDATE: "~",
    Action.DELETE: "-",
    Action.CONFLICT: "!",
    Action.ORPHAN: "=",
}
_COLORS = {
    Action.CREATE: "green",
    Action.UPDATE: "yellow",
    Action.DELETE: "red",
    Action.CONFLICT: "magenta",
    Action.ORPHAN: "cyan",
}
Style = Callable[..., str]


def _plain(text: str, **_: Any) -> str:
    return text


def headline(plan: Plan) -> str:
    counts = plan.summary()
    parts = [
        f"{counts['create']} to create",
        f"{counts['update']} to update",
        f"{counts['delete']} to delete",
    ]
    extra = [
        f"{counts[key]} {label}"
        for key, label in (("drift", "with drift"), ("conflict", "conflict(s)"), ("orphan", "kept"))
        if counts[key]
    ]
    return ", ".join(parts + extra) if plan.changes else "no changes"


def value(item: Any) -> str:
    """Compact JSON, keys sorted but a rule's ``type`` first (it says how to read the rest)."""
    if item is ABSENT:
        return "(none)"
    return json.dumps(_ordered(item), ensure_ascii=False)


def _ordered(item: Any) -> Any:
    if isinstance(item, dict):
        keys = sorted(item, key=lambda k: (k != "type", k))
        return {k: _ordered(item[k]) for k in keys}
    if isinstance(item, list):
        return [_ordered(v) for v in item]
    return item


DRIFT = "[drift: changed outside the repository]"


def _field_line(change: FieldChange, action: Action) -> str:
    if action in (Action.CREATE, Action.DELETE):
        shown = change.after if action is Action.CREATE else change.before
        return f"{change.where}: {value(shown)}"
    if change.before is ABSENT:
        text = f"{change.where}: (added) {value(change.after)}"
    elif change.after is ABSENT:
        text = f"{change.where}: (removed) {value(change.before)}"
    else:
        text = f"{change.where}: {value(change.before)} -> {value(change.after)}"
    return text + (f"   {DRIFT}" if change.drift else "")


def _title(change: Change) -> str:
    owner = f" (agent {change.agent})" if change.kind == "Policy" and change.agent else ""
    return f"{change.kind} {change.name}{owner}"


def _detail_lines(change: Change) -> list[str]:
    lines = [_field_line(f, change.action) for f in _expanded(change)]
    if change.note:
        lines.append(change.note)
    return lines


def _expanded(change: Change) -> Sequence[FieldChange]:
    """A created or deleted policy's rules one per line (rules[0]: ...), the rest as planned."""
    out: list[FieldChange] = []
    whole = change.action in (Action.CREATE, Action.DELETE)
    for f in change.fields:
        rules = f.after if change.action is Action.CREATE else f.before
        if whole and f.path == ("rules",) and isinstance(rules, list):
            out += [
                FieldChange(("rules", i), *((ABSENT, r) if f.before is ABSENT else (r, ABSENT)))
                for i, r in enumerate(rules)
            ]
        else:
            out.append(f)
    return out


def render_text(
    plan: Plan,
    impacts: Sequence[AgentImpact] = (),
    warnings: Sequence[Problem] = (),
    style: Style = _plain,
    evidence: Sequence[Evidence] = (),
) -> str:
    lines = [style(f"Plan: {headline(plan)}.", bold=True)]
    for change in plan.changes:
        sign = _SIGNS[change.action]
        where = f"   ({change.source})" if change.source else ""
        lines.append("")
        lines.append(style(f"{sign} {_title(change)}", fg=_COLORS[change.action]) + where)
        lines += [f"    {line}" for line in _detail_lines(change)]
    if impacts:
        lines += ["", style("Impact on recent calls (replayed through the engine):", bold=True)]
        lines += [f"  {line}" for impact in impacts for line in _impact_lines(impact)]
    if evidence:
        title = f"Mode changes, and what each policy would have done (last {DAYS} days):"
        lines += ["", style(title, bold=True)]
        lines += [f"  {line}" for found in evidence for line in _evidence_lines(found)]
    if warnings:
        lines += ["", style(f"{len(warnings)} warning(s):", fg="yellow")]
        lines += [f"  {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _impact_lines(impact: AgentImpact) -> list[str]:
    lines = [
        f"{impact.agent}: {impact.replayed} calls replayed; "
        f"{impact.to_denied} allowed -> denied, {impact.to_allowed} denied -> allowed"
    ]
    lines += [f"  {_flip_line(flip)}" for flip in impact.examples]
    return lines


def _evidence_lines(evidence: Evidence) -> list[str]:
    agent = f" (agent {evidence.agent})" if evidence.agent else ""
    head = f"{evidence.policy}{agent}: {evidence.before} -> {evidence.after}"
    report = evidence.report
    if report is None:
        return [f"{head}: {_no_report(evidence)}"]
    lines = [
        f"{head}: {report.calls} calls with a would-be decision, {report.changed} changed "
        f"({report.would_deny} would deny, {report.would_escalate} would escalate, "
        f"{report.would_allow} would allow), {report.errors} errors"
    ]
    lines += [
        f"  {tool}: {calls} calls, {changed} changed" for tool, calls, changed in report.by_tool
    ]
    return lines


def _no_report(evidence: Evidence) -> str:
    if evidence.looked:
        return "no shadow report: the database does not hold this policy"
    return "no shadow report read (give --db to read it)"


def _flip_line(flip: Flip) -> str:
    direction = f"{flip.before.outcome} -> {flip.after.outcome}"  # escalated is not allowed
    call = flip.call
    return (
        f"{direction}: {call.tool} {value(call.parameters)} at {call.at.isoformat()}: "
        f"{flip.after.reason}"
    )


# ------------------------------------------------------------------------------------- json


def render_json(
    plan: Plan,
    impacts: Sequence[AgentImpact] | None = None,
    warnings: Sequence[Problem] = (),
    evidence: Sequence[Evidence] = (),
) -> str:
    """One JSON object on one line, keys sorted (pipe it through ``jq`` to read it). Members:
    format_version, summary, has_changes, changes, impact (null when not analysed), evidence
    (each policy whose mode changes: ``policy``, ``agent``, ``id``, ``mode_before``,
    ``mode_after``, and ``report``, its shadow report or null when none was read), warnings.
    A change holds the whole object in ``before`` (update, delete, orphan, and a conflict with
    an object of this workspace; null for one of another workspace) and ``after`` (create,
    update, conflict); ``fields`` lists an update's differing members, each with ``path``,
    ``drift`` and ``before``/``after`` (absent when the member is added/removed)."""
    document: dict[str, Any] = {
        "format_version": JSON_FORMAT_VERSION,
        "summary": plan.summary(),
        "has_changes": plan.has_changes,
        "changes": [_change_json(c) for c in plan.changes],
        "impact": None if impacts is None else [_impact_json(i) for i in impacts],
        "evidence": [_evidence_json(e) for e in evidence],
        "warnings": [_problem_json(w) for w in warnings],
    }
    return json.dumps(document, ensure_ascii=False, sort_keys=True) + "\n"


def _change_json(change: Change) -> dict[str, Any]:
    updated = change.action is Action.UPDATE
    return {
        "action": change.action.value,
        "kind": change.kind,
        "name": change.name,
        "id": change.id,
        "agent": change.agent,
        "source": change.source,
        "drift": change.drift,
        "note": change.note,
        "before": change.before,
        "after": change.after,
        "fields": [_field_json(f) for f in change.fields] if updated else [],
    }


def _field_json(change: FieldChange) -> dict[str, Any]:
    out: dict[str, Any] = {"path": change.where, "drift": change.drift}
    if change.before is not ABSENT:
        out["before"] = change.before
    if change.after is not ABSENT:
        out["after"] = change.after
    return out


def _impact_json(impact: AgentImpact) -> dict[str, Any]:
    return {
        "agent": impact.agent,
        "replayed": impact.replayed,
        "allowed_to_denied": impact.to_denied,
        "denied_to_allowed": impact.to_allowed,
        "examples": [
            {
                "tool": f.call.tool,
                "parameters": f.call.parameters,
                "at": f.call.at.isoformat(),
                "before": {
                    "allowed": f.before.allowed,
                    "outcome": f.before.outcome,
                    "reason": f.before.reason,
                },
                "after": {
                    "allowed": f.after.allowed,
                    "outcome": f.after.outcome,
                    "reason": f.after.reason,
                },
            }
            for f in impact.examples
        ],
    }


def _evidence_json(evidence: Evidence) -> dict[str, Any]:
    return {
        "policy": evidence.policy,
        "agent": evidence.agent,
        "id": evidence.policy_id,
        "mode_before": evidence.before,
        "mode_after": evidence.after,
        "report": None if evidence.report is None else evidence.report.as_json(),
    }


def _problem_json(problem: Problem) -> dict[str, Any]:
    return {
        "file": problem.file,
        "line": problem.line,
        "column": problem.column,
        "path": problem.path,
        "message": problem.message,
        "severity": problem.severity,
    }


# --------------------------------------------------------------------------------- markdown


def render_markdown(
    plan: Plan,
    impacts: Sequence[AgentImpact] = (),
    warnings: Sequence[Problem] = (),
    title: str = "agentauth plan",
    evidence: Sequence[Evidence] = (),
) -> str:
    counts = plan.summary()
    head = [
        f"### {title}: {headline(plan)}",
        "",
        "| create | update | delete | drift | conflict | kept |",
        "|--:|--:|--:|--:|--:|--:|",
        f"| {counts['create']} | {counts['update']} | {counts['delete']} | {counts['drift']} "
        f"| {counts['conflict']} | {counts['orphan']} |",
    ]
    if impacts:
        head += ["", "**Impact on recent calls**", ""]
        head += ["| agent | replayed | allowed → denied | denied → allowed |", "|---|--:|--:|--:|"]
        head += [f"| {i.agent} | {i.replayed} | {i.to_denied} | {i.to_allowed} |" for i in impacts]
    if evidence:
        head += ["", f"**Mode changes: what each policy would have done (last {DAYS} days)**", ""]
        head += [
            "| policy | mode | calls | changed | would deny | would escalate | would allow "
            "| errors |",
            "|---|---|--:|--:|--:|--:|--:|--:|",
        ]
        head += [_evidence_row(e) for e in evidence]
    if warnings:
        head += ["", f"**{len(warnings)} warning(s)**", ""] + [f"- `{w}`" for w in warnings[:20]]
    body = [_change_markdown(c) for c in plan.changes]
    return _fit("\n".join(head) + "\n", body)


def _evidence_row(evidence: Evidence) -> str:
    mode = f"{evidence.before} → {evidence.after}"
    report = evidence.report
    if report is None:
        return f"| {_cell(evidence.policy)} | {mode} | {_no_report(evidence)} | | | | | |"
    counts = (
        report.calls, report.changed, report.would_deny, report.would_escalate,
        report.would_allow, report.errors,
    )  # fmt: skip
    return f"| {_cell(evidence.policy)} | {mode} | " + " | ".join(map(str, counts)) + " |"


def _cell(text: str) -> str:
    """Text safe in a table cell: no pipe ends the cell, no backtick opens code."""
    return text.replace("|", "\\|").replace("`", "'")


def _change_markdown(change: Change) -> str:
    sign = _SIGNS[change.action]
    where = f" — `{change.source}`" if change.source else ""
    lines = [f"<details><summary><code>{sign}</code> {change.action.value} {_title(change)}"
             f"{where}</summary>", "", "```diff"]  # fmt: skip
    lines += [line.replace("```", "`\u200b``") for line in _diff_lines(change)]
    lines += ["```", "</details>", ""]
    return "\n".join(lines)


def _diff_lines(change: Change) -> list[str]:
    """Lines a diff highlighter colors: - before, + after; notes marked with !."""
    out = []
    for f in _expanded(change):
        if f.before is not ABSENT:
            out.append(f"- {f.where}: {value(f.before)}")
        if f.after is not ABSENT:
            out.append(f"+ {f.where}: {value(f.after)}" + (f"   # {DRIFT}" if f.drift else ""))
    if change.note:
        out.append(f"! {change.note}")
    return out


def _fit(head: str, sections: list[str]) -> str:
    out = head + ("\n" if sections else "")
    for index, section in enumerate(sections):
        rest = len(sections) - index
        tail = f"\n_… and {rest} more change(s), not shown: run `agentauth plan` for all._\n"
        if len(out) + len(section) + len(tail) > MARKDOWN_LIMIT:
            return out + tail
        out += section + "\n"
    return out
