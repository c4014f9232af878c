"""The audit log's time partitions on PostgreSQL (decisions §9): ``audit_log`` is partitioned
by range of ``timestamp``, one partition a UTC day (``audit_log_dYYYYMMDD``), with a default
partition that takes any entry no day partition holds (so a decision is never refused for want
of a partition). The service creates the days ahead (:func:`ensure`, from migration 0007 and
every hour from ``agentauth serve``'s maintenance process), and a prune drops a whole day
(:func:`droppable`, :func:`drop`) once every entry in it is at or before its workspace's pruned
head, instead of deleting its rows one by one. SQLite has no partitions: these are no-ops there.

A day's partition is dropped only when no workspace keeps an entry in it; the counts of its
entries are taken back by deleting the rollup rows of its day (a partition's day is whole
hours and minutes, and every entry of that day of its workspaces is in it), after the tallies
not yet folded were checked to hold none of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from core.domain.auditcounts import epoch_seconds
from core.store.auditcounts import forget, settled
from core.store.models import AuditHead

log = logging.getLogger(__name__)

#: days of partitions kept ready beyond today
AHEAD_DAYS = 7
PREFIX = "audit_log_d"
DEFAULT = "audit_log_default"
#: how long a partition's drop or creation waits for the table's lock: it would hold up every
#: decision meanwhile, so it gives up (and is tried again later) rather than wait longer
LOCK_TIMEOUT_MS = 50


#: whether the default partition holds an entry of a day
_STRAY = text(
    f'SELECT 1 FROM "{DEFAULT}" WHERE "timestamp" >= :start AND "timestamp" < :end LIMIT 1'  # noqa: S608
)


@dataclass(frozen=True)
class Day:
    """One partition: the entries of ``[start, end)`` (naive UTC, as the column holds them)."""

    name: str
    start: datetime
    end: datetime


def day_of(moment: date) -> Day:
    start = datetime(moment.year, moment.month, moment.day)
    return Day(f"{PREFIX}{moment:%Y%m%d}", start, start + timedelta(days=1))


def is_partitioned(session: Session | Connection) -> bool:
    """Whether ``audit_log`` is partitioned here (PostgreSQL after migration 0007)."""
    bind = session.get_bind() if isinstance(session, Session) else session
    if bind.dialect.name != "postgresql":
        return False
    found = session.execute(
        text(
            "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
            " WHERE c.oid = to_regclass('audit_log')"
        )
    ).first()
    return found is not None


def days(session: Session | Connection) -> list[Day]:
    """The day partitions there are, oldest first (none where the log is not partitioned)."""
    if not is_partitioned(session):
        return []
    names = session.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass('audit_log') AND c.relname ~ :pattern"
            " ORDER BY c.relname"
        ),
        {"pattern": f"^{PREFIX}[0-9]{{8}}$"},
    ).scalars()
    return [day_of(datetime.strptime(name[len(PREFIX) :], "%Y%m%d").date()) for name in names]


def create(connection: Session | Connection, wanted: Iterable[Day]) -> list[Day]:
    """Create the partitions of ``wanted`` that do not exist, each in a savepoint; a day whose
    entries are in the default partition already is left there (creating it would mean moving
    them); the days created (none where the log is not partitioned)."""
    if not is_partitioned(connection):
        return []
    have = {day.name for day in days(connection)}
    made: list[Day] = []
    for day in wanted:
        if day.name in have:
            continue
        stray = connection.execute(_STRAY, {"start": day.start, "end": day.end}).first()
        if stray is not None:
            log.warning("audit entries of %s are in %s: no partition made for that day",
                        day.start.date(), DEFAULT)  # fmt: skip
            continue
        nested = connection.begin_nested()
        try:
            connection.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
            connection.execute(
                text(
                    f'CREATE TABLE "{day.name}" PARTITION OF audit_log'
                    f" FOR VALUES FROM ('{day.start.isoformat()}') TO ('{day.end.isoformat()}')"
                )
            )
            connection.execute(text("SET LOCAL lock_timeout TO DEFAULT"))
            nested.commit()
            made.append(day)
        except OperationalError as exc:  # the lock not had in time: the next run makes it
            nested.rollback()
            log.warning("audit partition %s not made now: %s", day.name, exc.orig)
    return made


def ensure(session: Session, now: datetime, ahead: int = AHEAD_DAYS) -> list[Day]:
    """Partitions from today to ``ahead`` days after (UTC), where the log is partitioned."""
    today = now.astimezone(UTC).date() if now.tzinfo else now.date()
    return create(session, [day_of(today + timedelta(days=n)) for n in range(ahead + 1)])


def droppable(session: Session, before: datetime) -> list[Day]:
    """The day partitions ending at or before ``before`` in which no workspace keeps an entry
    (each at or before its pruned head), oldest first; stops at the first that is not."""
    if before.tzinfo is not None:
        before = before.astimezone(UTC).replace(tzinfo=None)  # as the days' bounds are
    found: list[Day] = []
    heads = session.execute(select(AuditHead.workspace_id, AuditHead.pruned_seq)).all()
    for day in days(session):
        if day.end > before:
            break
        if any(_keeps(session, day, workspace_id, pruned) for workspace_id, pruned in heads):
            break
        found.append(day)
    return found


def _keeps(session: Session, day: Day, workspace_id: str, pruned: int) -> bool:
    kept = session.execute(
        text(f'SELECT 1 FROM "{day.name}" WHERE workspace_id = :w AND seq > :s LIMIT 1'),  # noqa: S608 (a date's)
        {"w": workspace_id, "s": pruned},
    ).first()
    return kept is not None


def drop(session: Session, day: Day) -> dict[str, int] | None:
    """Drop ``day``'s partition and take its entries' counts back, in ``session``'s
    transaction; how many entries of each workspace it held. None (nothing changed) when a
    tally not folded yet still counts an entry of the day (``auditcounts.drain`` first), or
    the table's lock was not had within :data:`LOCK_TIMEOUT_MS`."""
    start = epoch_seconds(day.start.replace(tzinfo=UTC))
    end = epoch_seconds(day.end.replace(tzinfo=UTC))
    heads = session.scalars(select(AuditHead.workspace_id)).all()
    if not all(settled(session, workspace_id, start, end) for workspace_id in heads):
        return None
    counted = session.execute(
        text(f'SELECT workspace_id, count(*) FROM "{day.name}" GROUP BY workspace_id')  # noqa: S608 (a date's)
    )
    held = {str(workspace_id): int(n) for workspace_id, n in counted}
    nested = session.begin_nested()
    try:
        # the day's rollup rows first (a day of a million entries has about as many): the
        # DROP takes the log's lock, which decisions wait for until this transaction commits
        # (forgotten after it, they held authorize up for 400 ms)
        for workspace_id in heads:
            forget(session, workspace_id, start, end)
        session.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
        session.execute(text(f'DROP TABLE "{day.name}"'))
        session.execute(text("SET LOCAL lock_timeout TO DEFAULT"))
    except OperationalError as exc:
        nested.rollback()  # the rollup rows too: the day keeps its entries and its counts
        log.warning("audit partition %s not dropped now: %s", day.name, exc.orig)
        return None
    nested.commit()
    return held
