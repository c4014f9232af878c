"""Taking the database away from a served app, and giving it back, as happens in production.

PostgreSQL: the shared server must keep running for everyone else, so the app is served through
a TCP proxy on loopback (:class:`PostgresProxy`); "the database stops" means every connection
through the proxy is cut and new ones are refused, and "it returns" means the proxy listens
again on the same port. SQLite: root ignores file modes, so a file cannot be made read-only by
chmod; instead another process holds the write lock (``BEGIN EXCLUSIVE``: a backup, a
maintenance script, an operator's ``sqlite3`` shell), as :class:`SqliteLock` does. Readers go on
reading (WAL); every write waits for the lock, then fails.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Protocol

from sqlalchemy.engine import make_url

from core.store.database import normalize_url

STOP_SECONDS = 10
#: the other process: takes the lock, says so, holds it until its standard input closes
_LOCKER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
connection.execute("ROLLBACK")
"""


class Outage(Protocol):
    #: the database URL the served app must use, so that this outage reaches it
    url: str

    def begin(self) -> None: ...

    def end(self) -> None: ...

    def close(self) -> None: ...


@contextmanager
def outage_of(database_url: str) -> Iterator[Outage]:
    """An outage for this database, ended and cleaned up (threads and processes stopped) when
    the block ends."""
    outage: Outage
    if make_url(normalize_url(database_url)).get_backend_name() == "sqlite":
        outage = SqliteLock(database_url)
    else:
        outage = PostgresProxy(database_url)
    try:
        yield outage
    finally:
        outage.close()


class SqliteLock:
    """Another process holding SQLite's write lock on the database file while the outage lasts."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self._path = str(make_url(database_url).database)
        self._process: subprocess.Popen[str] | None = None

    def begin(self) -> None:
        assert self._process is None, "the lock is already held"
        process = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, self._path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._process = process
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the lock is held, or the process died
        assert line.strip() == "locked", f"the lock was not taken (exit {process.poll()})"

    def end(self) -> None:
        process, self._process = self._process, None
        assert process is not None, "the lock is not held"
        assert process.stdin is not None
        process.stdin.close()  # the holder rolls back and exits
        assert process.wait(timeout=STOP_SECONDS) == 0, "the lock holder failed to let go"

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_SECONDS)


class PostgresProxy:
    """A TCP forwarder on loopback to the PostgreSQL of ``database_url``: one thread accepting,
    two pumping each connection's bytes."""

    def __init__(self, database_url: str) -> None:
        target = make_url(normalize_url(database_url))
        self._upstream = (target.host or "127.0.0.1", target.port or 5432)
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()
        self.url = target.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False
        )

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            return len(self._pairs)

    def begin(self) -> None:
        """The database stops: new connections are refused, open ones cut."""
        with self._lock:
            listener, self._listener = self._listener, None
            assert listener is not None, "the database is already stopped"
            _shut(listener)  # wakes the accepting thread, and frees the port for end()
            for pair in self._pairs:
                for sock in pair:
                    _shut(sock)
            self._pairs.clear()
        self._join()

    def end(self) -> None:
        """The database returns, on the same address."""
        assert self._listener is None, "the database is not stopped"
        self._listen()

    def close(self) -> None:
        if self._listener is not None:
            self.begin()
        self._join()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _join(self) -> None:
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(STOP_SECONDS)
        alive = [thread for thread in threads if thread.is_alive()]
        assert not alive, f"{len(alive)} proxy threads did not end"

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # begin() shut the listener
            try:
                upstream = socket.create_connection(self._upstream, timeout=STOP_SECONDS)
                upstream.settimeout(None)
            except OSError:
                _shut(client)
                continue
            pair = (client, upstream)
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    _shut(client)
                    _shut(upstream)
                    return
                self._pairs.add(pair)
            self._spawn(self._pump, client, upstream, pair)
            self._spawn(self._pump, upstream, client, pair)

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        pair: tuple[socket.socket, socket.socket],
    ) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # cut by begin(), or the other side went away
        with self._lock:
            if pair in self._pairs:  # one side closed: close the other too
                self._pairs.discard(pair)
                for sock in pair:
                    _shut(sock)


def _shut(sock: socket.socket) -> None:
    """Close now: ``shutdown`` first wakes any thread blocked on the socket."""
    with suppress(OSError):  # not connected (any more)
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
