"""The group-commit recorder on its own: callers whose jobs share a batch each get their answer,
whatever another job of the batch does. Batches are formed on purpose: the first caller's job
holds its batch open until the others have queued behind it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from core.config import Settings
from core.domain.errors import StorageError
from core.hotpath.reads import Reads
from core.hotpath.recorder import RECENT_BATCHES, Batch, Recorder
from core.hotpath.sql import Compiled
from core.store.database import Database

DEADLINE = 30  # seconds: a hang guard, never a measure of speed


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(Settings(database_url=database_url))
    yield database
    database.dispose()


@pytest.fixture
def recorder(db: Database) -> Iterator[Recorder]:
    made = Recorder.for_database(db)
    yield made
    made.close()


class _Queue(list[Any]):
    """The recorder's queue of waiting callers, announcing each one that joins it, so that the
    test waits for that instead of polling."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = threading.Condition()

    def append(self, entry: Any) -> None:
        super().append(entry)
        with self.joined:
            self.joined.notify_all()

    def wait_for(self, count: int) -> None:
        with self.joined:
            queued = self.joined.wait_for(lambda: len(self) >= count, DEADLINE)
        assert queued, f"{count} callers never queued"


def _batch_after_a_held_one(
    recorder: Recorder, jobs: dict[str, Callable[[Batch], Any]]
) -> dict[str, tuple[str, Any]]:
    """The first batch holds only the leader's job; ``jobs`` queue behind it, in order, and so
    make up the next batch together. What each caller got: ("ok", value) or ("raised", type)."""
    results: dict[str, tuple[str, Any]] = {}
    entered, release = threading.Event(), threading.Event()
    assert not recorder._pending
    queue = recorder._pending = _Queue()

    def holding(_batch: Batch) -> str:
        entered.set()
        release.wait(DEADLINE)
        return "held"

    def call(name: str, job: Callable[[Batch], Any]) -> None:
        try:
            results[name] = ("ok", recorder.run(job))
        except BaseException as exc:  # what the caller saw is the point, SystemExit included
            results[name] = ("raised", type(exc).__name__)

    threads = [threading.Thread(target=call, args=("leader", holding), daemon=True)]
    threads[0].start()
    assert entered.wait(DEADLINE)
    for count, (name, job) in enumerate(jobs.items(), start=1):
        threads.append(threading.Thread(target=call, args=(name, job), daemon=True))
        threads[-1].start()
        queue.wait_for(count)
    release.set()
    for thread in threads:
        thread.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), f"callers still waiting: {results}"
    return results


def test_a_job_that_raises_systemexit_leaves_nobody_of_its_batch_waiting(db, recorder):
    def dies(_batch: Batch) -> None:
        raise SystemExit("the job's thread is told to stop")

    results = _batch_after_a_held_one(recorder, {"dies": dies, "other": lambda _b: "fine"})
    assert results == {
        "leader": ("ok", "held"),
        "dies": ("raised", "StorageError"),  # its batch failed: nothing of it was committed
        "other": ("raised", "StorageError"),  # told, never acknowledged, never left waiting
    }
    assert recorder.run(lambda _b: "after") == "after"  # and the recorder's thread goes on


def test_a_job_failing_after_a_write_fails_alone_and_its_batch_commits(db, recorder):
    def counts(name: str) -> Callable[[Batch], Any]:
        return lambda batch: batch.consume(name, 0, 10).held

    def writes_then_fails(batch: Batch) -> None:
        batch.consume("recorder-test:failing", 0, 10)
        raise ValueError("after a write")

    results = _batch_after_a_held_one(
        recorder,
        {"a": counts("recorder-test:a"), "bad": writes_then_fails, "b": counts("recorder-test:a")},
    )
    assert results == {
        "leader": ("ok", "held"),
        "a": ("ok", 1),
        "bad": ("raised", "ValueError"),
        "b": ("ok", 2),  # the batch ran again job by job: the counts are exact
    }
    # the failing job's write was undone: its counter starts from nothing
    assert recorder.run(lambda batch: batch.consume("recorder-test:failing", 0, 10)) == (1, 0)


