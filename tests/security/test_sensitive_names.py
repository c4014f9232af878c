"""Issue #22, finding 6: a secret under a name written as one word (``dbpassword``,
``clientsecret``, ``SECRETKEY``) is a secret too (decisions §4).

A table of names says which are sensitive; then one call holding a value under each name must
not show any of those values wherever an audited call is shown again: the audit list, both
exports, the approval it created (and so the webhook event made of it), and ``plan``'s examples.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from api import create_app
from controller.repo import load_repo
from controller.sources import read_files
from core.config import Settings
from core.domain.redaction import MASK, is_sensitive, redact
from core.store.models import WebhookEvent
from tests.api.helpers import decide, make_agent
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files

#: (name, sensitive): every example of decisions §4 and of the finding, and their neighbours
NAMES = [
    # decisions §4's examples
    ("client_secret", True),
    ("X-Api-Key", True),
    ("APIKEY", True),
    ("privateKey", True),
    ("userPassword", True),
    ("dbpassword", True),
    ("SECRETKEY", True),
    ("max_tokens", False),
    ("keyboard", False),
    ("author", False),
    # the finding's
    ("userpassword", True),
    ("userPassWord", True),
    ("clientsecret", True),
    ("secretkey", True),
    # each listed substring, inside a name written as one word
    ("DBPASSWORD", True),
    ("mysqlpasswd", True),
    ("appsecretvalue", True),
    ("awscredentialsfile", True),
    ("xapikey", True),
    ("sshprivatekey", True),
    ("googleaccesstoken", True),
    ("oauthrefreshtoken", True),
    ("slackauthtoken", True),
    ("usersessiontoken", True),
    ("oidcidtoken", True),
    # a listed substring broken by separators or case is found once they are gone
    ("pass_word", True),
    ("Pass.Word", True),
    ("api-Key-value", True),
    ("Access_Token_v2", True),
    # the word rule and the spec's list, unchanged
    ("password", True),
    ("token", True),
    ("key", True),
    ("auth", True),
    ("Cookie", True),
    ("authorization", True),
    ("api_key", True),
    ("refresh_token", True),
    ("x_auth_token", True),
    ("AWS_SECRET_ACCESS_KEY", True),
    # names that merely look alike
    ("maxTokens", False),
    ("tokens", False),
    ("tokenizer", False),
    ("authority", False),
    ("keynote", False),
    ("monkey", False),
    ("passage", False),
    ("passport", False),
    ("session_id", False),
    ("idempotence", False),
    ("name", False),
    ("", False),
]


@pytest.mark.parametrize(("name", "sensitive"), NAMES, ids=[n or "<empty>" for n, _ in NAMES])
def test_which_names_are_sensitive(name: str, sensitive: bool) -> None:
    assert is_sensitive(name) is sensitive
    assert (redact({name: "v"}) == {name: MASK}) is sensitive


# ------------------------------------------------------------------ where values are shown again

#: the finding's names: the value under each is a marker that must never be shown again
FINDING = ["dbpassword", "userpassword", "userPassWord", "clientsecret", "secretkey", "SECRETKEY"]


def planted() -> tuple[dict[str, Any], list[str]]:
    """Parameters holding a marker under each of the finding's names, at the top, nested in an
    object and in an array; and the markers."""
    marker = secrets.token_hex(6)
    values = {name: f"planted-{marker}-{name}" for name in FINDING}
    nested = {name: f"{value}-nested" for name, value in values.items()}
    listed = {name: f"{value}-listed" for name, value in values.items()}
    parameters = {**values, "config": nested, "items": [listed], "amount": 5}
    return parameters, [*values.values(), *nested.values(), *listed.values()]


def assert_hidden(text: str, markers: list[str]) -> None:
    shown = [m for m in markers if m in text]
    assert not shown, f"shown in clear: {shown}"


RULES = [
    {"type": "require_approval", "tools": ["payments.*"]},
    {"type": "tool_allowlist", "tools": ["*"]},
]


@pytest.fixture
def calls(settings, clock, workspace) -> Any:
    """An app that allows webhooks to 127.0.0.1 (the event is stored, never delivered here),
    one allowed and one escalated call holding the planted values."""
    app = create_app(replace(settings, webhook_allow_private=True), clock=clock)
    client = app.test_client()
    headers = workspace.headers("admin")
    hook = client.post(
        "/v1/webhooks",
        json={"url": "http://127.0.0.1:9/hook", "events": ["approval.requested"]},
        headers=headers,
    )
    assert hook.status_code == 201, hook.get_data(as_text=True)
    agent = make_agent(client, headers, "planted", RULES)
    parameters, markers = planted()
    allowed = decide(client, headers, agent, "files.read", **parameters)
    assert allowed["allowed"] is True
    escalated = decide(client, headers, agent, "payments.refund", **parameters)
    assert escalated["outcome"] == "escalated"
    yield app, client, headers, escalated["approvalId"], markers
    client.delete(f"/v1/webhooks/{hook.json['id']}", headers=headers)  # nothing left to deliver
    app.extensions["agentauth"].close()


def test_the_audit_list_hides_them(calls) -> None:
    _app, client, headers, _approval, markers = calls
    response = client.get("/v1/audit-logs", headers=headers)
    assert response.status_code == 200
    entries = response.json["data"]
    assert len(entries) == 2
    assert_hidden(response.get_data(as_text=True), markers)
    for entry in entries:
        assert {entry["parameters"][name] for name in FINDING} == {MASK}
        assert entry["parameters"]["amount"] == 5


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_the_exports_hide_them(calls, kind: str) -> None:
    _app, client, headers, _approval, markers = calls
    response = client.get("/v1/audit-logs/export", query_string={"format": kind}, headers=headers)
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    assert text.count(MASK) >= 2 * 3 * len(FINDING)
    assert_hidden(text, markers)


def test_the_approval_and_its_webhook_event_hide_them(calls, workspace) -> None:
    app, client, headers, approval, markers = calls
    response = client.get(f"/v1/approvals/{approval}", headers=headers)
    assert response.status_code == 200
    assert_hidden(response.get_data(as_text=True), markers)
    assert {response.json["parameters"][name] for name in FINDING} == {MASK}
    assert_hidden(client.get("/v1/approvals", headers=headers).get_data(as_text=True), markers)
    with app.extensions["agentauth"].db.transaction() as session:
        query = select(WebhookEvent.payload).where(WebhookEvent.workspace_id == workspace.id)
        payloads = list(session.scalars(query))
    assert [p["data"]["id"] for p in payloads] == [approval]
    assert_hidden(json.dumps(payloads[0]), markers)


POLICY = """
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: payments
spec:
  agent: planted-agent
  rules:
    - type: tool_allowlist
      tools: [{tools}]
