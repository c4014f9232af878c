"""The isolation and scope matrix, for every operation of the service's own OpenAPI document.

Two workspaces, A and B, each hold one of everything the API serves: an agent with a policy, a
suspended agent, an agent and a policy managed by the GitOps controller (which also writes the
sync status: no API does), API keys of both scopes, and audit entries written by real
``POST /v1/authorize`` calls. A's keys then aim at B:

- every operation with an id in its path, with each of B's ids (of every kind, and in upper
  case): 404 with the code of the path's resource kind, never 200/204/403/409;
- every operation that takes an id in its body or as a query filter, with each of B's ids:
  policy create is 404 ``AGENT_NOT_FOUND``, authorize is the unknown-agent decision (the same
  answer as for an id that exists nowhere), filters find nothing of B's;
- a read-only key of A on every admin operation, with A's own ids, B's ids and an id that
  exists nowhere: 403 ``INSUFFICIENT_SCOPE`` (scope is checked before the id is looked up, so
  the answer cannot tell whose id it was); on every other operation it is served.

``test_the_matrix_covers_every_operation_of_the_document`` fails when an operation is added to
the document without an entry in ``MATRIX``.

"Changes nothing". A workspace's state is what its own admin key reads (``WATCHED``): the lists
of agents, policies and API keys, the audit log and the sync status. The lists carry every field
of every object (a single read serializes the same way: the full reading, made before the first
case and after the last, checks it object by object and adds the CSV export and the per-agent
policy filter). Reading writes exactly one thing: the reading key's count of requests this
minute, shown only in that key's own ``X-RateLimit-*`` headers, which are not part of a reading
(there is no ``lastUsedAt``). So between two readings nothing may change, except A's audit log
when A itself calls ``POST /v1/authorize``; the cases that do account for it entry by entry.
Both workspaces are read after every case; the reading before is the one the previous case (or
the setup) ended with, so each case is compared with the state it started from.
"""

from __future__ import annotations

import csv
import io
import secrets
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask.testing import FlaskClient

from api import create_app
from controller.apply import apply_repo
from controller.load import SourceFile
from controller.repo import load_repo
from controller.sources import content_hash
from core.config import Settings
from core.store.database import Database
from tests.api.helpers import assert_error
from tests.conftest import FakeClock, Tenant, bearer

PUBLIC, ANY, ADMIN = "public", "any", "admin"
AGENT, POLICY, KEY, APPROVAL, WEBHOOK = "agent", "policy", "key", "approval", "webhook"
NOT_FOUND = {
    AGENT: "AGENT_NOT_FOUND",
    POLICY: "POLICY_NOT_FOUND",
    KEY: "API_KEY_NOT_FOUND",
    APPROVAL: "APPROVAL_NOT_FOUND",
    WEBHOOK: "WEBHOOK_NOT_FOUND",
}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
NOBODY = "0b7d4f6e-9c1a-4e2b-8f3d-5a6b7c8d9e0f"  # a well-formed id of nothing anywhere

ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]
DENY_ALL = [{"type": "tool_denylist", "tools": ["*"]}]
PROBE_TOOL = "files.read"  # a tool B's policies would allow, were they ever evaluated for A
#: a public address literal: taken without a DNS lookup; nothing is ever delivered there (the
#: webhooks are made after the only calls that raise events)
HOOK_URL = "https://1.1.1.1/agentauth"


@dataclass(frozen=True)
class Entry:
    """How the matrix covers one operation of the OpenAPI document."""

    scope: str  # PUBLIC (no key), ANY or ADMIN: what the document says the operation needs
    path_kind: str | None = None  # what the ``{id}`` of the path names
    id_field: str | None = None  # a query or body member that names an agent
    body: Callable[[str], dict[str, Any]] | None = None  # a valid body, given an agent id of A
    note: str = ""  # why an operation without any id is in the matrix as it is


