"""What the audit chain costs one decision, in process: ``python -m bench.chain_cost [--unchained]
[N]`` makes a fresh SQLite database, an agent with the HTTP bench's policy, and decides N calls
(default 3,000) through the app, one after another, as a client would (the Flask test client:
no network, so the figure is the service's own work). ``--unchained`` first takes the chain's
work out as bench/unchained_app.py does. Run both in turn under ``farm-bench --vs`` (see
bench/RESULTS.md): the ratio of their CPU is the chain's cost, without the HTTP benchmark's
noise.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path


def main() -> None:
    arguments = sys.argv[1:]
    if "--unchained" in arguments:
        from bench.unchained_app import _unchained

        _unchained()
        arguments.remove("--unchained")
    count = int(arguments[0]) if arguments else 3000

    from api import create_app
    from bench.http_compare import BENCH_POLICY_RULES, PARAMETERS, TOOL
    from core.config import Settings
    from core.store.keys import Scope, ensure_workspace, issue_key
    from core.store.migrate import open_database

    folder = Path(tempfile.mkdtemp(prefix="agentauth-chain-cost-"))
    settings = Settings(
        database_url=f"sqlite:///{folder / 'cost.db'}",
        rate_limit_per_minute=10**9,
        audit_key_file=str(folder / "audit.key"),
    )
    database = open_database(settings, write=True)
    with database.transaction(write=True) as session:
        workspace = ensure_workspace(session, "default", datetime.now(UTC))
        _, key = issue_key(
            session, workspace, "bench", [Scope.ADMIN.value], None, datetime.now(UTC)
        )
    database.dispose()
    client = create_app(settings).test_client()
    headers = {"Authorization": f"Bearer {key}"}
    agent = client.post("/v1/agents", json={"name": "bench"}, headers=headers).json
    policy = {"agent_id": agent["id"], "name": "bench", "rules": BENCH_POLICY_RULES}
    assert client.post("/v1/policies", json=policy, headers=headers).status_code == 201
    body = {"agent_id": agent["id"], "tool_name": TOOL, "parameters": PARAMETERS}
    for _ in range(count):
        answer = client.post("/v1/authorize", json=body, headers=headers)
        if answer.status_code != 200 or answer.json["allowed"] is not True:
            raise RuntimeError(f"unexpected answer {answer.status_code} {answer.json}")


if __name__ == "__main__":
    main()
