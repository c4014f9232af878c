"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against a real
``agentauth serve`` on a free loopback port. Each test signs in to a workspace of its own.

Screenshots of every page are written to ``$AGENTAUTH_SCREENSHOTS`` when it is set (``make
screenshots`` sets it to docs/screenshots), else to the test's temporary folder.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, Request, Route, expect, sync_playwright
from sqlalchemy import update

from api import create_app
from api.retention import prune
from controller.load import SourceFile
from controller.reconcile import apply_files
from core.config import Settings
from core.store.models import Approval
from tests.api.test_export import append_entries
from tests.conftest import FakeClock, Tenant, bearer
from tests.controller.conftest import agent_doc
from tests.server import running_server

CHROMIUM = Path("/usr/bin/chromium")
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
expect.set_options(timeout=15_000)  # a hang guard for a loaded machine, not a speed check


@pytest.fixture(scope="module")
def base(database_url: str) -> Iterator[str]:
    with running_server(database_url, workers=1, threads=4) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        if os.environ.get("AGENTAUTH_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
        pytest.skip(f"browser tests need {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def expected_console_errors() -> list[str]:
    """Parts of the browser console errors a test expects: an API refusal the page shows, and
    whatever failure a test fakes (it adds that here)."""
    return ["status of 4"]


@pytest.fixture
def page(browser: Browser, base: str, expected_console_errors: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport=LAPTOP, base_url=base, accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield tab
    context.close()
    # a script error or a CSP violation is never expected
    unexpected = [e for e in errors if not any(part in e for part in expected_console_errors)]
    assert unexpected == []


class World:
    """A workspace of the test's own, seeded through the public API of the served app."""

    def __init__(self, database_url: str, base: str) -> None:
        self.database_url = database_url
        self.base = base
        self.name = f"dash-{secrets.token_hex(5)}"
        self.app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
        self.clock = FakeClock()
        self.tenant = Tenant(self.app, self.name, self.clock)
        self.admin = self.tenant.key("admin")
        self.http = httpx.Client(base_url=base, headers=bearer(self.admin), timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def agent(self, name: str, *policies: dict[str, Any]) -> str:
        agent_id: str = self.post("/v1/agents", {"name": name, "description": f"{name} bot"})["id"]
        for policy in policies:
            self.post("/v1/policies", {"agent_id": agent_id, **policy})
        return agent_id

    def decide(self, agent_id: str, tool: str, **parameters: Any) -> Any:
        body = {"agent_id": agent_id, "tool_name": tool, "parameters": parameters}
        return self.post("/v1/authorize", body)

    def key(self, name: str, *scopes: str) -> str:
        """A key of this workspace with a name of its own (the name an approval shows)."""
        key: str = self.post("/v1/api-keys", {"name": name, "scopes": list(scopes)})["key"]
        return key

    def escalate(self, agent_id: str, **parameters: Any) -> str:
        """A refund that needs a person's approval (made with the admin key): its approval id."""
        decision = self.decide(agent_id, "payments.refund", **parameters)
        assert decision["outcome"] == "escalated", decision
        approval_id: str = decision["approvalId"]
        return approval_id

    def approval(self, approval_id: str) -> Any:
        return self.http.get(f"/v1/approvals/{approval_id}").json()

    def expire(self, approval_id: str) -> None:
        """Moves an approval's expiry into the past (the shortest one lasts a minute)."""
        db = self.app.extensions["agentauth"].db
        past = datetime.now(UTC) - timedelta(minutes=5)
        with db.transaction(write=True) as session:
            session.execute(
                update(Approval).where(Approval.id == approval_id).values(expires_at=past)
            )

    def close(self) -> None:
        self.http.close()
        self.app.extensions["agentauth"].close()


@pytest.fixture
def world(database_url: str, base: str) -> Iterator[World]:
    made = World(database_url, base)
    yield made
    made.close()


def sign_in(page: Page, key: str) -> None:
    page.goto("/dashboard/")
    page.locator("#key-input").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#who")).to_be_visible()


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("AGENTAUTH_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def requests_to(path: str, query: str | None = None) -> Callable[[str], bool]:
    """A URL matcher for page.route: requests to ``path`` (with exactly ``query``, if given)."""

    def matches(url: str) -> bool:
        parts = urlsplit(url)
        return parts.path == path and (query is None or parts.query == query)

    return matches


def answer_with(status: int, code: str, message: str) -> Callable[[Route], None]:
    """A page.route handler answering as the service does when it fails."""
    body = json.dumps({"error": {"code": code, "message": message}})
    return lambda route: route.fulfill(status=status, content_type="application/json", body=body)


def confirm(page: Page, label: str) -> None:
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name=label).click()
    expect(dialog).to_be_hidden()


ALLOW_CALENDAR = {
    "name": "calendar",
    "rules": [{"type": "tool_allowlist", "tools": ["calendar.*"]}],
}
# refunds above 1,000 need a person's approval; everything else is allowed
REFUNDS = {
    "name": "refunds",
    "rules": [
        {"type": "require_approval", "tools": ["payments.refund"],
         "parameters": {"amount": {"max": 1000}}, "approval": {"ttlSeconds": 3600}},
        {"type": "tool_allowlist"},
    ],
}  # fmt: skip
REFUND_RULE = (
    "needs a person's approval for payments.refund when amount is above 1000 (approval lasts 1 h)"
)


# ------------------------------------------------------------------------------------ tests


def test_sign_in_then_suspend_an_agent_and_the_next_call_is_denied(page, world, tmp_path):
    agent = world.agent("scheduler", ALLOW_CALENDAR)
    assert world.decide(agent, "calendar.create")["allowed"] is True
    page.goto("/dashboard/")
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()  # nothing to navigate to before signing in
    expect(page.locator("#sign-out")).to_be_hidden()
    # a text field drawn as dots, never a password field a password manager offers to keep,
    # and without a name, so that it is never part of a form submission
    field = page.locator("#key-input")
    expect(field).to_have_attribute("type", "text")
    expect(field).to_have_attribute("autocomplete", "off")
    expect(field).to_have_attribute("autocapitalize", "off")
    expect(field).to_have_attribute("spellcheck", "false")
    assert field.get_attribute("name") is None
    assert page.locator("input[type=password]").count() == 0
    assert field.evaluate("e => getComputedStyle(e).webkitTextSecurity") == "disc"
    screenshot(page, "sign-in", tmp_path)
    sign_in(page, world.admin)

    row = page.locator("tr[data-agent='scheduler']")
    expect(row.locator(".badge")).to_have_text("active")
    screenshot(page, "agents", tmp_path)
    row.get_by_role("button", name="Suspend").click()
    expect(page.locator("#confirm-text")).to_contain_text("Suspend agent “scheduler”?")
    confirm(page, "Suspend")
    expect(row.locator(".badge")).to_have_text("suspended")
    expect(page.locator("#message")).to_have_text("Agent “scheduler” is now suspended.")

    decision = world.decide(agent, "calendar.create")
    assert decision["allowed"] is False
    assert "suspended" in decision["reason"]

    row.get_by_role("button", name="Reactivate").click()
    confirm(page, "Reactivate")
    expect(row.locator(".badge")).to_have_text("active")
    assert world.decide(agent, "calendar.create")["allowed"] is True


def test_cancelling_the_confirmation_changes_nothing(page, world):
    agent = world.agent("keeper", ALLOW_CALENDAR)
    sign_in(page, world.admin)
    row = page.locator("tr[data-agent='keeper']")
    row.get_by_role("button", name="Revoke").click()
    page.locator("dialog#confirm").get_by_role("button", name="Cancel").click()
    expect(page.locator("dialog#confirm")).to_be_hidden()
    assert world.http.get(f"/v1/agents/{agent}").json()["status"] == "active"
    expect(row.locator(".badge")).to_have_text("active")


def test_agent_detail_shows_policies_in_evaluation_order_with_readable_rules(page, world, tmp_path):
    rules = [
        {"type": "tool_allowlist", "tools": ["payments.*"]},
        {"type": "parameter_constraint", "tools": ["payments.refund"],
         "parameters": {"amount": {"max": 100}, "currency": {"enum": ["EUR", "USD"]}}},
        {"type": "rate_limit", "rateLimit": {"maxCalls": 100, "windowSeconds": 60}},
        {"type": "time_based", "timeWindow": {"allowedDays": [1, 2, 3, 4, 5],
         "allowedHours": list(range(9, 17)), "timezone": "Europe/Berlin"}},
    ]  # fmt: skip
    agent = world.agent(
        "refunds",
        {"name": "low", "priority": 1, "rules": [{"type": "tool_allowlist", "tools": ["*"]}]},
        {"name": "payments", "priority": 50, "rules": rules},
        {"name": "off", "priority": 90, "enabled": False,
         "rules": [{"type": "tool_denylist", "tools": ["payments.delete"]}]},
    )  # fmt: skip
    world.decide(agent, "payments.refund", amount=500, currency="EUR")
    sign_in(page, world.admin)
    page.get_by_role("link", name="refunds").click()

    policies = page.locator("#policies tbody tr")
    expect(policies).to_have_count(3)
    expect(policies.nth(0)).to_contain_text("off")  # priority 90, disabled: listed, not counted
    expect(policies.nth(0).locator(".badge")).to_have_text(["disabled", "enforce"])  # state, mode
    expect(policies.nth(1).locator("td").first).to_have_text("1")
    expect(policies.nth(1)).to_contain_text("payments")
    expect(policies.nth(2).locator("td").first).to_have_text("2")
    readable = policies.nth(1).locator("ol.rules li")
    expect(readable).to_have_text(
        [
            "allow payments.*",
            "deny if amount > 100; deny if currency not in {EUR, USD} (on payments.refund)",
            "max 100 calls / 60 s",
            "Mon-Fri 09-17 Europe/Berlin",
        ]
    )
    expect(policies.nth(2).locator("ol.rules li")).to_have_text(["allow all tools"])
    expect(policies.nth(1).locator("td").last).to_have_text("API")
    entries = page.locator("#entries tbody tr")
    expect(entries).to_have_count(1)
    expect(entries.first).to_contain_text("payments.refund")
    expect(entries.first).to_contain_text("denied")
    screenshot(page, "agent", tmp_path)


def test_policies_applied_from_git_are_marked_and_the_sync_page_shows_revisions(
    page, world, tmp_path
):
    files = [
        SourceFile("agents/mailer.yaml", agent_doc("mailer", "description: sends mail").encode()),
        SourceFile(
            "policies/mail.yaml",
            b"apiVersion: agentauth/v1\nkind: Policy\nmetadata: {name: mail}\n"
            b"spec:\n  agent: mailer\n  rules:\n    - type: tool_allowlist\n"
            b"      tools: [mail.read]\n",
        ),
    ]
    db = world.app.extensions["agentauth"].db
    result = apply_files(
        db, files, "3f2a9c1", "git@example.com:ops/policies.git", workspace=world.name
    )
    assert result.ok, result
    broken = [SourceFile("agents/mailer.yaml", b"kind: [unclosed\n")]
    apply_files(db, broken, "77e01bd", "git@example.com:ops/policies.git", workspace=world.name)

    sign_in(page, world.admin)
    page.get_by_role("link", name="mailer").click()
    expect(page.locator("#policies tbody tr td").last).to_have_text("git")
    page.get_by_role("link", name="Sync").click()
    expect(page.locator("#applied-revision")).to_have_text("3f2a9c1")
    expect(page.locator("#attempted-revision")).to_have_text("77e01bd")
    expect(page.locator("#sync-error")).to_contain_text("agents/mailer.yaml")
    screenshot(page, "sync", tmp_path)


def test_filter_the_audit_log_page_through_it_and_export_the_same_file_as_the_api(page, world):
    agent = world.agent("auditor-subject", ALLOW_CALENDAR)
    other = world.agent("bystander", ALLOW_CALENDAR)
    for n in range(30):
        world.decide(agent, "mail.send" if n % 3 == 0 else "calendar.create", n=n, token="hunter2")
    world.decide(other, "mail.send")
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    form = page.locator("#audit-filters")
    form.locator("select[name=agent_id]").select_option(label="auditor-subject")
    form.locator("select[name=result]").select_option("denied")
    form.locator("select[name=limit]").select_option("25")
    form.get_by_role("button", name="Apply filters").click()

    rows = page.locator("#entries tbody tr")
    expect(rows).to_have_count(10)
    expect(page.locator(".pager .count")).to_have_text("1\u201310 of 10")
    for text in rows.all_inner_texts():
        missing = [w for w in ("mail.send", "denied", "auditor-subject") if w not in text]
        assert missing == [], text
    rows.first.locator("summary").click()
    expect(rows.first.locator("pre")).to_contain_text('"token": "[REDACTED]"')

    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    saved = Path(download.value.path()).read_bytes()
    assert download.value.suggested_filename.startswith("svc-audit-log-")
    expect(page.locator("#export-notice")).to_contain_text("Downloaded svc-audit-log-")
    query = {"agent_id": agent, "result": "denied"}
    assert saved == world.http.get("/v1/audit-logs/export", params=query).content
    parsed = list(csv.reader(io.StringIO(saved.decode("utf-8-sig"))))
    assert parsed[0][:3] == ["Timestamp", "Agent ID", "Tool"]
    assert len(parsed) == 11

    # paging: all 31 entries of the workspace, 25 a page
    page.goto("/dashboard/#/audit?limit=25")
    expect(page.locator(".pager .count")).to_have_text("1\u201325 of 31")
    page.get_by_role("button", name="Older →").click()
    expect(page.locator(".pager .count")).to_have_text("26\u201331 of 31")
    expect(rows).to_have_count(6)


def test_an_export_cut_at_5000_rows_says_so(page, world):
    agent = world.agent("busy", ALLOW_CALENDAR)
    append_entries(world.app, world.tenant, world.clock, agent, 5001)
    sign_in(page, world.admin)
    page.goto("/dashboard/#/audit")
    expect(page.locator(".pager .count")).to_have_text("1\u201350 of 5001")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    lines = Path(download.value.path()).read_text(encoding="utf-8-sig").splitlines()
    assert len(lines) == 5001  # the header and 5,000 entries
    expect(page.locator("#export-notice")).to_contain_text("cut at 5000 rows")


def test_create_a_key_with_an_expiry_copy_it_once_and_see_it_listed(page, world, tmp_path):
    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    form.locator("input[name=name]").fill("ci-deployer")
    form.locator("input[value=admin]").check()
    form.locator("input[name=expires]").fill("2031-03-31")
    form.get_by_role("button", name="Create key").click()

    shown = page.locator("#new-key-value")
    expect(shown).to_have_value(re.compile(r"^svc_[0-9a-f]{32}$"))
    key = shown.input_value()
    expect(page.locator("#new-key .warning")).to_contain_text("shown only this once")
    page.locator("#copy-key").click()
    expect(page.locator("#copy-key")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key
    row = page.locator("tr[data-key='ci-deployer']")
    expect(row).to_contain_text("2031-03-31 23:59:59 UTC")
    expect(row).to_contain_text("admin, read-only")
    expect(row).to_contain_text(key[:10])
    assert key not in page.locator("#keys").inner_text()
    screenshot(page, "keys", tmp_path)
    assert httpx.get(f"{world.base}/v1/agents", headers=bearer(key)).status_code == 200

    # shown once: after a reload the list has it, the page does not
    page.reload()
    expect(row).to_be_visible()
    assert key not in page.content()

    row.get_by_role("button", name="Revoke").click()
    confirm(page, "Revoke")
    expect(row).to_have_count(0)
    assert httpx.get(f"{world.base}/v1/agents", headers=bearer(key)).status_code == 401


MUTATIONS = ["Suspend", "Reactivate", "Revoke", "Create key", "Approve", "Deny"]


def assert_no_mutation_controls(page: Page) -> None:
    for label in MUTATIONS:
        expect(page.get_by_role("button", name=label, exact=True)).to_have_count(0)
    expect(page.locator("#create-key, #new-key:not([hidden])")).to_have_count(0)


def test_a_read_only_key_reads_everything_the_audit_log_included_and_changes_nothing(page, world):
    agent = world.agent("watched", ALLOW_CALENDAR)
    for tool in ("calendar.create", "mail.send", "calendar.read"):
        world.decide(agent, tool, token="hunter2")
    reader = world.tenant.key("read-only")
    sign_in(page, reader)
    expect(page.locator("#who-scope")).to_have_text("read-only")
    expect(page.locator("tr[data-agent='watched']")).to_be_visible()
    assert page.locator("main button").all_inner_texts() == ["← Newer", "Older →"]
    assert_no_mutation_controls(page)

    # the agent: its policies and its latest decisions, no buttons
    page.get_by_role("link", name="watched").click()
    expect(page.locator("#policies")).to_be_visible()
    latest = page.locator("#entries tbody tr")
    expect(latest).to_have_count(3)
    expect(latest.first).to_contain_text("calendar.read")
    assert page.locator("main button").count() == 0
    assert_no_mutation_controls(page)

    # the audit log: filters, paging and export, as for an admin key
    page.get_by_role("link", name="All decisions of this agent →").click()
    rows = page.locator("#entries tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator(".pager .count")).to_have_text("1\u20133 of 3")
    page.locator("#audit-filters select[name=result]").select_option("denied")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("mail.send")
    rows.first.locator("summary").click()
    expect(rows.first.locator("pre")).to_contain_text('"token": "[REDACTED]"')
    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    saved = Path(download.value.path()).read_bytes()
    query = {"agent_id": agent, "result": "denied"}
    exported = httpx.get(f"{world.base}/v1/audit-logs/export", params=query, headers=bearer(reader))
    assert exported.status_code == 200
    assert saved == exported.content
    expect(page.locator("#export-notice")).to_contain_text("Downloaded svc-audit-log-")
    assert page.locator("main button").all_inner_texts() == [
        "Apply filters", "Clear", "Export CSV", "⇤ Newest", "Older →", "Fetch checkpoint",
    ]  # fmt: skip
    assert_no_mutation_controls(page)

    # the keys: the service's refusal in words, and no form
    refusal = httpx.get(f"{world.base}/v1/api-keys", headers=bearer(reader))
    assert refusal.status_code == 403
    page.get_by_role("link", name="API keys").click()
    expect(page.locator("#keys-refused")).to_have_text(
        f"The service answered 403 INSUFFICIENT_SCOPE: {refusal.json()['error']['message']}"
    )
    expect(page.locator("main")).to_contain_text("needs an admin key")
    assert page.locator("main form, main button").count() == 0
    assert_no_mutation_controls(page)

    page.get_by_role("link", name="Sync").click()
    expect(page.locator("#sync")).to_be_visible()
    assert_no_mutation_controls(page)

    refused = httpx.patch(
        f"{world.base}/v1/agents/{agent}", json={"status": "suspended"}, headers=bearer(reader)
    )
    assert refused.status_code == 403


PROBE_FAILURES = {
    "500": (
        answer_with(500, "INTERNAL_ERROR", "unexpected server error"),
        "The service answered 500 INTERNAL_ERROR: unexpected server error",
        "status of 500",
    ),
    "429": (
        answer_with(429, "RATE_LIMITED", "rate limit exceeded; retry in 7 s"),
        "The service answered 429 RATE_LIMITED: rate limit exceeded; retry in 7 s",
        "status of 429",
    ),
    "unreachable": (
        lambda route: route.abort(),
        "Could not reach the service: Failed to fetch",
        "net::ERR_FAILED",
    ),
}


@pytest.mark.parametrize("failure", sorted(PROBE_FAILURES))
def test_a_scope_probe_that_fails_otherwise_than_403_is_shown_and_signs_nobody_in(
    page, world, expected_console_errors, failure
):
    handler, shown, console = PROBE_FAILURES[failure]
    expected_console_errors.append(console)
    page.route(requests_to("/v1/whoami"), handler, times=1)  # the probe, once
    page.goto("/dashboard/")
    page.locator("#key-input").fill(world.admin)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#message")).to_have_text(shown)
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#who")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    # once the probe is answered, the same key signs in with its real scope
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#who-scope")).to_have_text("admin")


def test_the_new_key_is_shown_even_when_the_list_cannot_be_refreshed(
    page, world, expected_console_errors
):
    expected_console_errors.append("status of 500")
    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    form.locator("input[name=name]").fill("made-in-a-storm")
    # the list's refresh after the creation fails (the creation itself is a POST without query)
    failing = answer_with(500, "INTERNAL_ERROR", "unexpected server error")
    page.route(requests_to("/v1/api-keys", "limit=200&offset=0"), failing, times=1)
    form.get_by_role("button", name="Create key").click()

    shown = page.locator("#new-key-value")
    expect(shown).to_have_value(re.compile(r"^svc_[0-9a-f]{32}$"))
    expect(page.locator("#new-key .warning")).to_contain_text("shown only this once")
    expect(page.locator("#message")).to_have_text(
        "Key “made-in-a-storm” was created, but the list could not be refreshed. "
        "The service answered 500 INTERNAL_ERROR: unexpected server error"
    )
    key = shown.input_value()
    assert httpx.get(f"{world.base}/v1/agents", headers=bearer(key)).status_code == 200
    page.reload()
    expect(page.locator("tr[data-key='made-in-a-storm']")).to_be_visible()
    assert key not in page.content()


def test_copy_says_copied_only_when_the_key_was_copied(page, world):
    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    form.locator("input[name=name]").fill("clipboard-less")
    form.get_by_role("button", name="Create key").click()
    shown = page.locator("#new-key-value")
    expect(shown).to_have_value(re.compile(r"^svc_[0-9a-f]{32}$"))
    key = shown.input_value()
    copy = page.locator("#copy-key")

    # no clipboard API, and a fallback that copies nothing
    page.evaluate("""() => {
        navigator.clipboard.writeText = () => Promise.reject(new Error("not allowed"));
        document.execCommand = () => false;
    }""")
    copy.click()
    expect(copy).to_have_text("Copy failed")
    expect(page.locator("#message")).to_contain_text("Copying failed: select the key")
    assert page.evaluate("navigator.clipboard.readText()") != key

    # no clipboard API, and the browser's own fallback: it copies, and says so
    page.evaluate("() => { delete document.execCommand; }")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key


def test_the_new_key_box_survives_the_list_refresh_that_follows_it(page, world):
    """Copy clicked before the list refresh after creating a key arrives: the refresh keeps
    the box, so its button does not go back to saying Copy (nor its key vanish)."""
    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    # the page's own first load of the list is done: only the refresh after Create is held
    expect(form.locator("input[name=name]")).to_be_visible()
    held = []  # the list refresh, answered only once Copy was clicked
    refresh = requests_to("/v1/api-keys", "limit=200&offset=0")
    page.route(refresh, lambda route: held.append(route), times=1)
    form.locator("input[name=name]").fill("copied-early")
    with page.expect_request(lambda request: refresh(request.url)):
        form.get_by_role("button", name="Create key").click()
    copy = page.locator("#copy-key")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert len(held) == 1
    held[0].continue_()
    expect(page.locator("tr[data-key='copied-early']")).to_be_visible()
    expect(copy).to_have_text("Copied")
    expect(page.locator("#new-key-value")).to_have_value(re.compile(r"^svc_[0-9a-f]{32}$"))


def test_errors_from_the_api_are_shown_in_words(page, world):
    page.goto("/dashboard/")
    page.locator("#key-input").fill("svc_" + "0" * 32)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#message")).to_have_text(
        "This key was refused: invalid or revoked API key"
    )
    page.locator("#key-input").fill("not a key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#message")).to_contain_text("That is not an API key")

    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    form.locator("input[name=name]").fill("no-scopes")
    form.locator("input[value=read-only]").uncheck()
    form.get_by_role("button", name="Create key").click()
    expect(page.locator("#message")).to_contain_text("The service answered 400 VALIDATION_ERROR")
    expect(page.locator("#message")).to_contain_text("scopes")

    page.goto("/dashboard/#/agents/00000000-0000-4000-8000-000000000000")
    expect(page.locator("#message")).to_contain_text("404 AGENT_NOT_FOUND")


def test_the_key_stays_in_session_storage_only_and_goes_on_sign_out(page, world, base):
    world.agent("a", ALLOW_CALENDAR)
    sign_in(page, world.admin)
    for route in ("#/agents", "#/approvals", "#/audit", "#/keys", "#/sync"):
        page.goto(f"/dashboard/{route}")
        expect(page.locator("main h1")).to_be_visible()
        assert world.admin not in page.url
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("document.cookie") == ""
    assert page.evaluate("sessionStorage.getItem('agentauth.key')") == world.admin
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    # a new tab of the same browser starts signed out: nothing outlives the tab
    other = page.context.new_page()
    other.goto(f"{base}/dashboard/")
    expect(other.locator("#sign-in")).to_be_visible()


HEADINGS = {
    "#/agents": "Agents",
    "#/approvals": "Approvals",
    "#/audit": "Audit log",
    "#/keys": "API keys",
    "#/sync": "Policy repository sync",
    "agent": "a-rather-long-agent-name-for-a-small-screen",
    "approval": "Approval of payments.refund",
}


@pytest.mark.parametrize(
    "route", ["#/agents", "#/approvals", "#/audit", "#/keys", "#/sync", "agent", "approval"]
)
def test_every_page_fits_a_phone_screen(browser, base, world, route):
    agent = world.agent(HEADINGS["agent"], ALLOW_CALENDAR, REFUNDS)
    world.decide(agent, "calendar.create", title="standup with a long title")
    approval = world.escalate(agent, amount=5000, note="a refund with a rather long note in it")
    routes = {"agent": f"#/agents/{agent}", "approval": f"#/approvals/{approval}"}
    context = browser.new_context(viewport=PHONE, base_url=base, is_mobile=True)
    phone = context.new_page()
    sign_in(phone, world.admin)
    phone.goto(f"/dashboard/{routes.get(route, route)}")
    # the page asked for, not the list of agents signing in showed before it
    expect(phone.locator("main h1")).to_contain_text(HEADINGS[route])
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    context.close()


# a name without a dash or a space: nowhere for a line to break but where the page breaks it
LONG_NAME = "payments_refund_agent_production_eu_west_1_primary_replica"
# the computed box-shadow of a table's box with more of the table beyond its right / left edge
MORE_RIGHT = re.compile(r"\) -\d+px 0px [^,]*inset")
MORE_LEFT = re.compile(r"\) \d+px 0px [^,]*inset")


def test_counts_say_one_parameter_and_two_parameters(page, world):
    rules = [
        {"type": "tool_allowlist", "tools": ["*"]},
        {
            "type": "rate_limit",
            "tools": ["one.*"],
            "rateLimit": {"maxCalls": 1, "windowSeconds": 60},
        },
        {
            "type": "rate_limit",
            "tools": ["two.*"],
            "rateLimit": {"maxCalls": 2, "windowSeconds": 60},
        },
    ]
    agent = world.agent("counter", {"name": "counted", "rules": rules})
    world.decide(agent, "zero.call")
    world.decide(agent, "one.call", a=1)
    world.decide(agent, "two.call", a=1, b=2)
    sign_in(page, world.admin)
    page.goto(f"/dashboard/#/agents/{agent}")
    expect(page.locator("#policies ol.rules li")).to_have_text(
        ["allow all tools", "max 1 call / 60 s (on one.*)", "max 2 calls / 60 s (on two.*)"]
    )
    entries = page.locator("#entries tbody tr")
    expect(entries).to_have_count(3)
    for tool, shown in [("zero", "0 parameters"), ("one", "1 parameter"), ("two", "2 parameters")]:
        expect(entries.filter(has_text=f"{tool}.call").locator("summary")).to_have_text(shown)

    # an export cut at a single row (the service's cap is 5,000; the words must fit any cap)
    cut = {"X-Svc-Export-Truncated": "true", "X-Svc-Export-Limit": "1"}
    page.route(
        requests_to("/v1/audit-logs/export"),
        lambda route: route.fulfill(status=200, headers=cut, content_type="text/csv", body="x\n"),
    )
    page.goto("/dashboard/#/audit")
    with page.expect_download():
        page.get_by_role("button", name="Export CSV").click()
    expect(page.locator("#export-notice")).to_contain_text("The export was cut at 1 row (")


COLOURS = "e => ['color', 'backgroundColor', 'borderTopColor'].map((p) => getComputedStyle(e)[p])"


def colours(box: Locator) -> tuple[str, ...]:
    """A box's text, background and border colours, as the browser computes them."""
    return tuple(box.evaluate(COLOURS))


def palette(page: Page, name: str) -> str:
    """A colour of the style sheet's palette (a custom property of :root), computed."""
    return str(
        page.evaluate(
            """(name) => {
                const probe = document.createElement("i");
                probe.style.color = `var(${name})`;
                document.body.append(probe);
                const colour = getComputedStyle(probe).color;
                probe.remove();
                return colour;
            }""",
            name,
        )
    )


def test_a_success_notice_looks_like_a_success_not_a_warning_or_an_error(
    page, world, expected_console_errors
):
    expected_console_errors.append("status of 500")
    agent = world.agent("exported", ALLOW_CALENDAR)
    world.decide(agent, "calendar.create")
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    notice = page.locator("#export-notice")
    export = page.get_by_role("button", name="Export CSV")

    with page.expect_download():
        export.click()
    expect(notice).to_contain_text("Downloaded svc-audit-log-")
    expect(notice).to_have_class(re.compile(r"\bok\b"))
    done = colours(notice)

    # the same notice, when the file was cut: a warning
    cut = {"X-Svc-Export-Truncated": "true", "X-Svc-Export-Limit": "5000"}
    page.route(
        requests_to("/v1/audit-logs/export"),
        lambda route: route.fulfill(status=200, headers=cut, content_type="text/csv", body="x\n"),
        times=1,
    )
    with page.expect_download():
        export.click()
    expect(notice).to_contain_text("cut at 5000 rows")
    expect(notice).to_have_class(re.compile(r"\bwarn\b"))
    warned = colours(notice)

    # an export the service refuses: an error
    page.route(
        requests_to("/v1/audit-logs/export"),
        answer_with(500, "INTERNAL_ERROR", "unexpected server error"),
        times=1,
    )
    export.click()
    message = page.locator("#message")
    expect(message).to_have_text("The service answered 500 INTERNAL_ERROR: unexpected server error")
    erred = colours(message)

    assert done[:2] == (palette(page, "--ok"), palette(page, "--ok-bg"))  # green, as "… revoked."
    assert warned[:2] == (palette(page, "--warn"), palette(page, "--warn-bg"))
    assert erred[:2] == (palette(page, "--bad"), palette(page, "--bad-bg"))
    for a, b in [(done, warned), (done, erred)]:
        assert all(x != y for x, y in zip(a, b, strict=True)), (a, b)


def cell_edges(row: Locator) -> list[tuple[float, float]]:
    """The top and bottom border of every cell of a table row, in CSS pixels."""
    edges = row.evaluate(
        "r => [...r.cells].map((c) => c.getBoundingClientRect()).map((b) => [b.top, b.bottom])"
    )
    return [(round(top, 1), round(bottom, 1)) for top, bottom in edges]


def test_the_cells_of_a_row_share_its_top_and_bottom_borders(page, world):
    world.agent(
        "a-rather-long-agent-name-that-wraps-onto-a-second-line-in-its-cell", ALLOW_CALENDAR
    )
    suspended = world.agent("paused", ALLOW_CALENDAR)
    world.http.patch(f"/v1/agents/{suspended}", json={"status": "suspended"})
    world.agent("x", ALLOW_CALENDAR)
    sign_in(page, world.admin)
    rows = page.locator("tr[data-agent]")
    expect(rows).to_have_count(3)
    expect(rows.get_by_role("button", name="Reactivate")).to_have_count(1)
    for n in range(3):
        edges = cell_edges(rows.nth(n))
        assert len(set(edges)) == 1, edges  # one top and one bottom for every cell
    # each row starts where the row above it ends
    tops = [cell_edges(rows.nth(n))[0] for n in range(3)]
    assert [bottom for _, bottom in tops[:-1]] == [top for top, _ in tops[1:]], tops
    # a table that fits the screen has no shadow on its edges
    expect(page.locator("main table").locator("xpath=..")).to_have_css("box-shadow", "none")

    page.get_by_role("link", name="API keys").click()
    keys = page.locator("#keys tbody tr")
    expect(keys).to_have_count(1)
    edges = cell_edges(keys.first)
    assert len(set(edges)) == 1, edges


def test_fields_side_by_side_line_up(page, world):
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    labels = page.locator("#audit-filters label")
    expect(labels).to_have_count(8)
    boxes = labels.evaluate_all(
        "ls => ls.map((l) => [l.firstChild, l.lastChild].map((e) => e.getBoundingClientRect()))"
    )
    first_row = [(round(name["top"], 1), round(field["bottom"], 1)) for name, field in boxes[:6]]
    assert len(set(first_row)) == 1, first_row  # 1280 px wide: six fields in a row, in line


TABLES = {
    "#/agents": "#agents",
    "agent": "#policies",
    "#/approvals": "#pending-approvals",
    "#/audit": "#entries",
    "#/keys": "#keys",
}


@pytest.mark.parametrize("route", ["#/agents", "agent", "#/approvals", "#/audit", "#/keys"])
def test_every_table_scrolls_sideways_on_a_phone_and_the_page_does_not(browser, base, world, route):
    agent = world.agent(LONG_NAME, ALLOW_CALENDAR, REFUNDS)
    world.decide(agent, "calendar.create", title="standup with a long title", room="4.12")
    if route == "#/approvals":  # one pending approval, and nothing decided: one table
        world.escalate(agent, amount=5000)
    world.post("/v1/api-keys", {"name": f"{LONG_NAME}_key", "scopes": ["read-only"]})
    context = browser.new_context(viewport=PHONE, base_url=base, is_mobile=True)
    phone = context.new_page()
    sign_in(phone, world.admin)
    phone.goto(f"/dashboard/{f'#/agents/{agent}' if route == 'agent' else route}")
    # the page asked for, not the list of agents signing in showed before it
    expect(phone.locator(TABLES[route])).to_be_visible()
    tables = phone.locator("main table")
    expect(tables).to_have_count(2 if route == "agent" else 1)
    expect(tables.locator("tbody tr").first).to_be_visible()
    # and whatever the page draws after its tables (the audit page's chart, above its table)
    # drawn: the table where it stays
    expect(phone.locator("main [aria-busy='true']")).to_have_count(0)
    for n in range(tables.count()):
        table = tables.nth(n)
        box = table.locator("xpath=..")
        last = table.locator("thead th").last
        expect(box).to_have_css("overflow-x", re.compile("^(auto|scroll)$"))
        expect(last).not_to_be_in_viewport(ratio=1)  # wider than the phone: the rest is beyond
        expect(box).to_have_css("box-shadow", MORE_RIGHT)  # and the right edge says so
        expect(box).not_to_have_css("box-shadow", MORE_LEFT)

        table.locator("thead th").first.hover()
        phone.mouse.wheel(3000, 0)  # a sideways swipe on the table
        # the last column, all of it on the screen (but for a rounding: a scroll offset is
        # whole pixels, a column's width is not)
        expect(last).to_be_in_viewport(ratio=0.99)
        expect(box).to_have_css("box-shadow", MORE_LEFT)
        expect(box).not_to_have_css("box-shadow", MORE_RIGHT)
        # the table moved in its box; the page did not
        assert phone.evaluate("[window.scrollX, document.documentElement.scrollWidth]") == [
            0,
            PHONE["width"],
        ]
    context.close()


@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["phone", "laptop"])
def test_messages_line_up_with_the_panels_and_long_names_wrap(browser, base, world, viewport):
    world.agent(LONG_NAME, ALLOW_CALENDAR)
    context = browser.new_context(viewport=viewport, base_url=base)
    tab = context.new_page()
    sign_in(tab, world.admin)
    tab.get_by_role("button", name="Suspend").click()
    confirm(tab, "Suspend")
    message = tab.locator("#message")
    expect(message).to_have_text(f"Agent “{LONG_NAME}” is now suspended.")
    # the list is drawn again after the message: measure the new one, not one going away
    row = tab.locator(f"tr[data-agent='{LONG_NAME}']")
    expect(row.get_by_role("button", name="Reactivate")).to_be_visible()
    panel = tab.locator("main .panel").first
    expect(panel).to_be_visible()
    boxes = [message.bounding_box(), panel.bounding_box()]
    assert all(boxes), boxes
    sides = [(round(b["x"], 1), round(b["x"] + b["width"], 1)) for b in boxes if b]
    assert sides[0] == sides[1], sides
    width = viewport["width"]
    assert tab.evaluate("document.documentElement.scrollWidth") == width

    tab.get_by_role("link", name=LONG_NAME).click()
    expect(tab.locator("main h1")).to_contain_text(LONG_NAME)
    assert tab.evaluate("document.documentElement.scrollWidth") == width

    tab.get_by_role("link", name="API keys").click()
    form = tab.locator("#create-key")
    form.locator("input[name=name]").fill(f"{LONG_NAME}_key")
    form.get_by_role("button", name="Create key").click()
    expect(tab.locator(f"tr[data-key='{LONG_NAME}_key']")).to_be_visible()  # the list, redrawn
    heading = tab.locator("#new-key h2")
    expect(heading).to_have_text(f"Key “{LONG_NAME}_key” created")
    inside = tab.locator("#new-key").bounding_box()
    drawn = heading.bounding_box()
    assert drawn["x"] + drawn["width"] <= inside["x"] + inside["width"]
    assert tab.evaluate("document.documentElement.scrollWidth") == width
    context.close()


# ------------------------------------------------------------------------ the audit chain


def audit_entries(world: World) -> list[dict[str, Any]]:
    """The workspace's audit entries as the API lists them, newest first."""
    entries: list[dict[str, Any]] = world.http.get("/v1/audit-logs").json()["data"]
    return entries


def test_the_audit_page_numbers_each_entry_and_its_details_show_its_hash(page, world):
    agent = world.agent("chained", ALLOW_CALENDAR)
    for tool in ("calendar.create", "mail.send", "calendar.read"):
        world.decide(agent, tool, token="hunter2")
    entries = audit_entries(world)
    assert [e["seq"] for e in entries] == [3, 2, 1]
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    expect(page.locator("#entries thead th").first).to_have_text("#")
    rows = page.locator("#entries tbody tr")
    expect(rows.locator("td.seq")).to_have_text(["3", "2", "1"])
    expect(rows.nth(1)).to_contain_text("mail.send")
    rows.nth(1).locator("summary").click()
    details = rows.nth(1).locator(".chain")
    expect(details).to_contain_text("hash of #2")
    expect(details.locator(".hash")).to_have_text(entries[1]["hash"])
    assert re.fullmatch(r"[0-9a-f]{64}", entries[1]["hash"])
    expect(rows.nth(0).locator(".chain")).to_be_hidden()  # in the details, closed until opened

    # an agent's latest decisions are numbered the same way
    page.goto(f"/dashboard/#/agents/{agent}")
    expect(page.locator("#entries tbody td.seq")).to_have_text(["3", "2", "1"])


def test_the_verify_panel_shows_what_the_current_checkpoint_signs(page, world, tmp_path):
    agent = world.agent("chained", ALLOW_CALENDAR)
    for n, tool in enumerate(["calendar.create", "mail.send", "calendar.read", "calendar.create"]):
        world.decide(agent, tool, n=n, token="hunter2")
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    rows = page.locator("#entries tbody tr")
    expect(rows).to_have_count(4)
    panel = page.locator("#verify")
    expect(panel).to_contain_text("agentauth audit verify --checkpoint FILE")
    expect(panel).to_contain_text("away from the database")
    expect(page.locator("#checkpoint")).to_be_hidden()  # nothing fetched before it is asked for
    page.get_by_role("button", name="Fetch checkpoint").click()

    entries = audit_entries(world)
    newest = entries[0]
    note = world.http.get("/v1/audit-logs/checkpoint").text
    public_key = world.http.get("/v1/audit-logs/public-key").text.strip()
    workspace = note.split("\n")[0].removeprefix("agentauth/")
    assert newest["seq"] == len(entries) == 4
    expect(page.locator("#checkpoint-signature")).to_have_text(re.compile(r"^Signature valid: "))
    expect(page.locator("#checkpoint-signature")).to_have_class(re.compile(r"\bok\b"))
    expect(page.locator("#checkpoint-size")).to_have_text("4 entries: #1 to #4")
    expect(page.locator("#checkpoint-head .hash")).to_have_text(newest["hash"])
    expect(page.locator("#checkpoint-head")).to_contain_text("the hash of entry #4")
    expect(page.locator("#checkpoint-log")).to_have_text(f"the audit log of workspace {workspace}")
    expect(page.locator("#checkpoint-key-id .mono")).to_have_text(public_key.split("+")[1])
    expect(page.locator("#checkpoint-public-key")).to_have_text(public_key)
    # the note exactly as the service signed it (signing is deterministic: the same text, the
    # same signature), and the command that checks the log against it later
    assert page.locator("#checkpoint-note").text_content() == note
    assert note.split("\n")[3:5] == ["", f"\u2014 agentauth {note.split()[-1]}"]
    expect(page.locator("#verify-command")).to_have_text(
        'agentauth audit verify --db "$DATABASE_URL" --workspace NAME '
        "--checkpoint agentauth-checkpoint-4.txt"
    )
    rows.first.locator("summary").click()
    expect(rows.first.locator(".chain .hash")).to_have_text(newest["hash"])
    screenshot(page, "audit", tmp_path)

    page.locator("#copy-checkpoint").click()
    expect(page.locator("#copy-checkpoint")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == note
    with page.expect_download() as download:
        page.get_by_role("button", name="Download").click()
    assert download.value.suggested_filename == "agentauth-checkpoint-4.txt"
    assert Path(download.value.path()).read_text(encoding="utf-8") == note

    # a new entry, fetched again: the panel follows the log
    world.decide(agent, "mail.send")
    page.get_by_role("button", name="Fetch checkpoint").click()
    expect(page.locator("#checkpoint-size")).to_have_text("5 entries: #1 to #5")
    expect(page.locator("#checkpoint-head .hash")).to_have_text(audit_entries(world)[0]["hash"])
    expect(page.locator("#checkpoint-signature")).to_have_text(re.compile(r"^Signature valid: "))

    # on a phone the note and the hashes stay in their panel: the page does not scroll sideways
    page.set_viewport_size(PHONE)
    expect(page.locator("#checkpoint-note")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_the_verify_panel_of_an_empty_log(page, world):
    sign_in(page, world.tenant.key("read-only"))
    page.get_by_role("link", name="Audit log").click()
    page.get_by_role("button", name="Fetch checkpoint").click()
    expect(page.locator("#checkpoint-size")).to_have_text("0 entries (an empty log)")
    expect(page.locator("#checkpoint-head .hash")).to_have_text("0" * 64)
    expect(page.locator("#checkpoint-signature")).to_have_text(re.compile(r"^Signature valid: "))


def test_a_checkpoint_whose_signature_does_not_verify_is_said_so(page, world):
    agent = world.agent("chained", ALLOW_CALENDAR)
    world.decide(agent, "calendar.create")
    world.decide(agent, "calendar.read")
    real = world.http.get("/v1/audit-logs/checkpoint").text
    origin, _size, _head, *signatures = real.split("\n")
    # the log cut back to its first entry, under the signature of the whole log
    first = audit_entries(world)[-1]["hash"]
    head = base64.b64encode(bytes.fromhex(first)).decode()
    forged = "\n".join([origin, "1", head, *signatures])
    page.route(
        requests_to("/v1/audit-logs/checkpoint"),
        lambda route: route.fulfill(status=200, content_type="text/plain", body=forged),
    )
    sign_in(page, world.tenant.key("read-only"))
    page.get_by_role("link", name="Audit log").click()
    page.get_by_role("button", name="Fetch checkpoint").click()
    verdict = page.locator("#checkpoint-signature")
    expect(verdict).to_contain_text("Signature does NOT verify")
    expect(verdict).to_have_class(re.compile(r"\bbad\b"))
    expect(page.locator("#checkpoint-size")).to_have_text("1 entry: #1")  # what it says
    expect(page.locator("#checkpoint-head .hash")).to_have_text(first)


NO_ED25519 = """
const importKey = SubtleCrypto.prototype.importKey;
SubtleCrypto.prototype.importKey = function (format, data, algorithm, ...rest) {
  if (algorithm && algorithm.name === "Ed25519") {
    return Promise.reject(new DOMException("Algorithm: Unrecognized name", "NotSupportedError"));
  }
  return importKey.call(this, format, data, algorithm, ...rest);
};
"""


def test_a_browser_without_ed25519_shows_the_checkpoint_unchecked(page, world):
    agent = world.agent("chained", ALLOW_CALENDAR)
    world.decide(agent, "calendar.create")
    page.add_init_script(NO_ED25519)
    sign_in(page, world.tenant.key("read-only"))
    page.get_by_role("link", name="Audit log").click()
    page.get_by_role("button", name="Fetch checkpoint").click()
    verdict = page.locator("#checkpoint-signature")
    expect(verdict).to_have_text(
        "Signature not checked here: this browser cannot check Ed25519 signatures "
        "(NotSupportedError). agentauth audit verify checks it."
    )
    expect(verdict).to_have_class(re.compile(r"\bwarn\b"))
    expect(page.locator("#checkpoint-size")).to_have_text("1 entry: #1")
    expect(page.locator("#checkpoint-head .hash")).to_have_text(audit_entries(world)[0]["hash"])


CHECKPOINT_FAILURES = {
    "checkpoint 500": (
        "/v1/audit-logs/checkpoint",
        answer_with(500, "INTERNAL_ERROR", "unexpected server error"),
        "No checkpoint: The service answered 500 INTERNAL_ERROR: unexpected server error",
        "status of 500",
    ),
    "public key unreachable": (
        "/v1/audit-logs/public-key",
        lambda route: route.abort(),
        "No checkpoint: Could not reach the service: Failed to fetch",
        "net::ERR_FAILED",
    ),
}


@pytest.mark.parametrize("failure", sorted(CHECKPOINT_FAILURES))
def test_a_checkpoint_that_cannot_be_fetched_is_said_so_beside_the_button(
    page, world, expected_console_errors, failure
):
    path, handler, shown, console = CHECKPOINT_FAILURES[failure]
    expected_console_errors.append(console)
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    page.route(requests_to(path), handler, times=1)
    button = page.get_by_role("button", name="Fetch checkpoint")
    button.click()
    expect(page.locator("#checkpoint-error")).to_have_text(shown)
    expect(page.locator("#checkpoint-size")).to_have_count(0)
    expect(button).to_be_enabled()
    button.click()  # answered this time
    expect(page.locator("#checkpoint-error")).to_have_count(0)
    expect(page.locator("#checkpoint-size")).to_have_text("0 entries (an empty log)")


def test_an_answer_that_is_not_a_checkpoint_is_said_so(page, world):
    page.route(
        requests_to("/v1/audit-logs/checkpoint"),
        lambda route: route.fulfill(status=200, content_type="text/plain", body="hello\n"),
    )
    sign_in(page, world.admin)
    page.get_by_role("link", name="Audit log").click()
    page.get_by_role("button", name="Fetch checkpoint").click()
    expect(page.locator("#checkpoint-signature")).to_have_text(
        "The service answered something that is not a signed checkpoint: "
        "no empty line between its text and its signatures."
    )
    expect(page.locator("#checkpoint-size")).to_have_count(0)


def test_a_key_revoked_meanwhile_is_signed_out_when_it_fetches_a_checkpoint(page, world):
    reader = world.key("reader", "read-only")
    sign_in(page, reader)
    page.get_by_role("link", name="Audit log").click()
    fetch = page.get_by_role("button", name="Fetch checkpoint")
    # the page has loaded with the key still valid: only the checkpoint's fetch meets the 401
    expect(fetch).to_be_visible()
    key_id = next(
        k["id"] for k in world.http.get("/v1/api-keys").json()["data"] if k["name"] == "reader"
    )
    assert world.http.delete(f"/v1/api-keys/{key_id}").status_code == 204
    fetch.click()
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#message")).to_contain_text("Signed out: ")
    assert page.evaluate("sessionStorage.length") == 0


# -------------------------------------------------------------------------------- approvals


def approval_row(page: Page, approval_id: str) -> Locator:
    return page.locator(f"tr[data-approval='{approval_id}']")


def shown_time(text: str) -> str:
    """An instant of the API as the page writes it: ``2026-11-25 17:20:21 UTC``."""
    return re.sub(r"\.\d+Z$", " UTC", text.replace("T", " "))


def decide_in_page(page: Page, approval_id: str, label: str, comment: str = "") -> None:
    row = approval_row(page, approval_id)
    if comment:
        row.get_by_role("textbox", name="Comment").fill(comment)
    row.get_by_role("button", name=label, exact=True).click()
    confirm(page, label)


def test_require_approval_rules_read_as_words(page, world):
    rules = [
        {"type": "require_approval", "tools": ["payments.refund"],
         "parameters": {"amount": {"max": 1000}}, "approval": {"ttlSeconds": 3600}},
        {"type": "require_approval", "tools": ["shell.*"]},
        {"type": "require_approval", "tools": ["mail.send", "mail.forward"],
         "parameters": {"to": {"regex": "@example\\.com$"}}, "approval": {"ttlSeconds": 5400}},
        {"type": "require_approval", "parameters": {"amount": {"min": 10, "max": 500}}},
        {"type": "require_approval", "tools": ["db.drop"],
         "parameters": {"env": {"enum": ["dev", "staging"]}}, "approval": {"ttlSeconds": 604800}},
        {"type": "tool_allowlist"},
    ]  # fmt: skip
    agent = world.agent("careful", {"name": "careful", "rules": rules})
    sign_in(page, world.admin)
    page.goto(f"/dashboard/#/agents/{agent}")
    expect(page.locator("#policies ol.rules li")).to_have_text(
        [
            REFUND_RULE,
            "needs a person's approval for every call of shell.*",
            "needs a person's approval for mail.send, mail.forward when to does not match "
            "/@example\\.com$/ (approval lasts 90 min)",
            "needs a person's approval for any tool when amount is below 10 or amount is above 500",
            "needs a person's approval for db.drop when env is not in {dev, staging} "
            "(approval lasts 7 d)",
            "allow all tools",
        ]
    )


def test_the_approvals_page_lists_pending_first_with_redacted_parameters(page, world, tmp_path):
    agent = world.agent("refunder", REFUNDS)
    waiting = world.escalate(agent, amount=5000, order="A-1042", token="hunter2")
    denied = world.escalate(agent, amount=6000, order="A-1043")  # newer, but decided
    approver = world.key("ops-approver", "approver")
    answer = httpx.post(
        f"{world.base}/v1/approvals/{denied}/deny",
        json={"comment": "not without the receipt"},
        headers=bearer(approver),
    )
    assert answer.status_code == 200, answer.text
    assert world.decide(agent, "payments.refund", amount=50)["allowed"] is True
    sign_in(page, world.admin)
    count = page.locator("#pending-count")
    expect(count).to_have_text("1")  # in the navigation, on every page
    expect(count).not_to_have_class(re.compile(r"\bnone\b"))  # highlighted: something waits

    page.get_by_role("link", name="Approvals").click()
    expect(page.locator("main table").first).to_have_id("pending-approvals")  # pending first
    pending = page.locator("#pending-approvals tbody tr")
    expect(pending).to_have_count(1)
    row = approval_row(page, waiting)
    expect(row.locator(".badge")).to_have_text("pending")
    expect(row.get_by_role("link", name="refunder")).to_have_attribute("href", f"#/agents/{agent}")
    expect(row).to_contain_text("payments.refund")
    parameters = row.locator("pre")
    expect(parameters).to_contain_text('"amount": 5000')
    expect(parameters).to_contain_text('"order": "A-1042"')
    expect(parameters).to_contain_text('"token": "[REDACTED]"')
    assert "hunter2" not in page.content()
    expect(row.get_by_role("link", name="refunds")).to_have_attribute("href", f"#/agents/{agent}")
    expect(row.locator("td.policy")).to_contain_text(REFUND_RULE)
    expires = world.approval(waiting)["expiresAt"]
    expect(row.locator("td.expires")).to_contain_text(shown_time(expires))
    expect(row.locator("td.expires")).to_contain_text(re.compile(r"in (59 min|1 h)"))
    expect(row.get_by_role("button", name="Approve")).to_be_visible()

    rest = page.locator("#approvals tbody tr")
    expect(rest).to_have_count(1)
    decided = approval_row(page, denied)
    expect(decided.locator(".badge")).to_have_text("denied")
    expect(decided).to_contain_text("denied by ops-approver")
    expect(decided).to_contain_text("“not without the receipt”")
    expect(decided.get_by_role("button")).to_have_count(0)  # nothing left to decide
    screenshot(page, "approvals", tmp_path)

    # filtered by status: that status only, newest first
    page.locator("#approval-filters select[name=status]").select_option("denied")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("main h2")).to_have_text(["1 denied approval"])
    expect(page.locator("#pending-approvals")).to_have_count(0)
    expect(page.locator("#approvals tbody tr")).to_have_count(1)
    expect(approval_row(page, denied)).to_be_visible()

    # one approval on a page of its own, linked from the list
    page.get_by_role("button", name="Clear").click()
    row.get_by_role("link", name=re.compile(r"^requested ")).click()
    detail = page.locator("#approval")
    expect(detail.locator("h1")).to_have_text("Approval of payments.refund pending")
    expect(detail.locator("pre")).to_contain_text('"token": "[REDACTED]"')
    expect(detail).to_contain_text(world.approval(waiting)["parametersDigest"])
    screenshot(page, "approval", tmp_path)
    expect(count).to_have_text("1")


def test_an_approver_key_approves_with_a_comment_and_the_next_identical_call_is_allowed(
    page, world, tmp_path
):
    agent = world.agent("refunder", REFUNDS)
    approval_id = world.escalate(agent, amount=5000, order="A-1042")
    # an admin makes the approver key in the page (the admin key made the call: it may not decide)
    sign_in(page, world.admin)
    page.get_by_role("link", name="API keys").click()
    form = page.locator("#create-key")
    form.locator("input[name=name]").fill("ops-approver")
    form.locator("input[value=read-only]").uncheck()
    form.locator("input[value=approver]").check()
    form.get_by_role("button", name="Create key").click()
    expect(page.locator("tr[data-key='ops-approver']")).to_contain_text("approver")
    approver = page.locator("#new-key-value").input_value()
    page.get_by_role("button", name="Sign out").click()

    probes: list[Request] = []
    page.on("request", lambda r: probes.append(r) if "/v1/approvals/" in r.url else None)
    sign_in(page, approver)
    expect(page.locator("#who-scope")).to_have_text("approver")
    # the page learnt the scope by reading (GET /v1/whoami), not by trying a decision
    assert [r.method for r in probes if r.method != "GET"] == []
    expect(page.locator("#pending-count")).to_have_text("1")
    # an approver decides approvals and changes nothing else: no agent buttons
    expect(page.locator("tr[data-agent='refunder']")).to_be_visible()
    expect(page.get_by_role("button", name="Suspend")).to_have_count(0)

    page.get_by_role("link", name="Approvals").click()
    row = approval_row(page, approval_id)
    row.get_by_role("textbox", name="Comment").fill("refund agreed with the customer")
    row.get_by_role("button", name="Approve").click()
    expect(page.locator("#confirm-text")).to_contain_text(
        "Approve the call of payments.refund by agent “refunder”?"
    )
    confirm(page, "Approve")
    expect(page.locator("#message")).to_have_text(
        "Approved: the next identical call of payments.refund by “refunder” will be allowed once."
    )
    expect(page.locator("#pending-approvals")).to_have_count(0)
    expect(page.locator("main")).to_contain_text("Nothing waits for a decision.")
    expect(row.locator(".badge")).to_have_text("approved")
    expect(row).to_contain_text("approved by ops-approver")
    expect(row).to_contain_text("“refund agreed with the customer”")
    expect(page.locator("#pending-count")).to_have_text("0")
    expect(page.locator("#pending-count")).to_have_class(re.compile(r"\bnone\b"))  # muted
    stored = world.approval(approval_id)
    assert stored["status"] == "approved"
    assert stored["comment"] == "refund agreed with the customer"
    assert stored["decidedBy"]["name"] == "ops-approver"

    allowed = world.decide(agent, "payments.refund", amount=5000, order="A-1042")
    assert allowed["allowed"] is True
    assert allowed["approvalId"] == approval_id
    again = world.decide(agent, "payments.refund", amount=5000, order="A-1042")
    assert again["outcome"] == "escalated"  # single use: the next identical call asks anew

    # the audit log: the escalation, the decision and the call it allowed, each with its approval
    page.get_by_role("link", name="Audit log").click()
    entries = page.locator("#entries tbody tr")
    expect(entries).to_have_count(4)
    expect(entries.nth(0).locator(".badge").first).to_have_text("escalated")
    expect(entries.nth(1).locator(".badge").first).to_have_text("allowed")
    decision = entries.nth(2)
    expect(decision.locator(".badge")).to_have_text(["allowed", "approval approved"])
    expect(decision).to_contain_text("refund agreed with the customer")
    expect(entries.nth(3).locator(".badge").first).to_have_text("escalated")
    for n in (1, 2, 3):
        link = entries.nth(n).get_by_role("link", name=re.compile(r"^approval "))
        expect(link).to_have_attribute("href", f"#/approvals/{approval_id}")
    entries.nth(2).get_by_role("link", name=re.compile(r"^approval ")).click()
    expect(page.locator("#approval .badge")).to_have_text("used")
    expect(page.locator("#approval")).to_contain_text("approved by ops-approver")
    expect(page.locator("#pending-count")).to_have_text("1")  # the new escalation


def test_the_key_that_made_the_call_is_refused_in_words(page, world):
    agent = world.agent("refunder", REFUNDS)
    approval_id = world.escalate(agent, amount=5000)  # made with the admin key
    sign_in(page, world.admin)
    page.get_by_role("link", name="Approvals").click()
    decide_in_page(page, approval_id, "Approve", "my own refund")
    message = page.locator("#message")
    expect(message).to_contain_text(
        "This key may not decide this approval: it made the call that asked for it"
    )
    expect(message).to_contain_text("The service answered 403 SELF_APPROVAL_FORBIDDEN: ")
    row = approval_row(page, approval_id)
    expect(row.locator(".badge")).to_have_text("pending")
    expect(row.get_by_role("textbox", name="Comment")).to_have_value("my own refund")  # kept
    assert world.approval(approval_id)["status"] == "pending"


def test_a_read_only_key_sees_approvals_without_buttons(page, world):
    agent = world.agent("refunder", REFUNDS)
    approval_id = world.escalate(agent, amount=5000, token="hunter2")
    reader = world.tenant.key("read-only")
    sign_in(page, reader)
    expect(page.locator("#who-scope")).to_have_text("read-only")
    expect(page.locator("#pending-count")).to_have_text("1")
    page.get_by_role("link", name="Approvals").click()
    row = approval_row(page, approval_id)
    expect(row.locator(".badge")).to_have_text("pending")
    expect(row.locator("pre")).to_contain_text('"token": "[REDACTED]"')
    expect(page.locator("#approvals-read-only")).to_contain_text("admin or approver scope")
    expect(page.locator("#pending-approvals thead th")).to_have_count(6)  # no Decision column
    assert page.locator("main button").all_inner_texts() == [
        "Apply filters", "Clear", "← Newer", "Older →",
    ]  # fmt: skip
    expect(page.get_by_role("textbox", name="Comment")).to_have_count(0)
    assert_no_mutation_controls(page)
    page.goto(f"/dashboard/#/approvals/{approval_id}")
    expect(page.locator("#approval h1")).to_contain_text("pending")
    assert page.locator("main button").count() == 0
    assert_no_mutation_controls(page)


def test_deny_and_an_approval_decided_meanwhile(page, world):
    agent = world.agent("refunder", REFUNDS)
    first = world.escalate(agent, amount=5000)
    second = world.escalate(agent, amount=7000)
    approver = world.key("ops-approver", "approver")
    colleague = world.key("colleague", "approver")
    sign_in(page, approver)
    page.get_by_role("link", name="Approvals").click()
    expect(page.locator("#pending-count")).to_have_text("2")
    decide_in_page(page, first, "Deny", "no receipt")
    expect(page.locator("#message")).to_contain_text(
        "Denied: identical calls of payments.refund by “refunder” will be denied until "
    )
    row = approval_row(page, first)
    expect(row.locator(".badge")).to_have_text("denied")
    expect(row).to_contain_text("denied by ops-approver")
    expect(page.locator("#pending-count")).to_have_text("1")
    refused = world.decide(agent, "payments.refund", amount=5000)
    assert refused["allowed"] is False
    assert refused["approvalId"] == first

    # a colleague decides the other one while this page still offers it: the page says so
    decided = httpx.post(f"{world.base}/v1/approvals/{second}/approve", headers=bearer(colleague))
    assert decided.status_code == 200, decided.text
    decide_in_page(page, second, "Deny")
    message = page.locator("#message")
    expect(message).to_contain_text("This approval no longer waits for a decision")
    expect(message).to_contain_text("The service answered 409 APPROVAL_NOT_PENDING: ")
    other = approval_row(page, second)
    expect(other.locator(".badge")).to_have_text("approved")  # the page, redrawn
    expect(other).to_contain_text("approved by colleague")
    expect(page.locator("#pending-count")).to_have_text("0")
    assert world.approval(second)["status"] == "approved"


def test_an_expired_approval_shows_as_expired(page, world):
    agent = world.agent("refunder", REFUNDS)
    approval_id = world.escalate(agent, amount=5000)
    world.expire(approval_id)
    approver = world.key("ops-approver", "approver")
    sign_in(page, approver)
    expect(page.locator("#who-scope")).to_have_text("approver")
    page.get_by_role("link", name="Approvals").click()
    expect(page.locator("main")).to_contain_text("Nothing waits for a decision.")
    row = approval_row(page, approval_id)
    expect(row.locator(".badge")).to_have_text("expired")
    expect(row.locator("td.expires")).to_contain_text(re.compile(r"\d+ min ago"))
    expect(row.get_by_role("button")).to_have_count(0)
    expect(page.locator("#pending-count")).to_have_text("0")
    page.locator("#approval-filters select[name=status]").select_option("expired")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("main h2")).to_have_text(["1 expired approval"])
    expect(page.locator("#approvals tbody tr")).to_have_count(1)
    page.locator("#approval-filters select[name=status]").select_option("pending")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("main h2")).to_have_text(["0 pending approvals"])
    expect(page.locator("main")).to_contain_text("No approvals match.")


@pytest.mark.parametrize("scope", ["approver", "read-only"])
def test_a_scope_probe_of_a_non_admin_key_that_fails_is_shown_and_signs_nobody_in(
    page, world, expected_console_errors, scope
):
    expected_console_errors.append("status of 500")
    key = world.tenant.key(scope)
    probe = requests_to("/v1/whoami")
    page.route(probe, answer_with(500, "INTERNAL_ERROR", "unexpected server error"), times=1)
    page.goto("/dashboard/")
    page.locator("#key-input").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#message")).to_have_text(
        "The service answered 500 INTERNAL_ERROR: unexpected server error"
    )
    expect(page.locator("#who")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#who-scope")).to_have_text(scope)


def test_the_agent_page_shows_its_limits_in_use_as_bars(page, world, tmp_path):
    month = 2_592_000
    rules = [
        {"type": "rate_limit", "per": "session",
         "rateLimit": {"maxCalls": 4, "windowSeconds": 86400}},
        {"type": "budget", "tools": ["payments.*"],
         "budget": {"parameter": "amount", "max": 1000, "windowSeconds": month}},
        {"type": "tool_allowlist"},
    ]  # fmt: skip
    agent = world.agent("spender", {"name": "spend", "rules": rules})
    for amount in (250, 500):
        body = {"agent_id": agent, "tool_name": "payments.refund", "parameters": {"amount": amount}}
        assert world.post("/v1/authorize", {**body, "session_id": "chat-7"})["allowed"] is True
    sign_in(page, world.admin)
    page.goto(f"/dashboard/#/agents/{agent}")
    expect(page.locator("#policies ol.rules li")).to_have_text(
        [
            "max 4 calls / 86400 s per session",
            f"spend at most 1000 of amount / {month} s (on payments.*)",
            "allow all tools",
        ]
    )
    rows = page.locator("#limits tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td.usage")).to_contain_text("ask with a session")
    expect(rows.nth(1).locator("td.usage")).to_contain_text("750 of 1000 used, 250 left")
    expect(rows.nth(1).locator("meter")).to_have_attribute("value", "750")
    page.locator("#usage-session input[name=session_id]").fill("chat-7")
    page.locator("#usage-session button").click()
    expect(page.locator("#limits tbody tr").nth(0).locator("td.usage")).to_contain_text(
        "2 of 4 used, 2 left"
    )
    screenshot(page, "agent-limits", tmp_path)


def test_an_entry_names_its_session_and_the_audit_page_filters_by_it(page, world):
    agent = world.agent("chatty", {"name": "all", "rules": [{"type": "tool_allowlist"}]})
    for session in ("chat-1", "chat-2", "chat-1"):
        body = {"agent_id": agent, "tool_name": "echo", "parameters": {}, "session_id": session}
        world.post("/v1/authorize", body)
    sign_in(page, world.admin)
    page.goto("/dashboard/#/audit")
    expect(page.locator("#entries tbody tr")).to_have_count(3)
    page.locator("#entries .session a").first.click()  # the newest: chat-1
    expect(page.locator("#entries tbody tr")).to_have_count(2)
    expect(page.locator("#audit-filters input[name=session_id]")).to_have_value("chat-1")
    expect(page.locator("#entries .session")).to_have_text(["session chat-1"] * 2)


# ------------------------------------------------------- the audit log at scale (decisions §9)


def test_the_audit_page_walks_by_cursor_forward_back_and_to_the_newest(page, world):
    agent = world.agent("walked", ALLOW_CALENDAR)
    append_entries(world.app, world.tenant, world.clock, agent, 7)
    sign_in(page, world.admin)
    page.goto("/dashboard/#/audit?limit=3")
    rows = page.locator("#entries tbody td.seq")
    count = page.locator(".pager .count")
    newest = page.get_by_role("button", name="Newest")
    older = page.get_by_role("button", name="Older →")
    expect(rows).to_have_text(["7", "6", "5"])
    expect(count).to_have_text("1\u20133 of 7")
    expect(newest).to_be_disabled()

    older.click()
    expect(rows).to_have_text(["4", "3", "2"])
    expect(count).to_have_text("4\u20136 of 7")
    assert "cursor=" in page.url
    # an entry written during the walk is counted, but never shown further down it
    world.decide(agent, "calendar.create")
    older.click()
    expect(rows).to_have_text(["1"])
    expect(count).to_have_text("7\u20137 of 8")
    expect(older).to_be_disabled()
    expect(newest).to_be_enabled()

    # back and forward through the browser's history, and a reload, show the same pages
    page.go_back()
    expect(rows).to_have_text(["4", "3", "2"])
    expect(count).to_have_text("4\u20136 of 8")
    page.go_back()  # the first page has no cursor: it is the newest entries, now
    expect(rows).to_have_text(["8", "7", "6"])
    page.go_forward()  # the walk's cursor: where the walk was
    expect(rows).to_have_text(["4", "3", "2"])
    page.go_forward()
    expect(rows).to_have_text(["1"])
    page.go_back()
    expect(rows).to_have_text(["4", "3", "2"])
    page.reload()
    expect(rows).to_have_text(["4", "3", "2"])

    newest.click()
    expect(rows).to_have_text(["8", "7", "6"])
    expect(count).to_have_text("1\u20133 of 8")
    assert "cursor=" not in page.url
    expect(newest).to_be_disabled()


def test_filters_start_a_new_walk_and_a_refused_cursor_starts_from_the_newest(page, world):
    agent = world.agent("walked", ALLOW_CALENDAR)
    append_entries(world.app, world.tenant, world.clock, agent, 4)
    append_entries(world.app, world.tenant, world.clock, agent, 2, result="allowed")
    sign_in(page, world.admin)
    page.goto("/dashboard/#/audit?limit=2")
    rows = page.locator("#entries tbody td.seq")
    expect(rows).to_have_text(["6", "5"])
    page.get_by_role("button", name="Older →").click()
    expect(rows).to_have_text(["4", "3"])
    page.locator("#audit-filters select[name=result]").select_option("denied")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_text(["4", "3"])
    expect(page.locator(".pager .count")).to_have_text("1\u20132 of 4")
    assert "cursor=" not in page.url

    # the cursor of a walk over other filters is refused by the service: said, and the walk
    # starts again from the newest of the page's own filters
    walk = world.http.get("/v1/audit-logs", params={"limit": 2}).json()
    cursor = walk["pagination"]["nextCursor"]
    page.goto(f"/dashboard/#/audit?limit=2&result=denied&cursor={cursor}&seen=2")
    expect(page.locator("#message")).to_contain_text("400 VALIDATION_ERROR")
    expect(page.locator("#message")).to_contain_text("Showing the newest entries instead.")
    expect(rows).to_have_text(["4", "3"])
    expect(page.locator(".pager .count")).to_have_text("1\u20132 of 4")
    assert "cursor=" not in page.url


def bars(
    page: Page, result: str, chart: str = "#decisions-chart"
) -> list[tuple[str | None, str | None]]:
    """(start, count) of the chart's bars of ``result``."""
    drawn = page.locator(f"{chart} g.series[data-result='{result}'] rect")
    return [
        (bar.get_attribute("data-start"), bar.get_attribute("data-count")) for bar in drawn.all()
    ]


def test_the_chart_draws_decisions_over_time_by_result(page, world):
    agent = world.agent("charted", ALLOW_CALENDAR)
    world.clock.moment = datetime(2026, 11, 21, 12, 5, tzinfo=UTC)
    append_entries(world.app, world.tenant, world.clock, agent, 3, result="allowed")
    world.clock.advance(2 * 3600)  # 14:05
    append_entries(world.app, world.tenant, world.clock, agent, 2)
    append_entries(world.app, world.tenant, world.clock, agent, 1, result="allowed")
    sign_in(page, world.admin)
    page.goto("/dashboard/#/audit?from=2026-11-21T11:00&to=2026-11-21T18:00")
    chart = page.locator("#decisions-chart svg")
    expect(chart).to_have_attribute("data-bucket", "hour")
    expect(chart).to_have_attribute("role", "img")
    title = (
        "Decisions per hour by result, 2026-11-21 11:00 to 2026-11-21 18:00 UTC: "
        "4 allowed, 2 denied"
    )
    expect(page.locator("#chart-title")).to_have_text(title)
    expect(page.locator("#decisions-chart figcaption")).to_have_text(title)
    expect(page.locator("#decisions-chart g.series")).to_have_count(2)
    assert bars(page, "allowed") == [
        ("2026-11-21T12:00:00.000Z", "3"),
        ("2026-11-21T14:00:00.000Z", "1"),
    ]
    assert bars(page, "denied") == [("2026-11-21T14:00:00.000Z", "2")]
    expect(page.locator("#decisions-chart .legend li")).to_have_text(["allowed: 4", "denied: 2"])
    # a picture of those counts: 8 hours on the axis, the bars as tall as their counts, the
    # 14:00 ones stacked, the empty hours left empty
    slots = page.locator("#decisions-chart rect")
    heights = [float(slots.nth(n).get_attribute("height") or 0) for n in range(3)]
    assert heights[0] == pytest.approx(3 * heights[1])
    assert heights[2] == pytest.approx(2 * heights[1])
    tops = [float(slots.nth(n).get_attribute("y") or 0) for n in range(3)]
    assert tops[2] + heights[2] == pytest.approx(tops[1])  # denied on top of allowed
    # the counts up the side, the hours along the bottom (the first with its day)
    labels = chart.locator("text")
    expect(labels).to_contain_text(["0", "1", "2", "3", "11-21 11:00", "17:00", "per hour, UTC"])

    # narrowed to a result, the chart counts that result alone
    page.goto("/dashboard/#/audit?from=2026-11-21T11:00&to=2026-11-21T18:00&result=denied")
    expect(page.locator("#decisions-chart g.series")).to_have_count(1)
    expect(page.locator("#decisions-chart g.series rect")).to_have_count(1)
    assert bars(page, "denied") == [("2026-11-21T14:00:00.000Z", "2")]

    # a short range by minutes, a long one by days
    page.goto("/dashboard/#/audit?from=2026-11-21T14:00&to=2026-11-21T15:00")
    expect(chart).to_have_attribute("data-bucket", "minute")
    assert bars(page, "allowed") == [("2026-11-21T14:05:00.000Z", "1")]
    page.goto("/dashboard/#/audit?from=2026-11-10T00:00&to=2026-11-25T00:00")
    expect(chart).to_have_attribute("data-bucket", "day")
    assert bars(page, "allowed") == [("2026-11-21T00:00:00.000Z", "4")]

    # on a phone the chart shrinks to its panel and the page does not scroll sideways
    page.set_viewport_size(PHONE)
    expect(chart).to_be_in_viewport()
    box, panel = chart.bounding_box(), page.locator("main .panel").first.bounding_box()
    assert box is not None
    assert panel is not None
    assert box["x"] + box["width"] <= panel["x"] + panel["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_the_chart_of_an_empty_range_says_so(page, world):
    sign_in(page, world.tenant.key("read-only"))
    page.get_by_role("link", name="Audit log").click()
    expect(page.locator("#chart-empty")).to_have_text("No decisions in this range.")
    expect(page.locator("#decisions-chart figcaption")).to_contain_text(": no decisions")
    expect(page.locator("#decisions-chart svg")).to_have_count(0)
    expect(page.locator("main")).to_contain_text("No entries match.")


def test_the_retention_panel_shows_the_last_prune_and_its_archive(page, world, tmp_path):
    agent = world.agent("pruned", ALLOW_CALENDAR)
    append_entries(world.app, world.tenant, world.clock, agent, 5)
    sign_in(page, world.tenant.key("read-only"))
    page.get_by_role("link", name="Audit log").click()
    expect(page.locator("#retention-kept")).to_have_text("5 entries of 5 in the chain")
    expect(page.locator("#retention-pruned")).to_have_text(
        "never: the database holds the log from #1"
    )
    oldest = world.http.get("/v1/audit-logs", params={"seq_to": 1}).json()["data"][0]
    expect(page.locator("#retention-oldest")).to_have_text(f"#1, {shown_time(oldest['timestamp'])}")
    expect(page.locator("#retention-archive")).to_have_count(0)

    services = world.app.extensions["agentauth"]
    cut = world.clock.moment + timedelta(seconds=1)
    world.clock.advance(3600)
    done = prune(services.db, services.audit_key(), world.tenant.id, world.name, cut,
                 tmp_path / "archive", world.clock)  # fmt: skip
    assert done.ok
    assert done.archive is not None
    append_entries(world.app, world.tenant, world.clock, agent, 2)
    prune_entry = world.http.get("/v1/audit-logs", params={"seq_from": 6, "seq_to": 6}).json()
    page.reload()
    expect(page.locator("#retention-kept")).to_have_text("3 entries of 8 in the chain")
    expect(page.locator("#retention-pruned")).to_have_text("#1 to #5, archived")
    at = shown_time(prune_entry["data"][0]["timestamp"])
    expect(page.locator("#retention-oldest")).to_have_text(f"#6, {at}")
    expect(page.locator("#retention-last")).to_contain_text(at)
    expect(page.locator("#retention-last")).to_contain_text("entries #1 to #5")
    expect(page.locator("#retention-archive")).to_have_text(f"{world.name}-1-5.jsonl.gz")
    assert done.archive.name == f"{world.name}-1-5.jsonl.gz"
    # the list agrees: the pruned entries are gone from it
    expect(page.locator("#entries tbody td.seq")).to_have_text(["8", "7", "6"])


def test_the_policy_page_shows_its_mode_what_it_would_have_done_and_a_chart(page, world):
    """A shadow policy (decisions §10): marked on its agent's page and numbered in no
    evaluation order; its page says what its mode does, its report and a chart of its would-be
    results by day; the audit page notes each call it would have decided otherwise."""
    agent = world.agent("tried", {"name": "everything", "rules": [{"type": "tool_allowlist"}]})
    world.post("/v1/policies", {
        "agent_id": agent, "name": "no-refunds", "priority": 10, "mode": "shadow",
        "rules": [{"type": "tool_denylist", "tools": ["payments.refund"]}],
    })  # fmt: skip
    for tool in ("payments.refund", "search.web", "payments.refund"):
        assert world.decide(agent, tool)["allowed"] is True  # the real decision
    sign_in(page, world.admin)
    page.goto(f"/dashboard/#/agents/{agent}")
    row = page.locator("#policies tr[data-mode='shadow']")
    expect(row.locator(".badge").last).to_have_text("shadow")
    expect(row.locator("td").first).to_have_text("—")  # it decides no call
    expect(page.locator("#policies tr[data-mode='enforce'] td").first).to_have_text("1")
    row.get_by_role("link", name="no-refunds").click()
    expect(page.locator("main h1")).to_contain_text("no-refunds")
    expect(page.locator("main h1 .badge")).to_have_text("shadow")
    expect(page.locator("main")).to_contain_text("calls are decided without it")
    report = page.locator("#report")
    for name, count in (("Calls with a would-be decision", "3"), ("Changed by this policy", "2"),
                        ("… would deny", "2"), ("… would allow", "0")):  # fmt: skip
        expect(report.locator(f"[data-count='{name}']")).to_have_text(count)
    expect(page.locator("#report-tools tbody tr")).to_have_text(
        [re.compile(r"payments\.refund\s*2\s*2"), re.compile(r"search\.web\s*1\s*0")]
    )
    expect(page.locator("#report-samples summary")).to_contain_text("2 calls it changed")
    chart = page.locator("#would-be-chart svg")
    expect(chart).to_have_attribute("data-bucket", "day")
    today = datetime.now(UTC).strftime("%Y-%m-%dT00:00:00.000Z")
    assert bars(page, "denied", "#would-be-chart") == [(today, "2")]
    assert bars(page, "unchanged", "#would-be-chart") == [(today, "1")]
    expect(page.locator("#would-be-title")).to_contain_text("2 denied, 1 unchanged")

    page.goto("/dashboard/#/audit")
    notes = page.locator("#entries .would-be")
    expect(notes).to_have_count(2)
    expect(notes.first).to_contain_text("would be denied by a policy tried")