MATRIX: dict[tuple[str, str], Entry] = {
    ("POST", "/v1/agents"): Entry(
        ADMIN,
        body=lambda _: {"name": "made-by-a", "description": "should not exist"},
        note="no id: in the read-only matrix only",
    ),
    ("GET", "/v1/agents"): Entry(ANY, note="no id: the caller's own agents, nothing of B's"),
    ("GET", "/v1/agents/{id}"): Entry(ANY, path_kind=AGENT),
    ("GET", "/v1/agents/{id}/usage"): Entry(ANY, path_kind=AGENT),
    ("PATCH", "/v1/agents/{id}"): Entry(
        ADMIN,
        path_kind=AGENT,
        body=lambda _: {"name": "taken-over", "description": None, "status": "revoked"},
    ),
    ("DELETE", "/v1/agents/{id}"): Entry(ADMIN, path_kind=AGENT),
    ("POST", "/v1/policies"): Entry(
        ADMIN,
        id_field="agent_id",
        body=lambda agent: {
            "agent_id": agent,
            "name": "planted",
            "rules": ALLOW_ALL,
            "priority": 1000,
        },
    ),
    ("GET", "/v1/policies"): Entry(ANY, id_field="agent_id"),
    ("GET", "/v1/policies/{id}"): Entry(ANY, path_kind=POLICY),
    ("GET", "/v1/policies/{id}/shadow-report"): Entry(ANY, path_kind=POLICY),
    ("PATCH", "/v1/policies/{id}"): Entry(
        ADMIN,
        path_kind=POLICY,
        body=lambda _: {"name": "taken-over", "rules": DENY_ALL, "priority": 0, "enabled": False},
    ),
    ("DELETE", "/v1/policies/{id}"): Entry(ADMIN, path_kind=POLICY),
    ("POST", "/v1/api-keys"): Entry(
        ADMIN,
        body=lambda _: {"name": "escalated", "scopes": ["admin"]},
        note="no id: in the read-only matrix only",
    ),
    ("GET", "/v1/api-keys"): Entry(
        ADMIN, note="no id; listing keys needs the admin scope (decisions.md 4, an extension)"
    ),
    ("DELETE", "/v1/api-keys/{id}"): Entry(ADMIN, path_kind=KEY),
    ("POST", "/v1/authorize"): Entry(
        ANY,
        id_field="agent_id",
        body=lambda agent: {"agent_id": agent, "tool_name": PROBE_TOOL, "parameters": {"n": 1}},
        note="a mutation a read-only key may call (spec, Authentication 4); it writes only the "
        "caller's own audit log",
    ),
    ("GET", "/v1/audit-logs"): Entry(ANY, id_field="agent_id"),
    ("GET", "/v1/audit-logs/export"): Entry(ANY, id_field="agent_id"),
    ("GET", "/v1/audit-logs/stats"): Entry(ANY, id_field="agent_id"),
    ("GET", "/v1/audit-logs/checkpoint"): Entry(
        ANY, note="no id: the caller's own chain's head, signed; B's stays as it was"
    ),
    ("GET", "/v1/audit-logs/public-key"): Entry(
        ANY, note="no id: the server's verifier key, public and the same for every workspace"
    ),
    ("GET", "/v1/audit-logs/retention"): Entry(
        ANY, note="no id: what the caller's own log keeps; B's stays as it was"
    ),
    ("GET", "/v1/sync-status"): Entry(
        ANY, note="no id: the caller's own workspace's status, nothing of B's"
    ),
    ("GET", "/v1/whoami"): Entry(ANY, note="no id: the caller's own key, nothing of B's"),
    ("GET", "/v1/approvals"): Entry(ANY, id_field="agent_id"),
    ("GET", "/v1/approvals/{id}"): Entry(ANY, path_kind=APPROVAL),
    ("POST", "/v1/approvals/{id}/approve"): Entry(
        ADMIN, path_kind=APPROVAL, body=lambda _: {"comment": "approved by A"}
    ),
    ("POST", "/v1/approvals/{id}/deny"): Entry(
        ADMIN, path_kind=APPROVAL, body=lambda _: {"comment": "denied by A"}
    ),
    ("POST", "/v1/webhooks"): Entry(
        ADMIN,
        body=lambda _: {"url": HOOK_URL, "events": ["approval.requested"]},
        note="no id: in the read-only matrix only",
    ),
    ("GET", "/v1/webhooks"): Entry(ADMIN, note="no id; webhooks are the admin's, the caller's own"),
    ("DELETE", "/v1/webhooks/{id}"): Entry(ADMIN, path_kind=WEBHOOK),
    ("GET", "/v1/webhooks/{id}/deliveries"): Entry(ADMIN, path_kind=WEBHOOK),
    ("GET", "/v1/openapi.json"): Entry(
        PUBLIC, note="no key, no workspace: the same document for everyone"
    ),
    ("GET", "/healthz"): Entry(PUBLIC, note="no key, no workspace: liveness only"),
    ("GET", "/readyz"): Entry(PUBLIC, note="no key, no workspace: database reachable and current"),
    ("GET", "/metrics"): Entry(
        PUBLIC,
        note="no key, no id; global counts plus every workspace's id and applied revision, by "
        "design (api/metrics.py: keep it on an internal network)",
    ),
}

