"""The audit log at scale (decisions §9): a log of N entries (50 agents calling 12 of 200
tools each, 30 days, a fifth of the calls in sessions of 10) written the way decisions write
it, then ``agentauth serve`` in front of it and the reads an operator makes, each timed over
HTTP.

The log is written through the group-commit recorder (rows made by ``core.store.audit.entry``,
chained, tallied), thousands per transaction, and the tallies folded as ``agentauth serve``'s
maintenance process folds them (in larger bites); on PostgreSQL into a fresh schema, dropped
at the end. Every read is asked ``REPEAT`` times; the table has the median and the p95
(nearest rank) in milliseconds, and each total is checked against a ``COUNT(*)`` of the
entries made here.

``python -m bench.audit_scale --entries 1000000 [--database-url postgresql://...]``

``--keep DIR`` keeps the log (its SQLite file or schema, its key and what the reads need to
know, all named in DIR) instead of dropping it, and a later run with the same DIR times the
reads on it again without writing it: a log of tens of millions takes most of an hour to write.
Remove DIR (and, on PostgreSQL, the schema named in ``DIR/log.json``) when done.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.http_compare import create_admin_key, free_port, http, running, server_env

AGENTS, TOOLS, DAYS = 50, 200, 30
TOOLS_PER_AGENT = 12
BATCH = 5000
BULK_BITE = 50_000
REPEAT = 20
RESULTS = (("allowed", 70), ("denied", 28), ("escalated", 2))


@dataclass(frozen=True)
class Timing:
    name: str
    median_ms: float
    p95_ms: float
    detail: str = ""


def _weighted(rng: random.Random) -> str:
    pick = rng.randrange(100)
    for result, weight in RESULTS:
        if pick < weight:
            return result
        pick -= weight
    return RESULTS[-1][0]


def build_log(
    url: str, entries: int, folder: Path, days: int = DAYS, end: datetime | None = None
) -> dict[str, Any]:
    """The log, ``days`` long up to ``end`` (now by default), written and folded; what the
    reads need to know of it."""
    from core.config import Settings
    from core.hotpath.recorder import Recorder
    from core.store import audit, partitions
    from core.store.auditcounts import drain
    from core.store.database import Database
    from core.store.keys import ensure_workspace
    from core.store.migrate import upgrade
    from core.store.models import Agent

    settings = Settings(database_url=url, audit_key_file=str(folder / "audit.key"))
    db = Database(settings)
    upgrade(db)
    now = datetime.now(UTC).replace(microsecond=0)
    start = (end or now) - timedelta(days=days)
    step = timedelta(days=days) / entries
    with db.transaction(write=True) as session:
        # the day partitions (PostgreSQL) the service would have made over the month
        partitions.create(
            session, [partitions.day_of((start + timedelta(days=n)).date()) for n in range(days)]
        )
        workspace_id = ensure_workspace(session, "default", now)
        agents = [f"00000000-0000-4000-8000-{n:012d}" for n in range(AGENTS)]
        for n, agent_id in enumerate(agents):
            session.add(
                Agent(
                    id=agent_id, workspace_id=workspace_id, name=f"agent-{n}", status="active",
                    created_at=start, updated_at=start, policy_version=0,
                )
            )  # fmt: skip
    tools = [f"tool.{n}" for n in range(TOOLS)]
    rng = random.Random(7)
    # each agent calls a few tools of its own and a few shared ones (a support agent, a billing
    # agent, ...): every tool is called by some agent
    own = {
        agent: [tools[(n * 4 + k) % TOOLS] for k in range(TOOLS_PER_AGENT)]
        for n, agent in enumerate(agents)
    }
    recorder = Recorder.for_database(db)
    began = time.perf_counter()
    for first in range(0, entries, BATCH):
        rows = []
        for n in range(first, min(first + BATCH, entries)):
            agent_id = agents[rng.randrange(AGENTS)]
            rows.append(
                audit.entry(
                    workspace_id=workspace_id,
                    agent_id=agent_id,
                    agent_exists=True,
                    key_id=None,
                    tool_name=rng.choice(own[agent_id]),
                    parameters={"n": n, "amount": rng.randrange(1, 5000)},
                    result=_weighted(rng),
                    policy_id=None,
                    rule_index=None,
                    reason="bench",
                    latency_ms=0.5,
                    timestamp=start + step * n,
                    session_id=f"session-{n // 50}" if n % 5 == 0 else None,
                )
            )

        def write(batch: Any, rows: list[dict[str, Any]] = rows) -> None:
            for row in rows:
                batch.append_audit(row)

        recorder.run(write)
    recorder.close()
    written = time.perf_counter() - began
    began = time.perf_counter()
    # in bites of BULK_BITE distinct signatures rather than the service's 250: no decision
    # waits for the write lock here, and a commit's cost is its pages, shared by a larger bite
    drain(db, BULK_BITE, paced=False)
    folded = time.perf_counter() - began
    if not db.is_sqlite:
        # PostgreSQL's planner statistics, as autovacuum keeps them on a database that grew
        # over days (a bulk load read at once has none yet); SQLite has none unless told, and
        # the service never tells it
        with db.engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE")
            connection.commit()
            # and the load's dirty pages written now, not by the next timed checkpoint in the
            # middle of a measurement (it stalled commits for 100-400 ms in the runs after a
            # load of a million entries)
            connection.exec_driver_sql("CHECKPOINT")
            connection.commit()
    db.dispose()
    return {
        "workspace_id": workspace_id,
        "agents": agents,
        "tools": tools,
        "now": now,
        "start": start,
        "entries": entries,
        "write_seconds": written,
        "fold_seconds": folded,
    }


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    value = call()
    return (time.perf_counter() - began) * 1000, value


def _summary(name: str, times: list[float], detail: str = "") -> Timing:
    ordered = sorted(times)
    p95 = ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]
    return Timing(name, statistics.median(ordered), p95, detail)


def time_reads(
    base: str, key: str, log: dict[str, Any], count: Callable[[dict[str, Any]], int]
) -> list[Timing]:
    """Each read REPEAT times; a list page's total checked against ``count(filters)``."""
    agent, tool = log["agents"][3], log["tools"][17]  # agent 3 calls tools 12 to 23
    hour = (log["now"] - timedelta(days=10)).replace(minute=0, second=0)
    iso = lambda moment: moment.isoformat().replace("+00:00", "Z")  # noqa: E731
    odd_from = iso(log["now"] - timedelta(days=12, seconds=17, microseconds=123))
    odd_to = iso(log["now"] - timedelta(days=3, seconds=41, microseconds=7))
    half = log["entries"] // 2
    month = {"from": iso(log["start"]), "to": iso(log["now"])}
    odd = {"from": odd_from, "to": odd_to}
    pages: list[tuple[str, dict[str, Any]]] = [
        ("first page, no filter", {}),
        ("first page, tool_name", {"tool_name": tool}),
        ("first page, result=denied", {"result": "denied"}),
        ("first page, an action with no entries", {"action": "never.happened"}),
        ("offset at half the log", {"offset": half}),
        ("first page, one agent", {"agent_id": agent}),
        ("first page, one hour", {"from": iso(hour), "to": iso(hour + timedelta(hours=1))}),
        ("first page, one session", {"session_id": "session-1234"}),
        ("agent + result", {"agent_id": agent, "result": "denied"}),
        ("tool + result", {"tool_name": tool, "result": "escalated"}),
        ("agent + tool", {"agent_id": agent, "tool_name": tool}),
        ("agent + tool + from/to", {"agent_id": agent, "tool_name": tool, **odd}),
        ("from/to inside minutes, 9 days", odd),
        ("offset at half, result=denied", {"result": "denied", "offset": half // 4}),
    ]  # fmt: skip
    found: list[Timing] = []
    for name, query in pages:
        url = f"{base}/v1/audit-logs?" + urllib.parse.urlencode({"limit": 50, **query})
        times, body = [], None
        try:
            for _ in range(REPEAT):
                took, (status, body) = _timed(lambda url=url: http("GET", url, key=key))
                if status != 200:
                    raise RuntimeError(f"{status} {body}")
                times.append(took)
        except (OSError, RuntimeError) as exc:  # said in the table, the other reads still run
            print(f"{name}: FAILED: {exc!r}", file=sys.stderr, flush=True)
            found.append(Timing(name, float("nan"), float("nan"), f"FAILED: {exc!r}"))
            continue
        assert body is not None
        filters = {k: v for k, v in query.items() if k != "offset"}
        expected = count(filters)
        total = body["pagination"]["total"]
        if total != expected:
            raise RuntimeError(f"{name}: total {total}, COUNT(*) {expected}")
        served = body["pagination"]["count"]
        found.append(_summary(name, times, f"total {total:,}, {served} served"))
    # a cursor walk, 30 pages deep, from the first page and from half the log
    walks = (("cursor pages, from the first", {}), ("cursor pages, from half", {"offset": half}))
    for name, start in walks:
        url = f"{base}/v1/audit-logs?" + urllib.parse.urlencode({"limit": 50, **start})
        status, body = http("GET", url, key=key)
        times = []
        for _ in range(30):
            following = body["pagination"]["nextCursor"]
            if following is None:  # a log too small for 30 pages
                break
            query = urllib.parse.urlencode({"limit": 50, "cursor": following})
            url = f"{base}/v1/audit-logs?{query}"
            took, (status, body) = _timed(lambda url=url: http("GET", url, key=key))
            if status != 200 or body["pagination"]["count"] != 50:
                raise RuntimeError(f"{name}: {status} {body}")
            times.append(took)
        found.append(_summary(name, times, f"{len(times)} pages of 50"))
    stats: list[tuple[str, dict[str, Any]]] = [
        ("stats, 30 days by hour", {**month, "bucket": "hour"}),
        ("stats, 30 days by hour by result", {**month, "bucket": "hour", "group_by": "result"}),
        ("stats, 30 days by day by tool", {**month, "bucket": "day", "group_by": "tool"}),
        ("stats, 24 h by minute", {"bucket": "minute"}),
        ("stats, one agent 30 days by hour", {"agent_id": agent, **month}),
    ]  # fmt: skip
    for name, query in stats:
        url = f"{base}/v1/audit-logs/stats?" + urllib.parse.urlencode(query)
        times = []
        for _ in range(REPEAT):
            took, (status, body) = _timed(lambda url=url: http("GET", url, key=key))
            if status != 200:
                raise RuntimeError(f"{name}: {status} {body}")
            times.append(took)
        counted = sum(item["count"] for item in body["data"])
        found.append(_summary(name, times, f"{len(body['data']):,} items, {counted:,} entries"))
    return found


@contextlib.contextmanager
def database(url: str | None, keep: Path | None = None) -> Iterator[tuple[str, Path]]:
    """A fresh SQLite file, or a fresh schema of the PostgreSQL at ``url`` (dropped after);
    with ``keep``, the one named there (made there if new) and kept."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        known = keep / "url"
        if not known.exists():
            if url is None:
                known.write_text(f"sqlite:///{keep.resolve() / 'log.db'}")
            else:
                known.write_text(_new_schema(url))
        yield known.read_text(), keep
        return
    folder = Path(tempfile.mkdtemp(prefix="agentauth-scale-"))
    try:
        if url is None:
            yield f"sqlite:///{folder / 'log.db'}", folder
        else:
            schema_url = _new_schema(url)
            try:
                yield schema_url, folder
            finally:
                _drop_schema(url, schema_url)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # a log of millions: gigabytes


def _new_schema(url: str) -> str:
    """A new schema of the PostgreSQL at ``url``; the URL that works in it."""
    import psycopg

    schema = f"bench_scale_{int(time.time())}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    return f"{url}?options=-csearch_path%3D{schema}"


def _drop_schema(url: str, schema_url: str) -> None:
    import psycopg

    schema = schema_url.rsplit("%3D", 1)[1]
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA {schema} CASCADE")


def _counter(url: str, workspace_id: str) -> Callable[[dict[str, Any]], int]:
    """``COUNT(*)`` of the entries matching a list's query, straight from the table."""
    from sqlalchemy import func, select

    from core.config import Settings
    from core.domain.clock import parse_instant
    from core.store.audit import Filters, clauses
    from core.store.database import Database
    from core.store.models import AuditEntry

    db = Database(Settings(database_url=url))

    def count(query: dict[str, Any]) -> int:
        filters = Filters(
            agent_id=query.get("agent_id"),
            session_id=query.get("session_id"),
            action=query.get("action"),
            tool_name=query.get("tool_name"),
            result=query.get("result"),
            since=parse_instant(query["from"]) if "from" in query else None,
            until=parse_instant(query["to"]) if "to" in query else None,
        )
        with db.transaction() as session:
            where = [AuditEntry.workspace_id == workspace_id, AuditEntry.erased.is_(False)]
            return int(session.scalar(select(func.count()).where(*where, *clauses(filters))) or 0)

    return count


@contextlib.contextmanager
def serving(url: str, folder: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``agentauth serve`` on the log at ``url`` (its key file in ``folder``), stopped at the
    end: its base URL, an admin key, and the environment it runs in."""
    env = server_env()
    env["AGENTAUTH_AUDIT_KEY_FILE"] = str(folder / "audit.key")
    key = create_admin_key(url, env)
    base = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1"]
    command += ["--port", base.rsplit(":", 1)[1], "--db", url]
    ready = lambda: http("GET", base + "/healthz")[0] == 200  # noqa: E731
    with running(command, env, folder / "serve.log", ready):
        yield base, key, env


def bench_scale(
    entries: int, database_url: str | None, keep: Path | None = None
) -> tuple[dict[str, Any], list[Timing]]:
    """The log written (or, kept from an earlier run, found), ``agentauth serve`` in front of
    it, the reads timed."""
    with database(database_url, keep) as (url, folder):
        known = folder / "log.json"
        if known.exists():
            log = json.loads(known.read_text())
            for moment in ("now", "start"):
                log[moment] = datetime.fromisoformat(log[moment])
        else:
            log = build_log(url, entries, folder)
            if keep is not None:
                known.write_text(json.dumps(log, default=datetime.isoformat))
        with serving(url, folder) as (base, key, env):
            spilled = _temp_files(url)
            timings = time_reads(base, key, log, _counter(url, log["workspace_id"]))
            time.sleep(1.5)  # PostgreSQL's statistics are flushed within a second
            after = _temp_files(url)
        if spilled is not None and after is not None:
            log["temp_files"] = (after[0] - spilled[0], after[1] - spilled[1])
        timings.append(time_verify(url, env))
        if url.startswith("sqlite:///"):
            log["bytes"] = Path(url.removeprefix("sqlite:///")).stat().st_size
    return log, timings


def _temp_files(url: str) -> tuple[int, int] | None:
    """PostgreSQL's count of temporary files (and their bytes) its queries have written to
    this database so far; None on SQLite."""
    if not url.startswith("postgresql"):
        return None
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            row = connection.exec_driver_sql(
                "SELECT temp_files, temp_bytes FROM pg_stat_database"
                " WHERE datname = current_database()"
            ).one()
        return int(row[0]), int(row[1])
    finally:
        engine.dispose()


def time_verify(url: str, env: dict[str, str]) -> Timing:
    """``agentauth audit verify --db`` of the whole log, as a process of its own, once."""
    command = [sys.executable, "-m", "controller", "audit", "verify", "--db", url]
    command += ["--workspace", "default"]
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    took = (time.perf_counter() - began) * 1000
    said = [line for line in done.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    detail = said[0] if said else done.stderr[-200:]
    return Timing("audit verify --db (once)", took, took, f"exit {done.returncode}: {detail}")


def report(log: dict[str, Any], timings: list[Timing], store: str) -> None:
    """The table, in Markdown."""
    size = f", {log['bytes'] / log['entries']:,.0f} bytes an entry" if "bytes" in log else ""
    if "temp_files" in log:
        files, spilled = log["temp_files"]
        size += f"; temporary files written by all the reads: {files} ({spilled:,} bytes)"
    print(
        f"{log['entries']:,} entries on {store}: written in {log['write_seconds']:.0f} s, "
        f"tallies folded in {log['fold_seconds']:.1f} s{size}.\n"
    )
    print("| read | median ms | p95 ms | |")
    print("|---|---|---|---|")
    for t in timings:
        print(f"| {t.name} | {t.median_ms:.1f} | {t.p95_ms:.1f} | {t.detail} |")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR")
    args = parser.parse_args(argv)
    log, timings = bench_scale(args.entries, args.database_url, args.keep)
    report(log, timings, "PostgreSQL" if args.database_url else "SQLite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
