"""Watch: apply a policy directory again whenever a policy file in it is saved.

watchdog's observer reports file events; the ones that can change what the repository declares
(a ``*.yaml``/``*.yml`` file or a folder, outside hidden paths such as ``.git``, and not an
editor's temporary file) move a debounce deadline. One worker thread waits on a condition until
the deadline passes with no newer event, then applies once: a burst of saves (an editor's
write-then-rename, ``git checkout``) costs one apply. Applies never overlap; events during an
apply schedule the next one.

Called by ``controller.cli`` (``watch``); each apply is ``controller.reconcile``'s.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from controller.apply import ApplyResult
from controller.load import is_document_path
from controller.sources import SourceError

logger = logging.getLogger(__name__)

DEFAULT_DEBOUNCE = 0.5

#: events that can change the files (opened, attribute and read-only events cannot)
_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileClosedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


def is_watched_path(relative: str, is_directory: bool) -> bool:
    """Whether a change at ``relative`` (POSIX, relative to the watched folder) can change the
    repository: a policy file read by ``read_files``, or a folder that may hold some."""
    if not relative or relative == "." or relative.startswith("../"):
        return False
    if is_directory:
        return not any(part.startswith(".") for part in relative.split("/"))
    return is_document_path(relative)


class _Handler(FileSystemEventHandler):
    def __init__(self, root: Path, on_change: Callable[[], None]) -> None:
        self._root = root
        self._on_change = on_change

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = [p for p in (event.src_path, event.dest_path) if p]
        for path in paths:
            relative = Path(os.path.relpath(os.fsdecode(path), self._root)).as_posix()
            if is_watched_path(relative, event.is_directory):
                self._on_change()
                return


class Watcher:
    """Applies once when started, then once per burst of changes under ``directory``.

    Each result is put on :attr:`results` and passed to ``on_result`` (the CLI logs it), from
    the worker thread. ``apply_fn`` should report failures in its result rather than raise;
    anything it raises is logged and the watcher carries on.
    """

    def __init__(
        self,
        directory: Path,
        apply_fn: Callable[[], ApplyResult],
        debounce: float = DEFAULT_DEBOUNCE,
        on_result: Callable[[ApplyResult], None] | None = None,
    ) -> None:
        self.directory = directory.absolute()
        self.debounce = debounce
        self.results: queue.Queue[ApplyResult] = queue.Queue()
        self._apply = apply_fn
        self._on_result = on_result
        self._changed = threading.Condition()
        self._due: float | None = None  # time.monotonic() at which to apply; None: nothing to do
        self._stopping = False
        self._observer = Observer()
        self._worker = threading.Thread(target=self._work, name="agentauth-watch", daemon=True)

    def start(self) -> None:
        """Watch first, then apply: a save during the first apply is not missed."""
        handler = _Handler(self.directory, self.notify)
        try:
            self._observer.schedule(
                handler, str(self.directory), recursive=True, event_filter=_EVENTS
            )
            self._observer.start()
        except OSError as exc:
            raise SourceError(f"cannot watch {self.directory}: {exc.strerror or exc}") from None
        with self._changed:
            self._due = time.monotonic()
        self._worker.start()

    def stop(self) -> None:
        """Stop watching; an apply in progress finishes, a pending one is dropped."""
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join()
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._worker.is_alive():
            self._worker.join()

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def notify(self) -> None:
        """A relevant change happened: apply once ``debounce`` seconds pass without another."""
        with self._changed:
            self._due = time.monotonic() + self.debounce
            self._changed.notify()

    def _work(self) -> None:
        while self._wait_until_due():
            self._apply_once()

    def _wait_until_due(self) -> bool:
        """Block until an apply is due (True) or the watcher stops (False)."""
        with self._changed:
            while not self._stopping:
                if self._due is not None:
                    remaining = self._due - time.monotonic()
                    if remaining <= 0:
                        self._due = None
                        return True
                    self._changed.wait(remaining)
                else:
                    self._changed.wait()
            return False

    def _apply_once(self) -> None:
        try:
            result = self._apply()
            self.results.put(result)
            if self._on_result is not None:
                self._on_result(result)
        except Exception:  # the watcher outlives one bad apply; the traceback is logged
            logger.exception("applying %s failed", self.directory)
