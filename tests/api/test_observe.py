"""What operators see: X-Request-Id on every response, one JSON access line per request (never
a key), and /readyz that tells a load balancer whether this instance can serve."""

from __future__ import annotations

import json
import logging
import re

import pytest

from api import create_app
from core.config import Settings
from tests.conftest import bearer

HEX_ID = re.compile(r"[0-9a-f]{32}")


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentauth.access"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/agents", 200),
        ("GET", "/v1/agents/not-a-uuid", 400),
        ("GET", "/v1/nothing-here", 404),
        ("GET", "/healthz", 200),
    ],
)
def test_every_response_has_a_request_id_and_one_access_line(
    client, admin_headers, caplog, method, path, status
):
    caplog.set_level(logging.INFO, logger="agentauth.access")
    response = client.open(path, method=method, headers=admin_headers)
    assert response.status_code == status
    request_id = response.headers["X-Request-Id"]
    assert HEX_ID.fullmatch(request_id)
    [line] = _lines(caplog)
    assert line["request_id"] == request_id
    assert (line["method"], line["path"], line["status"]) == (method, path, status)
    assert line["level"] == "info"
    assert line["duration_ms"] >= 0
    assert line["ts"].endswith("Z")


def test_the_line_names_the_caller_by_workspace_and_key_id_never_the_key(client, workspace, caplog):
    caplog.set_level(logging.INFO, logger="agentauth.access")
    key = workspace.key("admin")
    client.get("/v1/agents?limit=5", headers=bearer(key))
    client.get("/v1/agents", headers=bearer("svc_" + "0" * 32))
    authenticated, refused = _lines(caplog)
    assert authenticated["workspace"] == workspace.id
    assert authenticated["key_id"]
    assert authenticated["path"] == "/v1/agents"  # never the query string
    assert (refused["status"], refused["workspace"], refused["key_id"]) == (401, None, None)
    assert key not in caplog.text
    assert key[4:] not in caplog.text
    assert "0" * 32 not in caplog.text


@pytest.mark.parametrize(
    ("offered", "kept"),
    [
        ("req-42.a:b_C", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ("<script>", False),
        ("", False),
        ("svc_" + "ab" * 16, False),
        ("trace-svc_" + "0" * 32 + "-1", False),
    ],
    ids=["sane", "128-chars", "129-chars", "space", "markup", "empty", "a-key", "holds-a-key"],
)
def test_a_sane_request_id_is_kept_anything_else_replaced(
    client, admin_headers, caplog, offered, kept
):
    caplog.set_level(logging.INFO, logger="agentauth.access")
    response = client.get("/v1/agents", headers={**admin_headers, "X-Request-Id": offered})
    returned = response.headers["X-Request-Id"]
    if kept:
        assert returned == offered
    else:
        assert HEX_ID.fullmatch(returned)
    assert _lines(caplog)[0]["request_id"] == returned


def test_readyz_is_ready_on_a_migrated_database(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json == {"status": "ready"}


def test_readyz_is_503_when_the_database_cannot_be_reached(tmp_path):
    missing = tmp_path / "no-such-folder" / "agentauth.db"
    app = create_app(Settings(database_url=f"sqlite:///{missing}"))
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    assert response.json["error"]["code"] == "NOT_READY"
    assert "cannot be reached" in response.json["error"]["message"]
    assert response.headers["X-Request-Id"]


def test_readyz_is_503_while_the_schema_is_behind(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}"))
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    assert "agentauth db upgrade" in response.json["error"]["message"]
