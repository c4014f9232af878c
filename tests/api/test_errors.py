"""Errors at the HTTP boundary: every one is ``{"error": {"code", "message"}}`` with the right
status, whatever went wrong (route, method, body bytes, JSON, size, path ids, query strings);
plus the two endpoints that need no key, ``/healthz`` and the OpenAPI document."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from schemas import FILES, load_schema
from tests.api.helpers import assert_error

MIB = 1024 * 1024
UNKNOWN = "00000000-0000-4000-8000-00000000abcd"
ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]


@pytest.fixture
def world(client, admin_headers) -> dict[str, Any]:
    """One agent, one policy, one spare key."""
    agent = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers).get_json()
    body = {"agent_id": agent["id"], "name": "p", "rules": ALLOW_ALL}
    policy = client.post("/v1/policies", json=body, headers=admin_headers).get_json()
    key = client.post(
        "/v1/api-keys", json={"name": "k", "scopes": ["read-only"]}, headers=admin_headers
    ).get_json()
    return {"agent": agent, "policy": policy, "key": key}


def snapshot(client, headers) -> dict[str, Any]:
    return {
        noun: client.get(f"/v1/{noun}", headers=headers).get_json()
        for noun in ("agents", "policies", "api-keys")
    }


# --- routes and methods -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/nope",
        "/v1",
        "/v1/nope",
        "/v2/agents",
        "/V1/agents",
        "/v1/Agents",
        f"/v1/agents/{UNKNOWN}/policies",
        "/v1/agent",
        "/v1/api_keys",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_route_is_404_not_found(client, admin_headers, path, method):
    response = client.open(path, method=method, headers=admin_headers)
    assert_error(response, 404, "NOT_FOUND")


WRONG_METHODS = [
    ("PUT", "/v1/agents", {"GET", "POST"}),
    ("PATCH", "/v1/agents", {"GET", "POST"}),
    ("DELETE", "/v1/agents", {"GET", "POST"}),
    ("POST", "/v1/agents/{agent}", {"GET", "PATCH", "DELETE"}),
    ("PUT", "/v1/agents/{agent}", {"GET", "PATCH", "DELETE"}),
    ("PUT", "/v1/policies", {"GET", "POST"}),
    ("POST", "/v1/policies/{policy}", {"GET", "PATCH", "DELETE"}),
    ("PUT", "/v1/policies/{policy}", {"GET", "PATCH", "DELETE"}),
    ("DELETE", "/v1/api-keys", {"GET", "POST"}),
    ("GET", "/v1/api-keys/{key}", {"DELETE"}),
    ("PATCH", "/v1/api-keys/{key}", {"DELETE"}),
    ("POST", "/healthz", {"GET"}),
    ("POST", "/v1/openapi.json", {"GET"}),
]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    WRONG_METHODS,
    ids=[f"{m} {p}" for m, p, _ in WRONG_METHODS],
)
def test_wrong_method_is_405_method_not_allowed(
    client, admin_headers, world, method, path, allowed
):
    before = snapshot(client, admin_headers)
    ids = {noun: world[noun]["id"] for noun in ("agent", "policy", "key")}
    response = client.open(
        path.format(**ids), method=method, json={"name": "x"}, headers=admin_headers
    )
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    offered = {m.strip() for m in response.headers["Allow"].split(",")}
    assert allowed <= offered
    assert not offered & ({"GET", "POST", "PUT", "PATCH", "DELETE"} - allowed)
    assert snapshot(client, admin_headers) == before


# --- request bodies ---------------------------------------------------------------------------


def nested(depth: int) -> str:
    """``depth`` levels of JSON containers, the outermost an object."""
    return '{"name": "a", "description": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


BAD_AGENT_BODIES: dict[str, bytes] = {
    "truncated": b'{"name": ',
    "empty": b"",
    "whitespace-only": b"  \n ",
    "trailing-garbage": b'{"name": "a"} x',
    "two-documents": b'{"name": "a"}{"name": "b"}',
    "single-quotes": b"{'name': 'a'}",
    "trailing-comma": b'{"name": "a",}',
    "comment": b'{"name": "a" /* hi */}',
    "unquoted-key": b'{name: "a"}',
    "duplicate-keys": b'{"name": "a", "name": "b"}',
    "duplicate-keys-nested": b'{"name": "a", "description": {"x": 1, "x": 2}}',
    "array-body": b'[{"name": "a"}]',
    "string-body": b'"a"',
    "number-body": b"1",
    "null-body": b"null",
    "true-body": b"true",
    "nul-escape-in-string": b'{"name": "a\\u0000b"}',
    "nul-escape-in-key": b'{"name": "a", "x\\u0000": 1}',
    "raw-nul-byte": b'{"name": "a\x00b"}',
    "raw-control-char": b'{"name": "a\x01b"}',
    "lone-surrogate-escape": b'{"name": "\\ud800"}',
    "invalid-utf8": b'{"name": "\xff\xfe"}',
    "overlong-utf8": b'{"name": "\xc0\xae"}',
    "utf8-encoded-surrogate": b'{"name": "\xed\xa0\x80"}',
    "utf16-body": '{"name": "a"}'.encode("utf-16"),
    "latin1-body": '{"name": "é"}'.encode("latin-1"),
    "nested-65-levels": nested(65).encode(),
    "nested-100-levels": nested(100).encode(),
    "nested-1000-levels": nested(1000).encode(),
    "nested-100000-levels": nested(100_000).encode(),
}


@pytest.mark.parametrize("raw", BAD_AGENT_BODIES.values(), ids=BAD_AGENT_BODIES.keys())
def test_bad_json_is_400_validation_error(client, admin_headers, raw):
    response = client.post(
        "/v1/agents", data=raw, content_type="application/json", headers=admin_headers
    )
    error = assert_error(response, 400, "VALIDATION_ERROR")
    # refused as JSON, before the schema: no field of the agent is blamed
    blamed = {d["field"] for d in error.get("details", [])}
    assert not blamed & {"name", "description"}, blamed
    assert client.get("/v1/agents", headers=admin_headers).get_json()["data"] == []


@pytest.mark.parametrize(
    "number",
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"],
    ids=["nan", "infinity", "minus-infinity", "overflow", "minus-overflow"],
)
def test_non_finite_numbers_are_400(client, admin_headers, world, number):
    """``min`` takes any JSON number, so only the strict parser stands between these and the
    database."""
    before = snapshot(client, admin_headers)
    raw = (
        f'{{"agent_id": "{world["agent"]["id"]}", "name": "p", "rules": '
        f'[{{"type": "parameter_constraint", "parameters": {{"x": {{"min": {number}}}}}}}]}}'
    )
    response = client.post(
        "/v1/policies", data=raw, content_type="application/json", headers=admin_headers
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    assert snapshot(client, admin_headers) == before


def test_nesting_up_to_the_limit_is_parsed_and_only_then_judged(client, admin_headers):
    """64 levels parse (the schema then refuses the array), so the limit is not off by one."""
    response = client.post(
        "/v1/agents", data=nested(64), content_type="application/json", headers=admin_headers
    )
    details = assert_error(response, 400, "VALIDATION_ERROR")["details"]
    assert [d["field"] for d in details] == ["description"]


BODY_ENDPOINTS = {
    "create-agent": ("POST", "/v1/agents"),
    "patch-agent": ("PATCH", "/v1/agents/{agent}"),
    "create-policy": ("POST", "/v1/policies"),
    "patch-policy": ("PATCH", "/v1/policies/{policy}"),
    "create-api-key": ("POST", "/v1/api-keys"),
}
body_endpoints = pytest.mark.parametrize(
    ("method", "path"), BODY_ENDPOINTS.values(), ids=BODY_ENDPOINTS.keys()
)


def _send(
    client: Any, world: dict[str, Any], method: str, path: str, headers: Any, **kwargs: Any
) -> Any:
    ids = {noun: world[noun]["id"] for noun in ("agent", "policy", "key")}
    return client.open(path.format(**ids), method=method, headers=headers, **kwargs)


@body_endpoints
@pytest.mark.parametrize(
    "raw",
    [b'{"name": ', b"[]", b'{"name": "a", "name": "b"}', b"\xff", b""],
    ids=["truncated", "array", "duplicate-keys", "invalid-utf8", "empty"],
)
def test_every_body_endpoint_refuses_bad_json(client, admin_headers, world, method, path, raw):
    before = snapshot(client, admin_headers)
    response = _send(
        client, world, method, path, admin_headers, data=raw, content_type="application/json"
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    assert snapshot(client, admin_headers) == before


@body_endpoints
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        None,
    ],
    ids=["text", "form", "multipart", "xml", "none"],
)
def test_every_body_endpoint_refuses_non_json_content_types(
    client, admin_headers, world, method, path, content_type
):
    before = snapshot(client, admin_headers)
    body = json.dumps({"name": "x", "scopes": ["admin"]}).encode()
    kwargs: dict[str, Any] = {"data": body}
    if content_type is not None:
        kwargs["content_type"] = content_type
    response = _send(client, world, method, path, admin_headers, **kwargs)
    assert_error(response, 400, "VALIDATION_ERROR")
    assert snapshot(client, admin_headers) == before


def test_json_with_a_charset_parameter_is_accepted(client, admin_headers):
    response = client.post(
        "/v1/agents",
        data=b'{"name": "a"}',
        content_type="application/json; charset=utf-8",
        headers=admin_headers,
    )
    assert response.status_code == 201


@body_endpoints
def test_every_body_endpoint_refuses_a_body_over_1_mib_with_413(
    client, admin_headers, world, method, path
):
    before = snapshot(client, admin_headers)
    raw = b'{"name": "a"' + b" " * MIB + b"}"
    response = _send(
        client, world, method, path, admin_headers, data=raw, content_type="application/json"
    )
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert "1 MiB (1,048,576 bytes)" in response.get_json()["error"]["message"]
    assert snapshot(client, admin_headers) == before


@pytest.mark.parametrize(("size", "status"), [(MIB, 201), (MIB + 1, 413)], ids=["1MiB", "1MiB+1"])
def test_the_body_limit_is_exactly_1_mib(client, admin_headers, size, status):
    head, tail = b'{"name": "edge"', b"}"
    raw = head + b" " * (size - len(head) - len(tail)) + tail
    assert len(raw) == size
    response = client.post(
        "/v1/agents", data=raw, content_type="application/json", headers=admin_headers
    )
    assert response.status_code == status
    total = client.get("/v1/agents", headers=admin_headers).get_json()["pagination"]["total"]
    assert total == (1 if status == 201 else 0)


# --- path ids ---------------------------------------------------------------------------------

MALFORMED_IDS = {
    "word": "not-a-uuid",
    "number": "12345",
    "no-hyphens": "0123456789abcdef0123456789abcdef",
    "too-short": "00000000-0000-4000-8000-00000000abc",
    "too-long": "00000000-0000-4000-8000-00000000abcde",
    "not-hex": "g0000000-0000-4000-8000-00000000abcd",
    "braces": "{00000000-0000-4000-8000-00000000abcd}",
    "urn": "urn:uuid:00000000-0000-4000-8000-00000000abcd",
    "hyphens-misplaced": "0123456789abcdef0123456789abcdef----",
    "underscore": "0000_000-0000-4000-8000-00000000abcd",
    "sql": "1' OR '1'='1",
}

ID_ENDPOINTS = {
    "get-agent": ("GET", "/v1/agents/{}", "AGENT_NOT_FOUND"),
    "patch-agent": ("PATCH", "/v1/agents/{}", "AGENT_NOT_FOUND"),
    "delete-agent": ("DELETE", "/v1/agents/{}", "AGENT_NOT_FOUND"),
    "get-policy": ("GET", "/v1/policies/{}", "POLICY_NOT_FOUND"),
    "patch-policy": ("PATCH", "/v1/policies/{}", "POLICY_NOT_FOUND"),
    "delete-policy": ("DELETE", "/v1/policies/{}", "POLICY_NOT_FOUND"),
    "revoke-api-key": ("DELETE", "/v1/api-keys/{}", "API_KEY_NOT_FOUND"),
}
id_endpoints = pytest.mark.parametrize(
    ("method", "path", "code"), ID_ENDPOINTS.values(), ids=ID_ENDPOINTS.keys()
)


@id_endpoints
@pytest.mark.parametrize("value", MALFORMED_IDS.values(), ids=MALFORMED_IDS.keys())
def test_malformed_id_in_the_path_is_400(client, admin_headers, world, method, path, code, value):
    before = snapshot(client, admin_headers)
    response = client.open(
        path.format(value), method=method, json={"name": "x"}, headers=admin_headers
    )
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert [d["field"] for d in error["details"]] == ["id"]
    assert snapshot(client, admin_headers) == before


@id_endpoints
@pytest.mark.parametrize("value", [UNKNOWN, UNKNOWN.upper(), str(uuid.UUID(int=0))])
def test_well_formed_unknown_id_is_404_with_the_resource_code(
    client, admin_headers, world, method, path, code, value
):
    before = snapshot(client, admin_headers)
    response = client.open(
        path.format(value), method=method, json={"name": "x"}, headers=admin_headers
    )
    assert_error(response, 404, code)
    assert snapshot(client, admin_headers) == before


# --- query strings ----------------------------------------------------------------------------

LISTS = ["/v1/agents", "/v1/policies", "/v1/api-keys"]

BAD_PAGING = {
    "limit-0": ("limit=0", "limit"),
    "limit-201": ("limit=201", "limit"),
    "limit--1": ("limit=-1", "limit"),
    "limit-abc": ("limit=abc", "limit"),
    "limit-1.5": ("limit=1.5", "limit"),
    "limit-empty": ("limit=", "limit"),
    "limit-exponent": ("limit=1e2", "limit"),
    "limit-repeated": ("limit=1&limit=2", "limit"),
    "limit-huge": ("limit=99999999999999999999", "limit"),
    "offset--1": ("offset=-1", "offset"),
    "offset-abc": ("offset=abc", "offset"),
    "offset-1.5": ("offset=1.5", "offset"),
    "offset-empty": ("offset=", "offset"),
    "offset-repeated": ("offset=0&offset=1", "offset"),
}


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(("query", "field"), BAD_PAGING.values(), ids=BAD_PAGING.keys())
def test_bad_paging_values_are_400(client, admin_headers, path, query, field):
    response = client.get(f"{path}?{query}", headers=admin_headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert field in [d["field"] for d in error["details"]]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("foo=1", "foo"),
        ("Limit=5", "Limit"),
        ("page=2", "page"),
        ("limit=5&sort=name", "sort"),
        ("agentId=" + UNKNOWN, "agentId"),
    ],
    ids=["foo", "wrong-case", "page", "with-a-valid-one", "camel-case-filter"],
)
def test_unknown_query_parameter_on_a_list_is_400(client, admin_headers, path, query, field):
    response = client.get(f"{path}?{query}", headers=admin_headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert field in [d["field"] for d in error["details"]]


@pytest.mark.parametrize("path", ["/v1/agents", "/v1/api-keys"])
def test_agent_id_filter_exists_only_on_policies(client, admin_headers, path):
    response = client.get(f"{path}?agent_id={UNKNOWN}", headers=admin_headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert "agent_id" in [d["field"] for d in error["details"]]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/agents/{agent}"),
        ("PATCH", "/v1/agents/{agent}"),
        ("DELETE", "/v1/agents/{agent}"),
        ("POST", "/v1/agents"),
        ("GET", "/v1/policies/{policy}"),
        ("DELETE", "/v1/policies/{policy}"),
        ("POST", "/v1/api-keys"),
        ("DELETE", "/v1/api-keys/{key}"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_unknown_query_parameter_on_any_endpoint_is_400(client, admin_headers, world, method, path):
    """A caller adding ``?cascade=false`` or ``?dry_run=1`` must not have it silently ignored."""
    before = snapshot(client, admin_headers)
    body = {"name": "x", "scopes": ["admin"]} if method == "POST" and "keys" in path else None
    body = body or ({"name": "x"} if method in {"POST", "PATCH"} else None)
    response = _send(client, world, method, path + "?dry_run=1", admin_headers, json=body)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert "dry_run" in [d["field"] for d in error["details"]]
    assert snapshot(client, admin_headers) == before


# --- public endpoints -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer svc_" + "0" * 32}, {"Authorization": "garbage"}],
    ids=["no-key", "unknown-key", "malformed-key"],
)
def test_healthz_needs_no_key(client, headers):
    response = client.get("/healthz", headers=headers)
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


@pytest.fixture
def openapi(client) -> Any:
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    return response.get_json()


def test_openapi_document_is_served_without_a_key_as_openapi_3_1(openapi):
    assert re.fullmatch(r"3\.1\.\d+", openapi["openapi"])
    assert openapi["info"]["title"]
    assert openapi["info"]["version"]


def test_openapi_document_is_valid_openapi_3_1(openapi):
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(openapi)


REQUEST_BODIES = {
    ("/v1/agents", "post"): ("agent.json", "create"),
    ("/v1/agents/{id}", "patch"): ("agent.json", "update"),
    ("/v1/policies", "post"): ("policy.json", "create"),
    ("/v1/policies/{id}", "patch"): ("policy.json", "update"),
    ("/v1/api-keys", "post"): ("api-key.json", "create"),
}


def _as_component(node: Any, file: str) -> Any:
    """A schema from ``schemas/`` as it should read inside the OpenAPI document: every
    ``other.json#/$defs/x`` and ``#/$defs/x`` pointing at ``#/components/schemas/other.x``."""
    if isinstance(node, dict):
        out = {k: _as_component(v, file) for k, v in node.items()}
        if isinstance(out.get("$ref"), str):
            target, _, name = out["$ref"].partition("#/$defs/")
            out["$ref"] = f"#/components/schemas/{(target or file).removesuffix('.json')}.{name}"
        return out
    if isinstance(node, list):
        return [_as_component(v, file) for v in node]
    return node


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


