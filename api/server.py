"""Serving the API with gunicorn, a production WSGI server (never Flask's development server).

Each worker process builds its own app (and so its own database engine) after the fork.
"""

from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication

from core.config import Settings


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
        return create_app(self.settings)


def serve(settings: Settings, host: str, port: int, workers: int, threads: int) -> None:
    """Run until stopped (SIGTERM/SIGINT finish in-flight requests first)."""
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
    }
    _Server(settings, options).run()
