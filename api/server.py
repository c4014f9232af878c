"""Serving the API with granian, a production HTTP server written in Rust (never Flask's
development server), through the front of :mod:`api.serving`.

A master process forks the workers; each builds its own app (and so its own database engine)
after the fork, serves on an event loop (uvloop's), and runs the app on a pool of threads. Why
granian and its RSGI interface rather than gunicorn or a WSGI interface: bench/RESULTS.md, "Issue
22, finding 2" (slow clients hold a socket, never a thread).
"""

from __future__ import annotations

import functools
import gc
import glob
import os
import re
import resource
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.config import Settings

if TYPE_CHECKING:
    from flask import Flask

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name for it
#: how long the workers have to finish the requests in flight after SIGTERM, in seconds
GRACEFUL_SECONDS = 20
#: the most requests a worker takes in at once; more wait in the listen backlog
BACKPRESSURE = 256
_LIVE_GAUGE = re.compile(r"gauge_live\w*_(\d+)\.db")


def serve(
    settings: Settings, host: str, port: int, workers: int, threads: int,
    make_app: Callable[[Settings], Flask] | None = None,
) -> None:  # fmt: skip
    """Run until stopped; each worker serves ``make_app(settings)`` (default
    :func:`api.create_app`; the benchmark serves a bare app so; a module-level function). SIGTERM
    and SIGINT (Ctrl-C) are graceful: the workers stop accepting, finish the requests in flight
    (for up to :data:`GRACEFUL_SECONDS`) and the master exits 0. A worker that dies is replaced.
    Metrics are kept per worker in a folder of this server's own and added up at each scrape."""
    with tempfile.TemporaryDirectory(prefix="agentauth-metrics-") as folder:
        os.environ[MULTIPROCESS_ENV] = folder  # before the workers import prometheus_client
        from api.outbox import DeliveryProcess  # (it imports prometheus_client too)

        # webhook deliveries: one child process per server, counting in the same folder
        deliveries = DeliveryProcess(settings)
        try:
            _run(settings, host, port, workers, threads, make_app)
        finally:
            deliveries.stop()
            os.environ.pop(MULTIPROCESS_ENV, None)


def _run(
    settings: Settings, host: str, port: int, workers: int, threads: int,
    make_app: Callable[[Settings], Flask] | None,
) -> None:  # fmt: skip
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.server import Server

    from api.observe import configure_logging

    server = Server(
        "agentauth",  # a name only: the workers are given the app by _load
        address=host,
        port=port,
        interface=Interfaces.RSGI,
        # HTTP/1.1 only: HTTP/2 in clear text (h2c) would have no header deadline
        http=HTTPModes.http1,
        workers=workers,
        # uvloop where it is installed (setup.cfg: everywhere but Windows), else asyncio's own:
        # the front answers authorize calls on this loop, and uvloop's costs less CPU a call
        loop=Loops.uvloop if _has_uvloop() else Loops.asyncio,
        backpressure=BACKPRESSURE,
        # a connection whose headers have not all arrived within the deadline is closed
        http1_settings=HTTP1Settings(header_read_timeout=settings.read_timeout_seconds * 1000),
        respawn_failed_workers=True,
        workers_kill_timeout=GRACEFUL_SECONDS,
        log_access=False,  # the app writes one JSON line per request (api.observe)
    )
    configure_logging()  # the key filter on granian's handlers in the master
    _more_files()
    # a module-level function: picklable, should a worker be spawned rather than forked
    server.serve(target_loader=functools.partial(_load, settings, threads, make_app))


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def _more_files() -> None:
    """As many open files as the system lets this process have (the soft limit raised to the
    hard one, inherited by the workers): each connection a worker holds, idle ones included,
    is a file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _load(
    settings: Settings, threads: int, make_app: Callable[[Settings], Flask] | None, _name: str
) -> Any:
    """In each worker, after the fork: the app behind its front."""
    from prometheus_client import multiprocess

    from api import create_app
    from api.observe import configure_logging
    from api.serving import Front

    configure_logging()
    _sweep_dead_workers(multiprocess)
    app = (make_app or create_app)(settings)
    front = Front(app, threads, settings.read_timeout_seconds, settings.max_body_bytes)
    if "agentauth" in app.extensions:
        front.on_close.append(app.extensions["agentauth"].close)
    pid = os.getpid()
    front.on_close.append(lambda: multiprocess.mark_process_dead(pid))  # type: ignore[no-untyped-call]
    # what the worker holds from here on (modules, the app, compiled schemas) lives as long as
    # the worker: out of the cycle collector's sight, which would otherwise walk it again at
    # each full collection
    gc.freeze()
    return front


def _sweep_dead_workers(multiprocess: Any) -> None:
    """The live-gauge files of workers that are gone (granian has no hook where a dead
    worker's parent could do it, as gunicorn's child_exit was): the worker replacing one that
    died removes them, so a scrape does not count a dead worker's in-flight requests."""
    folder = os.environ.get(MULTIPROCESS_ENV)
    if not folder:
        return
    for path in glob.glob(os.path.join(folder, "gauge_live*_*.db")):
        found = _LIVE_GAUGE.fullmatch(os.path.basename(path))
        if found and not _alive(int(found.group(1))):
            multiprocess.mark_process_dead(int(found.group(1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