@pytest.mark.parametrize(
    ("route", "file", "name"),
    [(route, file, name) for route, (file, name) in REQUEST_BODIES.items()],
    ids=[f"{method.upper()} {path}" for path, method in REQUEST_BODIES],
)
def test_openapi_request_bodies_are_the_schemas_from_the_contract(openapi, route, file, name):
    path, method = route
    body = openapi["paths"][path][method]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    component = _resolve(openapi, schema["$ref"])
    assert component == _as_component(load_schema(file)["$defs"][name], file)


def test_openapi_every_request_body_is_a_schema_from_the_contract(openapi):
    contract = {
        f"#/components/schemas/{file.removesuffix('.json')}.{name}"
        for file in FILES
        for name in load_schema(file).get("$defs", {})
    }
    bodies = {
        (path, method): operation["requestBody"]["content"]["application/json"]["schema"]
        for path, operations in openapi["paths"].items()
        for method, operation in operations.items()
        if isinstance(operation, dict) and "requestBody" in operation
    }
    assert set(REQUEST_BODIES) <= set(bodies)
    for route, schema in bodies.items():
        assert set(schema) == {"$ref"}, route
        assert schema["$ref"] in contract, route


def test_openapi_has_every_schema_definition_and_no_dangling_reference(openapi):
    components = openapi["components"]["schemas"]
    for file in FILES:
        for name, schema in load_schema(file).get("$defs", {}).items():
            key = f"{file.removesuffix('.json')}.{name}"
            assert components[key] == _as_component(schema, file), key

    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(openapi)
    assert refs
    for ref in refs:
        _resolve(openapi, ref)  # KeyError on a dangling reference


def test_openapi_describes_every_route_the_service_serves(app, openapi):
    served: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("dashboard."):
            continue  # files, not API: the dashboard page is a client of the documented API
        path = re.sub(r"<(?:[^:>]+:)?[^>]+>", "{id}", rule.rule)
        served.setdefault(path, set()).update(m.lower() for m in rule.methods or ())
    for path, methods in served.items():
        if path == "/v1/openapi.json":
            continue
        documented = {m for m in openapi["paths"].get(path, {}) if m != "parameters"}
        assert documented == methods - {"head", "options"}, path