def test_a_database_error_of_one_job_is_a_storage_error(db, recorder):
    def bad_sql(batch: Batch) -> None:
        batch.consume("recorder-test:c", 0, 10)
        batch._cursor.execute("SELECT no_such_column FROM audit_log")

    results = _batch_after_a_held_one(recorder, {"bad": bad_sql, "ok": lambda _b: "fine"})
    assert results["bad"] == ("raised", StorageError.__name__)
    assert results["ok"] == ("ok", "fine")


def test_a_batch_is_acknowledged_only_when_it_was_committed(db, recorder):
    """A job that swallows a failed statement: on PostgreSQL the transaction is then void and a
    COMMIT would silently roll it back, so the batch must fail; on SQLite a failed read leaves
    the transaction whole. Either way: acknowledged exactly when its write was committed."""

    def swallows_a_failure(batch: Batch) -> str:
        batch.consume("recorder-test:swallowed", 0, 10)
        try:
            batch._cursor.execute("SELECT no_such_column FROM audit_log")
        except Exception:  # what a careless job might do
            return "acknowledged"
        raise AssertionError("the statement was expected to fail")

    try:
        told = recorder.run(swallows_a_failure)
    except StorageError:
        told = "failed"
    committed = recorder.run(lambda b: b.consume("recorder-test:swallowed", 0, 10)) == (2, 0)
    assert (told == "acknowledged") == committed
    assert told == ("failed" if not db.is_sqlite else "acknowledged")


def test_a_read_phase_runs_before_its_job_and_a_failing_one_fails_alone(db, recorder):
    def read(name: str) -> Callable[[Reads], Callable[[Batch], Any]]:
        def phase(reads: Reads) -> Callable[[Batch], Any]:
            assert reads.agent("no-such-agent", "no-such-workspace") is None  # it reads
            return lambda batch: batch.consume(name, 0, 10).held

        return phase

    def refuses(_reads: Reads) -> Callable[[Batch], Any]:
        raise ValueError("refused while reading")

    assert recorder.run(read=read("recorder-test:read")) == 1
    with pytest.raises(ValueError, match="refused while reading"):
        recorder.run(read=refuses)
    assert recorder.run(read=read("recorder-test:read")) == 2


def test_coroutines_and_threads_share_batches_and_each_gets_its_own_result(db, recorder):
    async def many() -> list[Any]:
        calls = [
            recorder.arun(lambda batch, n=n: (n, batch.consume("recorder-test:async", 0, 100)))
            for n in range(20)
        ]
        return await asyncio.gather(*calls)

    with ThreadPoolExecutor(4) as pool:
        threaded = [
            pool.submit(recorder.run, lambda b: b.consume("recorder-test:async", 0, 100))
            for _ in range(10)
        ]
        answers = asyncio.run(many())
        counts = [future.result().held for future in threaded]
    assert [n for n, _ in answers] == list(range(20))
    # every call counted once: the 30 counts are 1..30, whatever the batches were
    assert sorted(counts + [counted.held for _, counted in answers]) == list(range(1, 31))