#: methods the document does not list on a path with an id: 405 for B's id as for any id
#: (and Flask's own HEAD and OPTIONS, on every route: they too answer as for any id)
AUTOMATIC = ("HEAD", "OPTIONS")
UNDOCUMENTED = {
    "/v1/agents/{id}": ("POST", "PUT"),
    "/v1/policies/{id}": ("POST", "PUT"),
    "/v1/api-keys/{id}": ("GET", "POST", "PUT", "PATCH"),
    "/v1/approvals/{id}": ("POST", "PUT", "PATCH", "DELETE"),
    "/v1/approvals/{id}/approve": ("GET", "PUT", "PATCH", "DELETE"),
    "/v1/approvals/{id}/deny": ("GET", "PUT", "PATCH", "DELETE"),
    "/v1/webhooks/{id}": ("GET", "POST", "PUT", "PATCH"),
    "/v1/webhooks/{id}/deliveries": ("POST", "PUT", "PATCH", "DELETE"),
}

#: each workspace's ids, by what they name; the first of each kind is that kind's main one
TARGETS = {
    "agent": AGENT,
    "suspended-agent": AGENT,
    "git-agent": AGENT,
    "policy": POLICY,
    "git-policy": POLICY,
    "admin-key": KEY,  # the key the workspace's own readings are made with
    "spare-key": KEY,
    "read-only-key": KEY,
    "audit-entry": None,  # no path names one; still an id of B's
    "approval": APPROVAL,  # pending: B's agent made a call its policy sends to a human
    "webhook": WEBHOOK,
}
FIRST = {
    AGENT: "agent",
    POLICY: "policy",
    KEY: "spare-key",
    APPROVAL: "approval",
    WEBHOOK: "webhook",
}
#: B's ids as A tries them: each one, and the main one of each kind in upper case
B_IDS = [*TARGETS, *(f"{FIRST[kind]}:upper" for kind in FIRST)]

WATCHED = (
    "/v1/agents?limit=200",
    "/v1/policies?limit=200",
    "/v1/api-keys?limit=200",
    "/v1/audit-logs?limit=1000",
    "/v1/sync-status",
    "/v1/approvals?limit=200",
    "/v1/webhooks?limit=200",
)
AUDIT = "/v1/audit-logs?limit=1000"
CHAIN = "/v1/audit-logs/export?format=jsonl"
CHECKPOINT = "/v1/audit-logs/checkpoint"


# --- the two workspaces ---------------------------------------------------------------------


def repo_files(marker: str) -> list[SourceFile]:
    text = f"""
apiVersion: agentauth/v1
kind: Agent
metadata:
  name: {marker}-git-agent
spec:
  description: managed from git for {marker}
---
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: {marker}-git-policy
spec:
  agent: {marker}-git-agent
  priority: 5
  rules:
    - type: tool_allowlist
      tools: ["*"]
"""
    return [SourceFile("policies.yaml", text.encode())]


@dataclass
class Side:
    """One workspace of the matrix: its keys, the ids of what it holds, its last reading."""

    tenant: Tenant
    marker: str  # in every name, description, tool and source of this workspace
    admin: dict[str, str]
    read_only: dict[str, str]
    ids: dict[str, str]
    secrets: set[str] = field(default_factory=set)  # what no other workspace may ever see
    reading: dict[str, Any] = field(default_factory=dict)

    def id(self, target: str) -> str:
        name, _, case = target.partition(":")
        found = self.ids[name]
        return found.upper() if case == "upper" else found


