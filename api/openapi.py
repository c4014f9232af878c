"""The OpenAPI 3.1 document of the whole API, built from the schema files in ``schemas/``: each
file's ``$defs`` become ``components.schemas`` named ``file.def``, references rewritten. Over
300 lines because it describes every operation, in one place a reviewer can read top to
bottom against the routes."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from schemas import FILES, load_schema

JSON = "application/json"


def _component(file: str, name: str) -> str:
    return f"{file.removesuffix('.json')}.{name}"


def _rewrite(node: Any, file: str) -> Any:
    if isinstance(node, dict):
        out = {key: _rewrite(value, file) for key, value in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str):
            target_file, _, pointer = ref.partition("#/$defs/")
            out["$ref"] = "#/components/schemas/" + _component(target_file or file, pointer)
        return out
    if isinstance(node, list):
        return [_rewrite(value, file) for value in node]
    return node


def _components() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for file in FILES:
        for name, schema in load_schema(file).get("$defs", {}).items():
            found[_component(file, name)] = _rewrite(copy.deepcopy(schema), file)
    return found


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _envelope(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["data", "pagination"],
        "properties": {
            "data": {"type": "array", "items": ref(item)},
            "pagination": ref("common.pagination"),
        },
    }


ERRORS = {
    "400": "invalid request body or query parameters",
    "401": "key missing, malformed, invalid, revoked (UNAUTHORIZED) or expired (API_KEY_EXPIRED)",
    "403": "the key's scope does not permit the operation (INSUFFICIENT_SCOPE)",
    "404": "not found in the caller's workspace",
    "429": "per-key rate limit exceeded (RATE_LIMITED); see Retry-After",
}


def _operation(
    summary: str,
    ok: dict[str, Any],
    *,
    body: str | None = None,
    query: list[dict[str, Any]] | None = None,
    path_id: bool = False,
    admin: bool = False,
) -> dict[str, Any]:
    responses = dict(ok)
    for status, text in ERRORS.items():
        if status == "403" and not admin:
            continue
        if status == "404" and not path_id:  # an operation on a collection finds nothing to miss
            continue
        responses[status] = _json(ref("common.error"), text)
    if body:
        responses["413"] = _json(ref("common.error"), "request body over 1 MiB")
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if admin:
        op["description"] = "Needs an API key with the admin scope."
    params = list(query or [])
    if path_id:
        params.append({"name": "id", "in": "path", "required": True, "schema": ref("common.uuid")})
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(body)}}}
    return op


def _q(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _paging(maximum: int) -> list[dict[str, Any]]:
    return [
        _q("limit", {"type": "integer", "minimum": 1, "maximum": maximum, "default": 100}),
        _q("offset", {"type": "integer", "minimum": 0, "maximum": 2_147_483_647, "default": 0}),
    ]


def _crud(noun: str, item: str, create: str, update: str | None) -> dict[str, Any]:
    one = {"200": _json(ref(item), noun)}
    paths: dict[str, Any] = {
        "": {
            "post": _operation(
                f"create {noun}",
                {"201": _json(ref(item), f"the new {noun}")},
                body=create,
                admin=True,
            ),
            "get": _operation(
                f"list {noun}s", {"200": _json(_envelope(item), "one page")}, query=_paging(200)
            ),
        },
        "/{id}": {
            "delete": _operation(
                f"delete {noun}", {"204": {"description": "deleted"}}, path_id=True, admin=True
            ),
        },
    }
    if update:
        paths["/{id}"]["get"] = _operation(f"read {noun}", one, path_id=True)
        paths["/{id}"]["patch"] = _operation(
            f"update {noun}", one, body=update, path_id=True, admin=True
        )
    return paths


def _approvals(paths: dict[str, Any]) -> None:
    """``/v1/approvals`` (decisions §6)."""
    one = {"200": _json(ref("approval.approval"), "the approval")}
    statuses = ["pending", "approved", "denied", "expired", "used"]
    filters = [
        _q("status", {"enum": statuses}),
        _q("agent_id", ref("common.uuid")),
        _q("tool_name", ref("common.text")),
    ]
    paths["/v1/approvals"] = {
        "get": _operation(
            "list approvals, newest first (a pending or approved one past its expiry is expired)",
            {"200": _json(_envelope("approval.approval"), "one page")},
            query=filters + _paging(200),
        )
    }
    paths["/v1/approvals/{id}"] = {"get": _operation("read an approval", one, path_id=True)}
    for verb in ("approve", "deny"):
        op = _operation(f"{verb} a pending approval", one, path_id=True, admin=True)
        op["description"] = (
            "Needs an API key with the admin or approver scope, other than every key that made "
            "a call the approval matches. The body is optional."
        )
        op["requestBody"] = {
            "required": False,
            "content": {JSON: {"schema": ref("approval.decide")}},
        }
        op["responses"]["403"] = _json(
            ref("common.error"),
            "the key's scope does not permit deciding (INSUFFICIENT_SCOPE), or the key made a "
            "call the approval matches (SELF_APPROVAL_FORBIDDEN)",
        )
        op["responses"]["409"] = _json(
            ref("common.error"), "the approval is decided, used or expired (APPROVAL_NOT_PENDING)"
        )
        op["responses"]["413"] = _json(ref("common.error"), "request body over 1 MiB")
        paths[f"/v1/approvals/{{id}}/{verb}"] = {"post": op}


def _webhooks(paths: dict[str, Any]) -> None:
    """``/v1/webhooks`` (decisions §6): every operation needs the admin scope."""
    item = "webhook.webhook"
    create = _operation(
        "create a webhook; the answer holds its secret, shown this once",
        {"201": _json(ref(item), "the new webhook, with its secret")},
        body="webhook.create",
        admin=True,
    )
    create["responses"]["400"] = _json(
        ref("common.error"),
        "invalid body, or a url whose host cannot be resolved or resolves to a loopback, "
        "private, link-local or other non-public address (VALIDATION_ERROR)",
    )
    paths["/v1/webhooks"] = {
        "post": create,
        "get": _operation(
            "list webhooks, newest first",
            {"200": _json(_envelope(item), "one page")},
            query=_paging(200),
            admin=True,
        ),
    }
    paths["/v1/webhooks/{id}"] = {
        "delete": _operation(
            "delete a webhook; its pending deliveries are never made",
            {"204": {"description": "deleted"}},
            path_id=True,
            admin=True,
        )
    }
    paths["/v1/webhooks/{id}/deliveries"] = {
        "get": _operation(
            "a webhook's delivery records, newest first",
            {"200": _json(_envelope("webhook.delivery"), "one page")},
            query=_paging(200),
            path_id=True,
            admin=True,
        )
    }


@cache
def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for base, parts in (
        ("/v1/agents", _crud("agent", "agent.agent", "agent.create", "agent.update")),
        ("/v1/policies", _crud("policy", "policy.policy", "policy.create", "policy.update")),
        ("/v1/api-keys", _crud("API key", "api-key.apiKey", "api-key.create", None)),
    ):
        for suffix, ops in parts.items():
            paths[base + suffix] = ops
    paths["/v1/policies"]["get"]["parameters"].append(_q("agent_id", ref("common.uuid")))
    paths["/v1/policies"]["post"]["responses"]["404"] = _json(
        ref("common.error"), "agent_id names no agent of the caller's workspace (AGENT_NOT_FOUND)"
    )
    paths["/v1/api-keys"]["get"]["description"] = "Needs an API key with the admin scope."
    paths["/v1/api-keys"]["get"]["responses"]["403"] = _json(ref("common.error"), ERRORS["403"])
    paths["/v1/authorize"] = {
        "post": _operation(
            "decide whether an agent may call a tool (200 for allowed and denied alike)",
            {"200": _json(ref("authorize.decision"), "the decision, already audited")},
            body="authorize.request",
        )
    }
    instant = {"type": "string", "format": "date-time"}
    paths["/v1/policies/{id}/shadow-report"] = {
        "get": _operation(
            "what the policy's would-be decisions did over [from, to] (decisions §10; any "
            "scope; to defaults to now, from to 7 days before to), exactly, from the counts "
            "kept as entries are committed",
            {"200": _json(ref("policy.shadowReport"), "the report")},
            query=[_q("from", instant), _q("to", instant)],
            path_id=True,
        )
    }
    session = _q("session_id", ref("authorize.sessionId"))
    paths["/v1/agents/{id}/usage"] = {
        "get": _operation(
            "what each rate_limit and budget rule of the agent's enabled policies holds in its "
            "current window, in evaluation order (any scope); per-session rules count "
            "session_id's calls, and have null counts without it",
            {"200": _json(ref("agent.usage"), "the agent's limits")},
            query=[session],
            path_id=True,
        )
    }
    filters = [
        _q("agent_id", ref("common.uuid")),
        session,
        _q("action", ref("common.text")),
        _q("tool_name", ref("common.text")),
        _q("result", {"enum": ["allowed", "denied", "escalated"]}),
        _q("from", {"type": "string", "format": "date-time"}),
        _q("to", {"type": "string", "format": "date-time"}),
        _q("seq_from", {"type": "integer", "minimum": 1, "maximum": 9_999_999_999}),
        _q("seq_to", {"type": "integer", "minimum": 1, "maximum": 9_999_999_999}),
    ]
    listing = _envelope("audit.entry")
    listing["properties"]["pagination"] = ref("audit.pagination")
    cursor = _q("cursor", {"type": "string", "minLength": 1, "maxLength": 512})
    paths["/v1/audit-logs"] = {
        "get": _operation(
            "query the audit log, newest first; follow pagination.nextCursor for the next page",
            {"200": _json(listing, "one page")},
            query=[*filters, *_paging(1000), cursor],
        )
    }
    by_name = {parameter["name"]: parameter for parameter in filters}
    paths["/v1/audit-logs/stats"] = {
        "get": _operation(
            "counts of audit entries over time, by bucket and optionally by result, agent or tool"
            " (extension; any scope)",
            {"200": _json(ref("audit.stats"), "the counts, in start order")},
            query=[
                *(by_name[n] for n in ("agent_id", "tool_name", "result", "session_id")),
                by_name["from"],
                by_name["to"],
                _q("bucket", {"enum": ["minute", "hour", "day"], "default": "hour"}),
                _q("group_by", {"enum": ["result", "agent", "tool"]}),
            ],
        )
    }
    csv_headers = {
        "Content-Disposition": {"schema": {"type": "string"}},
        "X-Svc-Export-Truncated": {"schema": {"const": "true"}},
        # 5000 for CSV; the server's limit (1,000,000 unless configured) for Parquet
        "X-Svc-Export-Limit": {"schema": {"type": "string", "pattern": "^[0-9]+$"}},
    }
    paths["/v1/audit-logs/export"] = {
        "get": _operation(
            "export the audit log: CSV (at most 5,000 rows, newest first) or, with format=jsonl,"
            " every entry of a seq range oldest first, erased ones as placeholders, sent as it is"
            " produced (extension); with format=parquet, the entries of the JSONL export as a"
            " Parquet file, one column per member (at most 1,000,000 entries; extension)",
            {
                "200": {
                    "description": "CSV with the columns Timestamp, Agent ID, Tool, Result, "
                    "Reason, Latency (ms), Parameters; or JSON Lines of audit.exportLine; or a "
                    "Parquet file of the columns seq, id, agentId, action, toolName, parameters "
                    "(JSON), result, policyId, ruleIndex, reason, latencyMs, timestamp (UTC), "
                    "approvalId, sessionId, hash, entryHash, erased",
                    "headers": csv_headers,
                    "content": {
                        "text/csv": {"schema": {"type": "string"}},
                        "application/jsonl": {"schema": ref("audit.exportLine")},
                        "application/vnd.apache.parquet": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                    },
                }
            },
            query=[*filters, _q("format", {"enum": ["csv", "jsonl", "parquet"]})],
        )
    }
    text = {"text/plain": {"schema": {"type": "string"}}}
    paths["/v1/audit-logs/checkpoint"] = {
        "get": _operation(
            "the audit chain's current size and head as a C2SP signed note (extension; any scope)",
            {"200": {"description": "the signed checkpoint", "content": text}},
        )
    }
    paths["/v1/audit-logs/public-key"] = {
        "get": _operation(
            "the C2SP verifier key of the checkpoints' Ed25519 signatures (extension; any scope)",
            {"200": {"description": "agentauth+<key id hex>+<base64 key>", "content": text}},
        )
    }
    paths["/v1/audit-logs/retention"] = {
        "get": _operation(
            "what the audit log keeps: entries kept, its size, the oldest entry kept and the last"
            " prune with its archive file (extension; any scope)",
            {"200": _json(ref("audit.retention"), "what the log keeps")},
        )
    }
    _approvals(paths)
    paths["/v1/whoami"] = {
        "get": _operation(
            "the caller's own API key, scopes included (extension; any scope)",
            {"200": _json(ref("api-key.apiKey"), "the key, never its full text")},
        )
    }
    _webhooks(paths)
    paths["/v1/sync-status"] = {
        "get": _operation(
            "what the GitOps controller last applied to this workspace (extension; any scope)",
            {"200": _json(ref("sync-status.status"), "the sync status")},
        )
    }
    paths["/v1/openapi.json"] = {
        "get": {
            "summary": "this document",
            "security": [],
            "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
        }
    }
    paths["/healthz"] = {
        "get": {
            "summary": "liveness",
            "security": [],
            "responses": {"200": {"description": "alive"}},
        }
    }
    paths["/metrics"] = {
        "get": {
            "summary": "Prometheus metrics: decisions, latency, audit failures, rate limits, sync",
            "security": [],
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    paths["/readyz"] = {
        "get": {
            "summary": "readiness: the database answers and its schema is current",
            "security": [],
            "responses": {
                "200": _json({"type": "object"}, "ready"),
                "503": _json(ref("common.error"), "not ready (NOT_READY)"),
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentauth",
            "version": "1",
            "description": "Authorization service for AI agents.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": _components(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "svc_ + 32 hex characters",
                }
            },
        },
    }
