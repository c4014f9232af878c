"""``agentauth audit verify`` over a large log: entries per second against the database and
offline against a JSONL export (decisions §7; target: at least 200,000 entries a second at
1,000,000 entries).

The log is written the way decisions write it (rows made by ``core.store.audit.entry``, chained
by the group-commit recorder, thousands per transaction) into a fresh SQLite database; the
export is made by the service's own code (``core.store.chain``). Each verification is a fresh
``agentauth`` process, timed from start to exit, so its figure includes reading and parsing.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

TARGET = 200_000  # entries per second
BATCH = 5000
TOOLS = ("payments.refund", "email.send", "shell.exec", "crm.lookup", "files.read")


ROUNDS = 3  # each verify, interleaved: the median and the spread go in the table


@dataclass(frozen=True)
class VerifyTimes:
    entries: int
    write_seconds: float
    database_seconds: list[float]
    export_seconds: list[float]
    export_bytes: int


def _rows(count: int, workspace_id: str, agent_id: str) -> list[dict]:
    from core.store import audit

    rng = random.Random(7)
    start = datetime(2026, 11, 25, tzinfo=UTC)
    rows = []
    for n in range(count):
        tool = TOOLS[n % len(TOOLS)]
        parameters = {"order": f"ORD-{n}", "amount": rng.randrange(1, 5000), "note": "refund"}
        if n % 10 == 0:
            parameters["rate"] = rng.random()  # a float: the slow canonical path, now and then
        rows.append(
            audit.entry(
                workspace_id=workspace_id,
                agent_id=agent_id,
                agent_exists=False,
                key_id=None,
                tool_name=tool,
                parameters=parameters,
                result="allowed" if n % 4 else "denied",
                policy_id=None,
                rule_index=None,
                reason="allowed by rule 0 of policy refunds" if n % 4 else "default deny",
                latency_ms=round(rng.uniform(0.2, 4.0), 3),
                timestamp=start + timedelta(microseconds=n * 1000),
            )
        )
    return rows


def bench_verify(entries: int = 1_000_000) -> VerifyTimes:
    from core.config import Settings
    from core.domain import ids
    from core.hotpath.recorder import Recorder
    from core.store import chain
    from core.store.database import Database
    from core.store.keys import ensure_workspace
    from core.store.migrate import upgrade

    folder = Path(tempfile.mkdtemp(prefix="agentauth-verify-"))
    url = f"sqlite:///{folder / 'log.db'}"
    settings = Settings(database_url=url, audit_key_file=str(folder / "audit.key"))
    db = Database(settings)
    upgrade(db)
    with db.transaction(write=True) as session:
        workspace_id = ensure_workspace(session, "default", datetime.now(UTC))
    recorder = Recorder.for_database(db)
    started = time.perf_counter()
    for first in range(0, entries, BATCH):
        rows = _rows(min(BATCH, entries - first), workspace_id, ids.new_id())

        def write(batch, rows=rows):  # type: ignore[no-untyped-def]
            for row in rows:
                batch.append_audit(row)

        recorder.run(write)
    write_seconds = time.perf_counter() - started
    recorder.close()
    export = folder / "log.jsonl"
    with db.transaction(snapshot=True) as session, export.open("wb") as out:
        for chunk in chain.jsonl(chain.entries(session, workspace_id)):
            out.write(chunk)
    db.dispose()

    def timed(*arguments: str) -> float:
        command = [sys.executable, "-m", "controller", "audit", "verify", *arguments]
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        took = time.perf_counter() - began
        if done.returncode != 0 or f"ok: {entries} entries" not in done.stdout:
            raise RuntimeError(f"verify failed:\n{done.stdout}{done.stderr}")
        return took

    database_seconds: list[float] = []
    export_seconds: list[float] = []
    for _ in range(ROUNDS):
        database_seconds.append(timed("--db", url, "--workspace", "default"))
        export_seconds.append(timed("--export", str(export)))
    size = export.stat().st_size
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return VerifyTimes(entries, write_seconds, database_seconds, export_seconds, size)