def populate(client: FlaskClient, db: Database, tenant: Tenant, clock: FakeClock) -> Side:
    """A workspace holding one of everything, made through the API wherever the API can."""
    marker = tenant.name.replace("-", "")
    admin_key = tenant.key("admin")  # the first key of a workspace: no API can make it
    admin = bearer(admin_key)

    files = repo_files(marker)
    applied = apply_repo(
        db,
        load_repo(files, tenant.name),
        workspace=tenant.name,
        revision=content_hash(files),
        source=f"/srv/policies/{marker}",
        now=clock(),
    )
    assert applied.ok, applied.error

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post(path, json=body, headers=admin)
        assert response.status_code in (200, 201), response.get_data(as_text=True)
        return dict(response.json)

    agent = post("/v1/agents", {"name": f"{marker}-agent", "description": f"{marker} refunds"})
    suspended = post("/v1/agents", {"name": f"{marker}-suspended"})
    patched = client.patch(
        f"/v1/agents/{suspended['id']}", json={"status": "suspended"}, headers=admin
    )
    assert patched.status_code == 200
    rules = [
        {"type": "tool_denylist", "tools": [f"{marker}.danger"]},
        {"type": "require_approval", "tools": [f"{marker}.pay"]},
        {"type": "tool_allowlist", "tools": ["*"]},
        {
            "type": "rate_limit",
            "tools": ["*"],
            "rateLimit": {"maxCalls": 1000, "windowSeconds": 60},
        },
    ]
    policy = post(
        "/v1/policies",
        {"agent_id": agent["id"], "name": f"{marker}-policy", "rules": rules, "priority": 10},
    )
    spare = post("/v1/api-keys", {"name": f"{marker}-spare", "scopes": ["admin"]})
    auditor = post(
        "/v1/api-keys",
        {"name": f"{marker}-auditor", "scopes": ["read-only"], "expiresAt": "2031-01-01T00:00:00Z"},
    )
    listed = client.get("/v1/agents", headers=admin).json["data"]
    [git_agent] = [a for a in listed if a["managedBy"] == "git"]
    [git_policy] = [
        p for p in client.get("/v1/policies", headers=admin).json["data"] if p["managedBy"]
    ]
    [own_key] = [
        k
        for k in client.get("/v1/api-keys", headers=admin).json["data"]
        if k["prefix"] == admin_key[:10]
    ]

    audit_ids = []
    for agent_id, tool, parameters in [
        (agent["id"], f"{marker}.read", {"query": marker, "token": f"{marker}-secret"}),
        (agent["id"], f"{marker}.danger", {"path": f"/home/{marker}"}),
        (agent["id"], f"{marker}.pay", {"amount": 5000, "to": marker}),
        (git_agent["id"], f"{marker}.sync", {}),
        (suspended["id"], f"{marker}.read", {}),
        (str(uuid.uuid4()), f"{marker}.ghost", {}),
    ]:
        body = {"agent_id": agent_id, "tool_name": tool, "parameters": parameters}
        decision = post("/v1/authorize", body)
        audit_ids.append(decision["auditId"])
        if decision["outcome"] == "escalated":
            approval_id = decision["approvalId"]
    hook = post("/v1/webhooks", {"url": HOOK_URL, "events": ["approval.requested"]})

    ids = {
        "agent": agent["id"],
        "suspended-agent": suspended["id"],
        "git-agent": git_agent["id"],
        "policy": policy["id"],
        "git-policy": git_policy["id"],
        "admin-key": own_key["id"],
        "spare-key": spare["id"],
        "read-only-key": auditor["id"],
        "audit-entry": audit_ids[0],
        "approval": approval_id,
        "webhook": hook["id"],
    }
    side = Side(tenant, marker, admin, bearer(auditor["key"]), ids)
    side.reading = read_state(client, admin)
    side.secrets = {marker, tenant.id, admin_key, spare["key"], auditor["key"], *ids.values()}
    side.secrets.add(hook["secret"])
    side.secrets |= _identifiers(side.reading)
    return side


def _identifiers(node: Any) -> set[str]:
    """Every id, key prefix and revision in a reading."""
    found: set[str] = set()
    if isinstance(node, dict):
        for name, value in node.items():
            if isinstance(value, str) and (
                name in {"id", "agentId", "policyId", "prefix"} or name.endswith("Revision")
            ):
                found.add(value.lower())
            found |= _identifiers(value)
    elif isinstance(node, list | tuple):
        for value in node:
            found |= _identifiers(value)
    return found


def read_state(client: FlaskClient, headers: dict[str, str]) -> dict[str, Any]:
    """What the workspace's own admin key sees: each watched read's status and body."""
    reading: dict[str, Any] = {}
    for path in WATCHED:
        response = client.get(path, headers=headers)
        body = response.json
        reading[path] = (response.status_code, body)
        if response.status_code == 200 and "pagination" in body:
            assert body["pagination"]["total"] == len(body["data"]), f"{path} is cut"
    return reading


def full_reading(client: FlaskClient, headers: dict[str, str]) -> dict[str, Any]:
    """The watched reads, every object read on its own (which must be what its list shows),
    the policies of each agent, and the CSV export (one row per audit entry)."""
    reading = read_state(client, headers)
    approvals = next(p for p in WATCHED if p.startswith("/v1/approvals"))
    for noun, path in (("agents", WATCHED[0]), ("policies", WATCHED[1]), ("approvals", approvals)):
        for item in reading[path][1]["data"]:
            one = client.get(f"/v1/{noun}/{item['id']}", headers=headers)
            assert one.status_code == 200
            assert one.json == item
            reading[f"/v1/{noun}/{item['id']}"] = one.json
    for agent in reading[WATCHED[0]][1]["data"]:
        path = f"/v1/policies?agent_id={agent['id']}"
        reading[path] = client.get(path, headers=headers).json
        expected = [p for p in reading[WATCHED[1]][1]["data"] if p["agentId"] == agent["id"]]
        assert reading[path]["data"] == expected
    export = client.get("/v1/audit-logs/export", headers=headers)
    rows = list(csv.reader(io.StringIO(export.get_data(as_text=True))))
    assert len(rows) - 1 == len(reading[AUDIT][1]["data"])
    reading["/v1/audit-logs/export"] = (
        export.status_code,
        export.headers["Content-Type"],
        export.headers["Content-Disposition"],
        export.headers.get("X-Svc-Export-Truncated"),
        rows,
    )
    chain = client.get("/v1/audit-logs/export?format=jsonl", headers=headers)
    reading[CHAIN] = (chain.status_code, chain.get_data(as_text=True))
    note = client.get("/v1/audit-logs/checkpoint", headers=headers)
    reading[CHECKPOINT] = (note.status_code, note.get_data(as_text=True))
    return reading


