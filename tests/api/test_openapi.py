"""GET /v1/openapi.json: a valid OpenAPI 3.1 document of the whole API, whose request schemas
are the files in schemas/ (one contract), served without a key."""

from __future__ import annotations

import re

from openapi_spec_validator import validate

from schemas import FILES, load_schema


def test_document_is_valid_openapi_31(client):
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    assert response.json["openapi"] == "3.1.0"
    validate(response.json)


def test_every_route_of_the_app_is_documented(app, client):
    documented = {
        (path, method.upper())
        for path, ops in client.get("/v1/openapi.json").json["paths"].items()
        for method in ops
    }
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("dashboard."):
            continue  # files, not API: the dashboard page is a client of the documented API
        path = re.sub(r"<[a-z_]+>", "{id}", rule.rule)  # every path parameter is an id
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert (path, method) in documented


def test_request_bodies_are_the_schema_files(client):
    doc = client.get("/v1/openapi.json").json
    components = doc["components"]["schemas"]
    policy_rule = load_schema("policy.json")["$defs"]["rule"]
    assert components["policy.rule"]["properties"].keys() == policy_rule["properties"].keys()
    body = doc["paths"]["/v1/policies"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/policy.create"}
    for file in FILES:
        for name in load_schema(file).get("$defs", {}):
            assert f"{file.removesuffix('.json')}.{name}" in components


def test_the_document_states_the_rules_the_service_enforces_on_strings(client):
    """Found by the schemathesis run (tests/fuzz): each was a valid request by the document
    that the service refused."""
    doc = client.get("/v1/openapi.json").json
    components = doc["components"]["schemas"]
    no_nul = components["common.text"]["pattern"]
    assert components["common.description"]["pattern"] == no_nul
    # names refuse controls, format characters and whitespace first or last, as written
    assert (
        components["common.name"]["allOf"] == load_schema("common.json")["$defs"]["name"]["allOf"]
    )
    assert components["policy.toolPattern"]["$ref"] == "#/components/schemas/common.name"
    tool_name = components["authorize.request"]["properties"]["tool_name"]
    assert tool_name["$ref"] == "#/components/schemas/common.name"
    constraint = components["policy.parameterConstraint"]["properties"]
    assert constraint["regex"]["format"] == "re2"
    assert constraint["enum"]["items"] == {"$ref": "#/components/schemas/common.text"}
    zone = components["policy.timeWindow"]["properties"]["timezone"]
    assert zone["format"] == "iana-time-zone"
    expiry = components["api-key.create"]["properties"]["expiresAt"]
    assert expiry["format"] == "date-time"
    filters = {p["name"]: p["schema"] for p in doc["paths"]["/v1/audit-logs"]["get"]["parameters"]}
    assert filters["action"] == filters["tool_name"] == {"$ref": "#/components/schemas/common.text"}


def test_a_404_is_listed_only_where_one_can_happen(client):
    """Creating an agent or a key, and asking for a decision (an unknown agent is a 200 denial),
    never answer 404; creating a policy for an agent that is not there does."""
    paths = client.get("/v1/openapi.json").json["paths"]
    for path in ("/v1/agents", "/v1/api-keys", "/v1/authorize"):
        assert "404" not in paths[path]["post"]["responses"], path
    assert "AGENT_NOT_FOUND" in paths["/v1/policies"]["post"]["responses"]["404"]["description"]
    for path, ops in paths.items():
        if "{id}" in path:
            assert all("404" in op["responses"] for op in ops.values()), path