"""


def test_plan_examples_hide_them(cli, database_url: str, tmp_path: Path) -> None:
    """``plan`` shows recorded calls whose decision would flip: with their parameters as audited."""
    repo, ws = tmp_path / "repo", f"planted-{secrets.token_hex(5)}"
    files = {"agents/a.yaml": agent_doc("planted-agent"), "policies/p.yaml": POLICY}
    write_files(repo, {**files, "policies/p.yaml": POLICY.format(tools='"payments.*"')})
    assert cli("apply", repo, "--workspace", ws).exit_code == 0
    app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
    try:
        tenant = Tenant(app, ws, FakeClock())
        agent = load_repo(read_files(repo), ws).agents["planted-agent"].id
        parameters, markers = planted()
        decision = decide(
            app.test_client(), tenant.headers("admin"), agent, "payments.refund", **parameters
        )
        assert decision["allowed"] is True
    finally:
        app.extensions["agentauth"].close()
    write_files(repo, {"policies/p.yaml": POLICY.format(tools='"files.*"')})
    as_json = cli("plan", repo, "--workspace", ws, "--format", "json")
    examples = json.loads(as_json.stdout)["impact"][0]["examples"]
    assert len(examples) == 1
    assert {examples[0]["parameters"][name] for name in FINDING} == {MASK}
    assert_hidden(as_json.stdout, markers)
    assert_hidden(cli("plan", repo, "--workspace", ws).stdout, markers)