@dataclass(frozen=True)
class Change:
    """A workspace's reading before and after one case."""

    before: dict[str, Any]
    after: dict[str, Any]

    def assert_unchanged(self) -> None:
        changed = [path for path in self.after if self.after[path] != self.before.get(path)]
        assert self.after == self.before, f"changed: {changed}"

    def assert_only_new_audit_entries(self, audit_ids: set[str]) -> list[dict[str, Any]]:
        """Nothing changed but these entries, added to the audit log; they are returned."""
        rest = [path for path in self.after if path != AUDIT]
        assert {p: self.after[p] for p in rest} == {p: self.before[p] for p in rest}
        (_, before), (status, after) = self.before[AUDIT], self.after[AUDIT]
        assert status == 200
        old = {entry["id"] for entry in before["data"]}
        new = [entry for entry in after["data"] if entry["id"] not in old]
        assert {entry["id"] for entry in new} == audit_ids
        assert [entry for entry in after["data"] if entry not in new] == before["data"]
        assert after["pagination"]["total"] == before["pagination"]["total"] + len(new)
        return new


@dataclass
class World:
    client: FlaskClient
    document: dict[str, Any]
    a: Side
    b: Side
    sent: set[str] = field(default_factory=set)  # agent ids A named in its authorize calls

    def call(
        self,
        headers: dict[str, str],
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        if path == "/v1/authorize" and body is not None:
            self.sent.add(body["agent_id"].lower())
        return self.client.open(path, method=method, headers=headers, json=body, query_string=query)

    def settle(self) -> tuple[Change, Change]:
        """Read both workspaces again: (A's change, B's change) since the last reading."""
        changes = []
        for side in (self.a, self.b):
            after = read_state(self.client, side.admin)
            changes.append(Change(side.reading, after))
            side.reading = after
        return changes[0], changes[1]

    def assert_nothing_of_b(self, response: Any, sent: Collection[str] = ()) -> None:
        """No secret, id, prefix, revision or name of B's in what A was told, other than the
        ids A named itself: in this request, and (in the audit log, which records them) in
        A's own authorize calls."""
        text = response.get_data(as_text=True).lower()
        own = {s.lower() for s in sent}
        if response.request.path.startswith("/v1/audit-logs"):
            own |= self.sent
        for named in own:
            text = text.replace(named, "")
        shown = sorted(secret for secret in self.b.secrets if secret in text)
        assert shown == [], f"A was shown B's {shown}"


@pytest.fixture(scope="module")
def world(database_url: str, audit_key_file: str) -> Iterator[World]:
    """Both workspaces, shared by every case (each case changes nothing, or only A's own audit
    log, which the reading after it accounts for); their full reading is compared at the end."""
    clock = FakeClock()
    settings = Settings(
        database_url=database_url, rate_limit_per_minute=100_000, audit_key_file=audit_key_file
    )
    app = create_app(settings, clock=clock)
    client = app.test_client()
    db = app.extensions["agentauth"].db
    try:
        token = secrets.token_hex(4)
        a = populate(client, db, Tenant(app, f"wsa-{token}", clock), clock)
        b = populate(client, db, Tenant(app, f"wsb-{token}", clock), clock)
        document = client.get("/v1/openapi.json").json
        a_first, b_first = full_reading(client, a.admin), full_reading(client, b.admin)
        yield World(client, document, a, b)
        assert full_reading(client, b.admin) == b_first, "B changed during the matrix"
        a_last = full_reading(client, a.admin)
        # A's authorize calls add to its own log
        audit = {AUDIT, "/v1/audit-logs/export", CHAIN, CHECKPOINT}
        assert {k: v for k, v in a_last.items() if k not in audit} == {
            k: v for k, v in a_first.items() if k not in audit
        }, "A changed during the matrix"
    finally:
        db.dispose()


# --- the matrix covers the document ---------------------------------------------------------


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        if method.upper() in METHODS
    }


def _body_fields(document: dict[str, Any], op: dict[str, Any]) -> set[str]:
    if "requestBody" not in op:
        return set()
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    name = schema["$ref"].removeprefix("#/components/schemas/")
    return set(document["components"]["schemas"][name].get("properties", {}))


