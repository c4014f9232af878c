"""The webhook delivery worker: takes due deliveries from the outbox (the rows
``core.hotpath.approvals.enqueue`` writes with the events that caused them), tries each
(``api.delivery``) and records what came of it (``core.store.webhooks``).

- :func:`deliver_due` is one pass, synchronous, against a database and a clock: the tests call
  it with theirs.
- :class:`Worker` runs passes on a thread of its own, every half second, until stopped; a
  stop lets the tries under way finish and be recorded. It also runs :func:`sweep` once a
  minute: per-session counters whose window is over are removed (decisions §8); and
  :func:`fold_tallies` every second: the audit counts' tallies that decisions wrote move into
  the rollup rows (decisions §9), so that readers have few tallies to add; and, with
  ``AGENTAUTH_CHECKPOINT_FILE`` set, keeps checkpoints in that file (``api.checkpoint_file``);
  and with ``AGENTAUTH_AUDIT_RETENTION_DAYS`` set, archives and prunes older entries at start
  and every hour (``api.retention``).
- :class:`DeliveryProcess` is how ``agentauth serve`` runs it: one child process per server
  (``python -m api.outbox``), started once the metrics folder exists and stopped by its PID
  when the server stops (SIGTERM, then SIGKILL). Not a thread of the server's master, which
  forks its workers; not in the workers, of which there are several.

Nothing is lost to a crash: a delivery is leased (``core.store.webhooks.lease``) while it is
tried, and a lease left by a killed worker expires, so the next start tries it again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from api.checkpoint_file import CheckpointFile
from api.delivery import deliver, event_body
from api.metrics import WEBHOOK_DELIVERIES
from api.retention import prune_every_workspace
from core.config import Settings
from core.domain.clock import Clock, utc_now
from core.domain.errors import AgentAuthError
from core.domain.webhooks import DeliveryStatus
from core.store import partitions, signing
from core.store.auditcounts import drain
from core.store.database import Database
from core.store.limits import sweep_sessions
from core.store.webhooks import DueDelivery, TryResult, find_due, lease, record_try

#: how often the worker looks for due deliveries
POLL_SECONDS = 0.5
#: how long a try may hold its delivery: well past a try's 10 s and its DNS lookup
LEASE = timedelta(seconds=60)
#: deliveries taken per pass, and tried at once
BATCH = 32
PARALLEL = 8
#: how often the worker removes per-session counters whose window is over
SWEEP_SECONDS = 60.0
#: how often it folds the audit counts' tallies, and about how long one pass folds
FOLD_SECONDS = 1.0
FOLD_BUDGET_SECONDS = 0.5
#: how often it archives and prunes the entries past the retention (and once at start)
RETENTION_SECONDS = 3600.0
#: how often the audit log's day partitions are made ahead (PostgreSQL)
PARTITION_SECONDS = 3600.0
#: the metric's label for each recorded outcome
RESULTS = {
    DeliveryStatus.DELIVERED: "delivered",
    DeliveryStatus.PENDING: "retry",
    DeliveryStatus.FAILED: "failed",
}

log = logging.getLogger("agentauth.webhooks")


def sweep(db: Database, clock: Clock) -> int:
    """Remove the per-session counters whose window is over (decisions §8: they do not grow
    without bound); how many went. Counters of a window still running stay."""
    with db.transaction(write=True) as session:
        return sweep_sessions(session, int(clock().timestamp()))


def fold_tallies(db: Database) -> int:
    """Fold the audit tallies into the rollup rows, a paced bite a transaction (a short hold of
    SQLite's write lock each, which decisions wait for), for about FOLD_BUDGET_SECONDS: a
    backlog (a deletion's tallies, or a log written with no server running) goes over several
    passes, the checkpoints and deliveries kept in between; how many signatures."""
    return drain(db, seconds=FOLD_BUDGET_SECONDS)


def deliver_due(
    db: Database,
    clock: Clock,
    *,
    allow_private: bool,
    limit: int = BATCH,
    workspace_id: str | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> list[DeliveryStatus]:
    """One pass: lease up to ``limit`` due deliveries (only ``workspace_id``'s when given),
    try each (on ``pool`` when given, else one after the other) and record it. The statuses
    recorded, in the order of the deliveries' ids; a delivery whose lease was lost meanwhile
    is left out."""
    now = clock()
    with db.transaction() as session:
        wanted = find_due(session, now, limit, workspace_id)
    if not wanted:  # the common case takes no write lock
        return []
    with db.transaction(write=True) as session:
        taken = lease(session, wanted, now, now + LEASE)
    attempt = partial(_attempt, db, clock, allow_private)
    done: Iterable[DeliveryStatus | None] = (
        pool.map(attempt, taken) if pool is not None else map(attempt, taken)
    )
    return [status for status in done if status is not None]


def _attempt(
    db: Database, clock: Clock, allow_private: bool, due: DueDelivery
) -> DeliveryStatus | None:
    try:
        body = event_body(due.payload)
        result = deliver(due.url, due.secret, due.event_id, body, clock(), allow_private)
    except Exception as exc:  # a fault of ours: recorded and retried, the lease not left held
        log.exception(_line("try failed unexpectedly", due))
        result = TryResult(False, error=f"internal error ({type(exc).__name__})")
    with db.transaction(write=True) as session:
        status = record_try(session, due, result, clock())
    if status is None:
        log.warning(_line("lease lost: another worker took the delivery over", due))
        return None
    WEBHOOK_DELIVERIES.labels(RESULTS[status]).inc()
    if status is not DeliveryStatus.DELIVERED:
        log.warning(_line(f"try failed ({status})", due, error=result.error))
    return status


def _line(message: str, due: DueDelivery, **extra: Any) -> str:
    """A JSON log line naming the delivery, never its URL (which may hold a token)."""
    fields = {"message": message, "deliveryId": due.id, "eventId": due.event_id}
    return json.dumps({**fields, "try": due.tries + 1, **extra})


#: a chore of the maintenance process: how often (seconds), its name in logs, the call
Chore = tuple[float, str, Callable[[], object]]


class _Due:
    """Chores run when their time has come, each at once the first time."""

    def __init__(self, chores: list[Chore]) -> None:
        self._chores = chores
        self._last = [-math.inf] * len(chores)  # monotonic time each chore last ran

    def run(self) -> None:
        for index, (every, name, chore) in enumerate(self._chores):
            if time.monotonic() - self._last[index] < every:
                continue
            self._last[index] = time.monotonic()
            try:
                chore()
            except AgentAuthError as exc:  # the database is away: at the next time
                log.warning(json.dumps({"message": f"{name} failed: {exc.message}"}))
            except Exception:
                log.exception("%s failed", name)


def ensure_partitions(db: Database, clock: Clock) -> None:
    """The audit log's day partitions made ahead (PostgreSQL; nothing on SQLite)."""
    with db.transaction() as session:
        made = partitions.ensure(session, clock())
    if made:
        log.info(json.dumps({"message": "audit partitions made", "days": [d.name for d in made]}))


class Worker:
    """Delivery passes on a thread of their own until :meth:`stop`; a sweep of expired
    per-session counters every :data:`SWEEP_SECONDS` and a fold of the audit counts' tallies
    every :data:`FOLD_SECONDS` too."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        allow_private: bool,
        poll_seconds: float = POLL_SECONDS,
        counts_db: Database | None = None,
        checkpoints: CheckpointFile | None = None,
        retention: Callable[[], object] | None = None,
    ) -> None:
        """``counts_db``: the database the fold writes through (``db`` by default);
        ``checkpoints``: the file to keep checkpoints in, if any."""
        self._db, self._clock, self._allow_private = db, clock, allow_private
        self._counts_db = counts_db or db
        self._checkpoints = checkpoints
        self._retention = retention
        self._poll = poll_seconds
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="webhook-try")
        self._thread = threading.Thread(target=self._run, name="webhook-deliveries", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run_chores(self, chores: list[Chore], pause: float) -> None:
        due = _Due(chores)
        while not self._stopping.is_set():
            due.run()
            self._stopping.wait(pause)

    def stop(self) -> None:
        """Take no more deliveries; return once the tries under way are recorded."""
        self._stopping.set()
        self._thread.join()
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        chores: list[Chore] = [
            (SWEEP_SECONDS, "counter sweep", partial(sweep, self._db, self._clock)),
            (FOLD_SECONDS, "audit count fold", partial(fold_tallies, self._counts_db)),
        ]
        if self._checkpoints is not None:
            keep = partial(self._checkpoints.tick, self._db)
            chores.append((1.0, "checkpoint", lambda: keep(time.monotonic())))
        # the long chores on a thread of their own: a prune of a day's entries takes minutes,
        # in which the tallies are still folded and the checkpoints still kept
        slow: list[Chore] = [
            (
                PARTITION_SECONDS,
                "audit partitions",
                partial(ensure_partitions, self._db, self._clock),
            ),
        ]
        if self._retention is not None:
            slow.append((RETENTION_SECONDS, "audit retention", self._retention))
        slow_thread = threading.Thread(
            target=self._run_chores, args=(slow, 1.0), name="audit-retention", daemon=True
        )
        slow_thread.start()
        due = _Due(chores)
        while not self._stopping.is_set():
            due.run()
            taken = 0
            try:
                taken = len(
                    deliver_due(
                        self._db, self._clock, allow_private=self._allow_private, pool=self._pool
                    )
                )
            except AgentAuthError as exc:  # the database is away: try again at the next poll
                log.warning(json.dumps({"message": f"delivery pass failed: {exc.message}"}))
            except Exception:
                log.exception("delivery pass failed")
            if taken < BATCH:  # a full batch suggests more are due: no pause then
                self._stopping.wait(self._poll)


class DeliveryProcess:
    """The worker as a child process of this one, sharing its output; stopped with it.

    The database URL goes to the child in its environment, not its command line, where every
    user of the machine could read a password in it."""

    def __init__(self, settings: Settings) -> None:
        self._owner = os.getpid()
        environment = {
            **os.environ,
            "AGENTAUTH_DATABASE_URL": settings.database_url,
            "AGENTAUTH_WEBHOOK_ALLOW_PRIVATE": str(settings.webhook_allow_private).lower(),
        }
        sys.stdout.flush()
        # our own interpreter and module, no shell: nothing to inject
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api.outbox"], env=environment, stdin=subprocess.DEVNULL
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds. Does nothing in another process: a
        server worker forked from this one may leave through the frames it was forked from."""
        if os.getpid() != self._owner:
            return
        self.process.terminate()  # Popen signals only a child of its own, not yet reaped
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _retain(db: Database, key: Any, days: int, folder: str, archive_format: str) -> None:
    """One pass of the retention, each workspace's outcome logged."""
    done = prune_every_workspace(db, key, days, Path(folder), utc_now, archive_format)
    for name, pruned in done:
        taken = pruned.taken
        fields: dict[str, Any] = {"workspace": name, "resumed": pruned.resumed}
        if taken is not None:
            fields.update(first=taken.first, last=taken.last, archive=str(pruned.archive))
        if pruned.parquet is not None:
            fields.update(parquet=str(pruned.parquet))
        if pruned.ok:
            log.info(json.dumps({"message": "audit entries archived and pruned", **fields}))
        else:
            log.error(
                json.dumps({"message": "audit archive did not verify: nothing pruned", **fields})
            )


def main() -> None:
    """The child's life: deliver until SIGTERM or SIGINT, or until the server that started it
    is gone (killed with SIGKILL, it could not say so)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    parent = os.getppid()
    try:
        settings = Settings.from_env()
        db = Database(settings)
    except AgentAuthError as exc:
        log.error(json.dumps({"message": f"webhook deliveries cannot start: {exc.message}"}))
        sys.exit(1)
    # a fold needs no fsync of its own on SQLite: one lost to a power cut leaves its tallies
    # unfolded, an earlier state as exact as the later one, and the next decision's commit
    # syncs the log past it anyway; so the write lock it holds is not held through an fsync
    counts_db = db
    if db.is_sqlite and settings.sqlite_synchronous == "FULL":
        counts_db = Database(replace(settings, sqlite_synchronous="NORMAL"))
    key = None  # the signing key of the checkpoints and the archives, when either is kept
    if settings.checkpoint_file or settings.audit_retention_days:
        try:
            key = signing.load_or_create(settings, create=False)
        except AgentAuthError as exc:
            log.error(json.dumps({"message": f"no checkpoints nor retention: {exc.message}"}))
    checkpoints = keep_for = None
    if key is not None and settings.checkpoint_file:
        path = Path(settings.checkpoint_file)
        checkpoints = CheckpointFile(path, settings.checkpoint_interval_seconds, key)
    if key is not None and settings.audit_retention_days:
        days, folder = settings.audit_retention_days, settings.audit_archive_dir
        keep_for = partial(_retain, db, key, days, folder, settings.audit_archive_format)
    worker = Worker(
        db,
        utc_now,
        allow_private=settings.webhook_allow_private,
        counts_db=counts_db,
        checkpoints=checkpoints,
        retention=keep_for,
    )
    worker.start()
    while not stopping.wait(1.0) and os.getppid() == parent:
        pass
    worker.stop()
    db.dispose()
    counts_db.dispose()


if __name__ == "__main__":
    main()