class _Counting:
    """A driver connection that counts the statements sent through it."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.statements = 0

    def cursor(self) -> Any:
        cursor = self.connection.cursor()
        outer = self

        class Cursor:
            def execute(self, *args: Any) -> Any:
                outer.statements += 1
                return cursor.execute(*args)

            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

        return Cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


def test_a_batchs_reads_read_each_key_and_agent_once_and_a_requests_reads_every_time(db):
    raw = db.engine.raw_connection()
    try:
        counted = _Counting(raw)
        batch = Reads.for_batch(db.engine, lambda: counted)
        for _ in range(3):
            assert batch.api_key("0" * 64) is None
            assert batch.agent("agent", "workspace") is None
        assert counted.statements == 2
        batch.api_key("1" * 64)
        assert counted.statements == 3
    finally:
        raw.close()
    each = Reads(db.engine)
    try:
        sent = _Counting(db.engine.raw_connection())
        each._connection = sent  # the request's own, as the pool would have handed it over
        for _ in range(3):
            each.api_key("0" * 64)
        assert sent.statements == 3  # a key revoked between two of them is seen
    finally:
        each.close()


def test_a_failing_read_fails_alone_and_the_others_of_its_batch_are_read(db, recorder):
    """On PostgreSQL a failed statement voids the transaction the reads run in: it is rolled
    back at once, so the next reads of the batch still work."""
    recorder.run(lambda _b: None)  # the connection is kept from here: the next batch reuses it
    entered, release = threading.Event(), threading.Event()
    results: dict[str, tuple[str, Any]] = {}
    queue = recorder._pending = _Queue()

    def holding(_batch: Batch) -> str:
        entered.set()
        release.wait(DEADLINE)
        return "held"

    def good(name: str) -> Callable[[Reads], Callable[[Batch], Any]]:
        def read(reads: Reads) -> Callable[[Batch], Any]:
            assert reads.agent("no-such-agent", "no-such-workspace") is None
            return lambda _b: name

        return read

    def bad(reads: Reads) -> Callable[[Batch], Any]:
        # a server-side error, as a statement_timeout, a lock_timeout or a cancel would be
        reads._fetch(Compiled("SELECT no_such_column FROM agents", ()), {})
        return lambda _b: "bad"

    def call(name: str, **how: Any) -> None:
        try:
            results[name] = ("ok", recorder.run(**how))
        except Exception as exc:
            results[name] = ("raised", type(exc).__name__)

    threads = [threading.Thread(target=call, args=("leader",), kwargs={"job": holding})]
    threads[0].start()
    assert entered.wait(DEADLINE)
    reads = [("a", good("a")), ("bad", bad), ("c", good("c")), ("d", good("d"))]
    for count, (name, read) in enumerate(reads, start=1):
        threads.append(threading.Thread(target=call, args=(name,), kwargs={"read": read}))
        threads[-1].start()
        queue.wait_for(count)
    release.set()
    for thread in threads:
        thread.join(DEADLINE)
    assert results == {
        "leader": ("ok", "held"),
        "a": ("ok", "a"),
        "bad": ("raised", "StorageError"),
        "c": ("ok", "c"),
        "d": ("ok", "d"),
    }


def test_a_thread_that_could_not_be_started_is_started_at_the_next_call(recorder, monkeypatch):
    started = threading.Thread.start
    refusals = [RuntimeError("can't start new thread")]

    def start(thread: threading.Thread) -> None:
        if thread.name == "agentauth-recorder" and refusals:
            raise refusals.pop()
        started(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        recorder.run(lambda _b: "first")
    assert recorder.run(lambda _b: "second") == "second"


def test_a_call_after_close_is_refused_not_left_waiting(db):
    recorder = Recorder.for_database(db)
    assert recorder.run(lambda _b: "before") == "before"
    recorder.close()
    with pytest.raises(StorageError):
        recorder.run(lambda _b: "after")
    with pytest.raises(StorageError):
        asyncio.run(recorder.arun(lambda _b: "after"))


def _three_in_turn(recorder: Recorder) -> None:
    """Three callers, each arriving once the one before it is queued."""
    queue = recorder._pending = _Queue()
    results: list[int] = []
    threads = []
    for n in range(3):
        threads.append(
            threading.Thread(target=lambda n=n: results.append(recorder.run(lambda _b: n)))
        )
        threads[-1].start()
        if n < 2:  # still queued: the recorder waits for the third
            queue.wait_for(n + 1)
    for thread in threads:
        thread.join(DEADLINE)
    assert sorted(results) == [0, 1, 2]


def test_a_batch_waits_for_the_calls_in_hand_and_commits_them_together(db, recorder):
    """Three calls in hand, arriving one after the other: one commit for the three (without
    the wait, the first would have gone alone, as soon as it came)."""
    sizes: list[int] = []
    recorder._on_commit = sizes.append
    recorder.calls_in_progress = lambda: 3
    # the wait's bound: a hang guard here
    recorder._last_batch_seconds = recorder.gather_max_seconds = DEADLINE
    _three_in_turn(recorder)
    assert sizes == [3]


class _Patient(Recorder):
    """A recorder whose batches wait up to :data:`DEADLINE` (a hang guard) for the calls they
    expect, however long the last batch took."""

    _last_batch_seconds = property(lambda _self: DEADLINE, lambda _self, _value: None)
    gather_max_seconds = property(lambda _self: DEADLINE, lambda _self, _value: None)


def test_a_batch_expects_as_many_calls_as_the_last_batches_held(db):
    """Under a steady load the callers of a batch come back one by one, not yet in hand when the
    next batch starts: it waits for as many as the last batches held."""
    recorder = _Patient.for_database(db)
    try:
        sizes: list[int] = []
        recorder._on_commit = sizes.append
        in_hand = [3]
        recorder.calls_in_progress = lambda: in_hand[0]
        recorder.forget_after_seconds = DEADLINE  # the test's own pauses are no lull
        _three_in_turn(recorder)
        in_hand[0] = 1  # the first caller is back, the other two not yet
        _three_in_turn(recorder)
        assert sizes == [3, 3]
    finally:
        recorder.close()


class _Waits(threading.Condition):
    """The recorder's condition, telling how often a batch waited for calls to come (a wait
    with a bound), and when the thread last began to wait for any call (one without)."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.bounded = 0
        self.idle = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.bounded += 1
        else:
            self.idle.set()
        return super().wait(timeout)