def test_the_matrix_covers_every_operation_of_the_document(world):
    """An operation added to the API (the OpenAPI tests make sure it is documented) fails here
    until the matrix says how it is covered."""
    operations = _operations(world.document)
    assert set(operations) == set(MATRIX)
    for (method, path), op in operations.items():
        entry = MATRIX[(method, path)]
        assert ("{id}" in path) == (entry.path_kind is not None), (method, path)
        assert (op.get("security") == []) == (entry.scope == PUBLIC), (method, path)
        # the document lists a 403 answer exactly where the admin scope is needed
        assert ("403" in op["responses"]) == (entry.scope == ADMIN), (method, path)
        if entry.path_kind is not None:
            assert "404" in op["responses"], (method, path)
        named = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        named |= _body_fields(world.document, op)
        # session_id names no resource: a label of the caller's own calls, counted and
        # filtered within its workspace only
        ids = {n for n in named if (n.endswith("_id") or n == "id") and n != "session_id"}
        assert ids == ({entry.id_field} if entry.id_field else set()), (method, path)
        assert ("requestBody" in op) == (entry.body is not None), (method, path)
        takes_no_id = entry.path_kind is None and entry.id_field is None
        if takes_no_id and (entry.scope != ADMIN or method == "GET"):
            assert entry.note, f"{method} {path}: say why it takes no part in the id matrix"
    for path, methods in UNDOCUMENTED.items():
        documented = {method for method, p in operations if p == path}
        assert documented.isdisjoint(methods)
        assert documented | set(methods) == set(METHODS), path


# --- another workspace's ids ----------------------------------------------------------------

FOREIGN_PATH = [
    (op, target) for op, entry in MATRIX.items() if entry.path_kind is not None for target in B_IDS
]


@pytest.mark.parametrize(
    ("op", "target"), FOREIGN_PATH, ids=[f"{m} {p} B.{t}" for (m, p), t in FOREIGN_PATH]
)
def test_an_id_of_another_workspace_is_not_found_and_changes_nothing(world, op, target):
    method, path = op
    entry = MATRIX[op]
    theirs = world.b.id(target)
    body = entry.body(world.a.ids["agent"]) if entry.body else None
    response = world.call(world.a.admin, method, path.format(id=theirs), body)
    a, b = world.settle()
    assert_error(response, 404, NOT_FOUND[entry.path_kind])
    world.assert_nothing_of_b(response, {theirs})
    b.assert_unchanged()
    a.assert_unchanged()


FOREIGN_METHOD = [(m, p) for p, methods in UNDOCUMENTED.items() for m in (*methods, *AUTOMATIC)]


@pytest.mark.parametrize(
    ("method", "path"), FOREIGN_METHOD, ids=[f"{m} {p}" for m, p in FOREIGN_METHOD]
)
def test_a_method_the_document_does_not_list_answers_as_for_an_id_of_nothing(world, method, path):
    kind = next(e.path_kind for (_, p), e in MATRIX.items() if p == path)
    theirs = world.b.id(FIRST[kind])
    body = None if method in AUTOMATIC else {"name": "x"}
    response = world.call(world.a.admin, method, path.format(id=theirs), body)
    nobody = world.call(world.a.admin, method, path.format(id=NOBODY), body)
    a, b = world.settle()

    def seen(r: Any) -> tuple[int, bytes, str | None]:
        return r.status_code, r.get_data(), r.headers.get("Allow")

    assert seen(response) == seen(nobody)
    if method == "OPTIONS":
        assert response.status_code == 200  # Flask's own: the Allow header, no lookup
    elif method == "HEAD":
        assert response.status_code == (404 if ("GET", path) in MATRIX else 405)
    else:
        assert_error(response, 405, "METHOD_NOT_ALLOWED")
    world.assert_nothing_of_b(response, {theirs})
    b.assert_unchanged()
    a.assert_unchanged()


@pytest.mark.parametrize("target", B_IDS)
def test_a_policy_for_another_workspaces_agent_is_agent_not_found(world, target):
    theirs = world.b.id(target)
    body = MATRIX[("POST", "/v1/policies")].body(theirs)
    response = world.call(world.a.admin, "POST", "/v1/policies", body)
    a, b = world.settle()
    assert_error(response, 404, "AGENT_NOT_FOUND")
    world.assert_nothing_of_b(response, {theirs})
    b.assert_unchanged()
    a.assert_unchanged()  # no policy of A's attached to B's agent


