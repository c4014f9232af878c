"""Checkpoints kept outside the database (decisions §9): ``agentauth serve`` with
``AGENTAUTH_CHECKPOINT_FILE`` appends a signed checkpoint of each workspace whose log grew, at
most every interval and within two of the growth, that ``agentauth audit verify`` holds each
log against; ``/metrics`` says how far the newest kept checkpoint is behind each log."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from api.checkpoint_file import CheckpointFile, newest_sizes
from core.config import Settings
from core.domain.auditchain import Checkpoint, parse_note, split_notes
from core.domain.errors import ConfigError
from core.store import signing
from tests.api.helpers import decide, make_agent
from tests.audit_chain import ALLOW_CALENDAR
from tests.conftest import bearer
from tests.server import running_server

DEADLINE_SECONDS = 30


def _notes(path: Path) -> list[Checkpoint]:
    return [Checkpoint.parse(parse_note(note).text) for note in split_notes(path.read_text())]


def _lag(client, workspace_id: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    found = re.search(
        rf'^agentauth_checkpoint_lag_entries\{{workspace="{workspace_id}"\}} (\S+)$', text, re.M
    )
    assert found, text
    return float(found.group(1))


def test_a_checkpoint_of_each_grown_log_at_most_every_interval(
    app, client, admin_headers, workspace, other_workspace, settings, tmp_path
):
    path = tmp_path / "checkpoints"
    db = app.extensions["agentauth"].db
    kept = CheckpointFile(path, 60, signing.load_or_create(settings))
    ours = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    theirs = make_agent(client, other_workspace.headers("admin"), "b", ALLOW_CALENDAR)
    for _ in range(3):
        decide(client, admin_headers, ours, "calendar.read")
    decide(client, other_workspace.headers("admin"), theirs, "calendar.read")
    # the first tick writes every log it has not seen (this run's database holds others too)
    assert kept.tick(db, now=1000.0) >= 2
    mine = {f"agentauth/{workspace.id}", f"agentauth/{other_workspace.id}"}
    assert sorted((c.origin, c.size) for c in _notes(path) if c.origin in mine) == sorted(
        [(f"agentauth/{workspace.id}", 3), (f"agentauth/{other_workspace.id}", 1)]
    )
    assert _lag(client, workspace.id) == 0
    decide(client, admin_headers, ours, "calendar.read")
    decide(client, admin_headers, ours, "email.send")
    assert kept.tick(db, now=1059.0) == 0  # grown, but the interval has not passed
    assert _lag(client, workspace.id) == 2
    assert kept.tick(db, now=1060.0) == 1  # only the log that grew
    assert [(c.origin, c.size) for c in _notes(path)][-1] == (f"agentauth/{workspace.id}", 5)
    assert _lag(client, workspace.id) == 0
    assert kept.tick(db, now=2000.0) == 0  # nothing grew: nothing written
    # a restarted server reads what the file holds: no checkpoint written twice
    again = CheckpointFile(path, 60, signing.load_or_create(settings))
    assert again.tick(db, now=0.0) == 0
    assert {o: n for o, n in newest_sizes(path).items() if o in mine} == {
        f"agentauth/{workspace.id}": 5,
        f"agentauth/{other_workspace.id}": 1,
    }


def test_the_file_serve_keeps_verifies_each_log(database_url, workspace, tmp_path, cli):
    """The real thing: agentauth serve with the file set, decisions over HTTP, the file grows
    within two intervals of them, and verify holds the log against it."""
    path = tmp_path / "kept" / "checkpoints"
    path.parent.mkdir()
    env = {"AGENTAUTH_CHECKPOINT_FILE": str(path), "AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS": "1"}
    headers = bearer(workspace.key("admin"))
    with running_server(database_url, workers=1, env=env) as base, httpx.Client() as http:
        agent = http.post(f"{base}/v1/agents", json={"name": "kept"}, headers=headers).json()
        body = {"agent_id": agent["id"], "tool_name": "calendar.read", "parameters": {}}
        for _ in range(4):
            assert http.post(f"{base}/v1/authorize", json=body, headers=headers).status_code == 200
        size = int(http.get(f"{base}/v1/audit-logs/checkpoint", headers=headers).text.split()[1])
        deadline = time.monotonic() + DEADLINE_SECONDS
        origin = f"agentauth/{workspace.id}"
        while newest_sizes(path).get(origin, 0) < size:
            assert time.monotonic() < deadline, "no checkpoint of the log within the deadline"
            time.sleep(0.05)  # polling the file, bounded by the deadline
        lag = http.get(f"{base}/metrics").text
        assert f'agentauth_checkpoint_lag_entries{{workspace="{workspace.id}"}}' in lag
    result = cli("audit", "verify", "--workspace", workspace.name, "--checkpoint", str(path))
    assert result.exit_code == 0, result.output
    assert f"{size} entries" in result.output


@pytest.mark.parametrize("value", ["0", "86401", "soon"])
def test_a_bad_interval_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigError, match="AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS"):
        Settings.from_env({"AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS": value})
