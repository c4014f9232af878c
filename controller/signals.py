"""Waiting for the signal that stops a long-running verb (``watch``, ``sync``): SIGINT or
SIGTERM, as a terminal, systemd or Kubernetes sends it. Called by ``controller.cli`` and
``controller.sync``."""

from __future__ import annotations

import signal
import threading


def wait_for_stop_signal(finished: threading.Event | None = None) -> None:
    """Block the main thread until SIGINT or SIGTERM arrives (or ``finished`` is set).

    SIGTERM is handled like SIGINT for the wait: the handler raises KeyboardInterrupt in the
    main thread, which takes no lock, so it cannot deadlock with the event's."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        (finished or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