@pytest.mark.parametrize("target", ["policy", "git-policy"])
def test_a_policy_cannot_be_moved_to_another_workspaces_agent(world, target):
    """``agent_id`` is not updatable (spec): an unknown member, 400 for any agent, own or not."""
    response = world.call(
        world.a.admin,
        "PATCH",
        f"/v1/policies/{world.a.ids[target]}",
        {"agent_id": world.b.ids["agent"]},
    )
    a, b = world.settle()
    assert_error(response, 400, "VALIDATION_ERROR")
    world.assert_nothing_of_b(response, {world.b.ids["agent"]})
    b.assert_unchanged()
    a.assert_unchanged()


AUTHORIZE = [(t, "admin") for t in B_IDS] + [
    ("agent", "read-only"),
    ("suspended-agent", "read-only"),
]


def _shape(decision: dict[str, Any], agent_id: str) -> dict[str, Any]:
    """A decision without what differs from call to call (its audit id, its latency) and with
    the agent id it names blanked."""
    kept = {k: v for k, v in decision.items() if k not in {"auditId", "latencyMs"}}
    kept["reason"] = kept["reason"].replace(agent_id, "<agent>")
    return kept


@pytest.mark.parametrize(("target", "scope"), AUTHORIZE, ids=[f"B.{t}-{s}" for t, s in AUTHORIZE])
def test_authorize_for_another_workspaces_agent_is_the_unknown_agent_answer(world, target, scope):
    """B's agents allow every tool; to A they do not exist: the answer is word for word the one
    for an agent that exists nowhere, and it lands in A's audit log only."""
    headers = world.a.admin if scope == "admin" else world.a.read_only
    theirs = world.b.id(target)
    body = MATRIX[("POST", "/v1/authorize")].body
    response = world.call(headers, "POST", "/v1/authorize", body(theirs))
    nobody = world.call(headers, "POST", "/v1/authorize", body(NOBODY))
    a, b = world.settle()
    assert response.status_code == 200
    assert nobody.status_code == 200
    decision = response.json
    assert decision["allowed"] is False
    assert decision["outcome"] == "denied"
    assert decision["policyId"] is None
    assert decision["ruleIndex"] is None
    assert "not found" in decision["reason"]
    assert _shape(decision, theirs.lower()) == _shape(nobody.json, NOBODY)
    world.assert_nothing_of_b(response, {theirs})
    b.assert_unchanged()
    entries = a.assert_only_new_audit_entries({decision["auditId"], nobody.json["auditId"]})
    [entry] = [e for e in entries if e["id"] == decision["auditId"]]
    assert entry["agentId"] == theirs.lower()
    assert entry["toolName"] == PROBE_TOOL
    assert entry["result"] == "denied"
    assert entry["policyId"] is None


FILTERED = [
    (op, target)
    for op, entry in MATRIX.items()
    if entry.id_field is not None and op[0] == "GET"
    for target in B_IDS
]


@pytest.mark.parametrize(
    ("op", "target"), FILTERED, ids=[f"{m} {p} B.{t}" for (m, p), t in FILTERED]
)
def test_a_filter_naming_another_workspaces_id_finds_nothing_of_it(world, op, target):
    _, path = op
    theirs = world.b.id(target)
    response = world.call(world.a.admin, "GET", path, query={MATRIX[op].id_field: theirs})
    a, b = world.settle()
    assert response.status_code == 200, response.get_data(as_text=True)
    world.assert_nothing_of_b(response, {theirs})
    # what is found is A's own: the entries of A's authorize calls naming that id, if any
    a_entries = a.after[AUDIT][1]["data"]
    own = [e for e in a_entries if e["agentId"] == theirs.lower()]
    if path in ("/v1/policies", "/v1/approvals"):
        assert response.json["data"] == []
        assert response.json["pagination"]["total"] == 0
    elif path == "/v1/audit-logs":
        assert response.json["data"] == own
        assert response.json["pagination"]["total"] == len(own)
    elif path == "/v1/audit-logs/stats":  # A's own calls naming that id, counted
        assert sum(item["count"] for item in response.json["data"]) == len(own)
    else:
        rows = list(csv.reader(io.StringIO(response.get_data(as_text=True))))
        assert [row[1] for row in rows[1:]] == [e["agentId"] for e in own]
        assert [row[2] for row in rows[1:]] == [e["toolName"] for e in own]
    b.assert_unchanged()
    a.assert_unchanged()


ID_LESS_READS = [
    op
    for op, entry in MATRIX.items()
    if op[0] == "GET" and entry.scope != PUBLIC and entry.path_kind is None
]


