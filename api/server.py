"""Serving the API with gunicorn, a production WSGI server (never Flask's development server).

Each worker process builds its own app (and so its own database engine) after the fork.
"""

from __future__ import annotations

import gc
import os
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication

from core.config import Settings

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name for it


class _Server(BaseApplication):  # type: ignore[misc]
    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from api import create_app
        from api.observe import configure_logging

        configure_logging()
        app = create_app(self.settings)
        # what the worker holds from here on (modules, the app, compiled schemas) lives as
        # long as the worker: out of the cycle collector's sight, which would otherwise walk
        # it again at each full collection
        gc.freeze()
        return app


def serve(settings: Settings, host: str, port: int, workers: int, threads: int) -> None:
    """Run until stopped. SIGTERM is graceful: the workers stop accepting, finish the requests
    in flight (for up to 20 s) and exit 0; SIGINT (Ctrl-C) and SIGQUIT stop at once, as in
    gunicorn. Metrics are kept per worker in a folder of this server's own and added up at
    each scrape."""
    with tempfile.TemporaryDirectory(prefix="agentauth-metrics-") as folder:
        os.environ[MULTIPROCESS_ENV] = folder  # before the workers import prometheus_client
        from api.outbox import DeliveryProcess  # (it imports prometheus_client too)

        # webhook deliveries: one child process per server, counting in the same folder
        deliveries = DeliveryProcess(settings)
        try:
            _run(settings, host, port, workers, threads)
        finally:
            deliveries.stop()
            os.environ.pop(MULTIPROCESS_ENV, None)


def _starting(_server: Any) -> None:
    """In the master, once gunicorn has set up its logging: the key filter on its handlers
    (each worker adds it to its own when it loads the app)."""
    from api.observe import configure_logging

    configure_logging()


def _worker_exited(_server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def _run(settings: Settings, host: str, port: int, workers: int, threads: int) -> None:
    options = {
        "bind": f"{host}:{port}",
        "workers": workers,
        "threads": threads,
        "worker_class": "gthread" if threads > 1 else "sync",
        "preload_app": False,
        "accesslog": None,
        "graceful_timeout": 20,
        "timeout": 60,
        "proc_name": "agentauth",
        # several servers may run on one machine (tests, benchmarks): no shared control socket
        "control_socket_disable": True,
        "on_starting": _starting,
        "child_exit": _worker_exited,
    }
    _Server(settings, options).run()