def test_when_the_load_falls_a_lone_call_soon_waits_for_nothing(db, recorder):
    """After a batch of three, a lone caller's batches wait for the calls the last batches
    suggest (at most one batch's time each); within RECENT_BATCHES batches they expect one
    call, and a lone call goes at once."""
    sizes: list[int] = []
    recorder._on_commit = sizes.append
    in_hand = [3]
    recorder.calls_in_progress = lambda: in_hand[0]
    # for the batch of three; then the real time
    recorder._last_batch_seconds = recorder.gather_max_seconds = DEADLINE
    recorder.forget_after_seconds = DEADLINE  # the test's own pauses are no lull
    waits = recorder._queued = _Waits()
    _three_in_turn(recorder)
    in_hand[0] = 1
    waits.bounded = 0
    assert recorder.run(lambda _b: "alone") == "alone"
    assert waits.bounded > 0  # it waited for the two that did not come
    for _ in range(RECENT_BATCHES):
        recorder.run(lambda _b: "alone")
    waits.bounded = 0
    assert recorder.run(lambda _b: "alone") == "alone"
    assert waits.bounded == 0
    assert sizes == [3] + [1] * (RECENT_BATCHES + 2)


def test_after_a_lull_a_lone_call_waits_for_nothing(db, recorder):
    """After a batch of three, once no call came for a while (here: any while), the last
    batches say nothing of the next: a lone call goes at once."""
    sizes: list[int] = []
    recorder._on_commit = sizes.append
    in_hand = [3]
    recorder.calls_in_progress = lambda: in_hand[0]
    recorder._last_batch_seconds = recorder.gather_max_seconds = DEADLINE
    recorder.forget_after_seconds = 0
    waits = recorder._queued = _Waits()
    _three_in_turn(recorder)
    in_hand[0] = 1
    assert waits.idle.wait(DEADLINE)  # the recorder waits for a call: a lull begins
    waits.bounded = 0
    assert recorder.run(lambda _b: "alone") == "alone"
    assert waits.bounded == 0
    assert sizes == [3, 1]


def test_a_batch_waits_no_longer_than_its_bound_however_long_the_last_took(db, recorder):
    """A batch that took long (it waited for SQLite's write lock, say) does not make the next
    wait as long for calls that may not come: the wait has a bound of its own (here none)."""
    sizes: list[int] = []
    recorder._on_commit = sizes.append
    recorder.calls_in_progress = lambda: 3  # two of them never come
    recorder._last_batch_seconds = DEADLINE
    recorder.gather_max_seconds = 0
    waits = recorder._queued = _Waits()
    assert recorder.run(lambda _b: "alone") == "alone"
    assert waits.bounded == 0
    assert sizes == [1]