@pytest.mark.parametrize("op", ID_LESS_READS, ids=[f"{m} {p}" for m, p in ID_LESS_READS])
def test_a_read_without_an_id_shows_only_the_callers_workspace(world, op):
    _, path = op
    response = world.call(world.a.admin, "GET", path)
    a, b = world.settle()
    assert response.status_code == 200
    world.assert_nothing_of_b(response)
    if path == "/v1/audit-logs/stats":  # counts of A's own entries, none of B's
        counted = sum(item["count"] for item in response.json["data"])
        assert counted == len(a.after[AUDIT][1]["data"])
    elif response.mimetype == "application/json" and "data" in response.json:
        ids = {item["id"] for item in response.json["data"]}
        watched = next(p for p in WATCHED if p.split("?")[0] == path)
        assert ids <= {item["id"] for item in a.after[watched][1]["data"]}
    if path == "/v1/sync-status":
        assert response.json == a.after["/v1/sync-status"][1]
        assert world.a.marker in response.json["source"]
    b.assert_unchanged()
    a.assert_unchanged()


# --- read-only keys -------------------------------------------------------------------------


def _read_only_targets(entry: Entry) -> tuple[str, ...]:
    if entry.path_kind == KEY:
        return ("own", "self", "theirs", "nobody")
    if entry.path_kind in (APPROVAL, WEBHOOK):  # no approval or webhook is managed from git
        return ("own", "theirs", "nobody")
    if entry.path_kind is not None:
        return ("own", "own-git", "theirs", "nobody")
    if entry.id_field is not None:
        return ("own", "theirs", "nobody")
    return ("-",)


def _target_id(world: World, kind: str, target: str) -> str:
    if target == "own":
        return world.a.ids[FIRST[kind]]
    if target == "own-git":
        return world.a.ids[f"git-{kind}"]
    if target == "self":
        return world.a.ids["read-only-key"]
    if target == "theirs":
        return world.b.ids[FIRST[kind]]
    return NOBODY


def _request(
    world: World, op: tuple[str, str], target: str
) -> tuple[str, dict[str, Any] | None, dict[str, str] | None, str]:
    """(path, body, query, the id named) for ``op`` aimed at ``target``."""
    method, path = op
    entry = MATRIX[op]
    named, body, query = "", None, None
    if entry.path_kind is not None:
        named = _target_id(world, entry.path_kind, target)
        path = path.format(id=named)
    elif entry.id_field is not None:
        named = _target_id(world, AGENT, target)
        if method == "GET":
            query = {entry.id_field: named}
    if entry.body is not None:
        body = entry.body(named if entry.id_field else world.a.ids["agent"])
    return path, body, query, named


READ_ONLY_REFUSED = [
    (op, target)
    for op, entry in MATRIX.items()
    if entry.scope == ADMIN
    for target in _read_only_targets(entry)
]


@pytest.mark.parametrize(
    ("op", "target"), READ_ONLY_REFUSED, ids=[f"{m} {p} {t}" for (m, p), t in READ_ONLY_REFUSED]
)
def test_a_read_only_key_is_refused_every_admin_operation_and_changes_nothing(world, op, target):
    """403 whatever the id names (A's own, B's, nothing): the scope is checked before the id is
    looked up, so the answer cannot tell them apart."""
    path, body, query, named = _request(world, op, target)
    response = world.call(world.a.read_only, op[0], path, body, query)
    a, b = world.settle()
    assert_error(response, 403, "INSUFFICIENT_SCOPE")
    world.assert_nothing_of_b(response, {named} if named else set())
    b.assert_unchanged()
    a.assert_unchanged()


READ_ONLY_SERVED = [
    (op, target)
    for op, entry in MATRIX.items()
    if entry.scope == ANY
    for target in (("own", "theirs") if entry.path_kind or entry.id_field else ("-",))
]


@pytest.mark.parametrize(
    ("op", "target"), READ_ONLY_SERVED, ids=[f"{m} {p} {t}" for (m, p), t in READ_ONLY_SERVED]
)
def test_a_read_only_key_is_served_everything_else_within_its_workspace(world, op, target):
    method, path = op
    entry = MATRIX[op]
    path, body, query, named = _request(world, op, target)
    response = world.call(world.a.read_only, method, path, body, query)
    a, b = world.settle()
    if entry.path_kind is not None and target == "theirs":
        assert_error(response, 404, NOT_FOUND[entry.path_kind])
    else:
        assert response.status_code == 200, response.get_data(as_text=True)
    if entry.path_kind is not None and target == "own":
        if path.endswith("/usage"):  # what the agent's limits hold, not the agent itself
            assert isinstance(response.json["data"], list)
        elif path.endswith("/shadow-report"):  # what the policy would have done
            assert response.json["policyId"] == named
        else:
            assert response.json["id"] == named
    world.assert_nothing_of_b(response, {named} if named else set())
    b.assert_unchanged()
    if method == "POST":  # authorize: one entry in A's own log, allowed for A's own agent
        assert response.json["allowed"] is (target == "own")
        a.assert_only_new_audit_entries({response.json["auditId"]})
    else:
        a.assert_unchanged()
