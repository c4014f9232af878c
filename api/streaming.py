"""Answers sent as they are produced (an export of millions of entries): the app marks such an
answer with :func:`mark`, and the front (``api.serving``) hands granian the read end of a pipe
while a thread of the app writes the answer into it.

Why a pipe: granian's own stream of an RSGI answer (``response_stream``) buffers without
bound whatever the client has not taken yet (2.8: its channel has no capacity), and ends the
answer as complete when the app fails part-way. Granian reads a file given to it
(``response_file``) only as fast as the client takes it, so through a pipe the kernel's
buffer (64 KiB) holds the writer back: memory stays bounded and nothing goes to disk. And
granian aborts the answer (no terminating chunk: a client sees a transfer cut short) when a
read of that file fails, which is how a failure part-way is told (:func:`_abort`).

The pipe is a FIFO in a private folder, opened by granian for reading and here for writing
(the two opens meet, and the name is then removed): granian's end is then the pipe's only
reader, so a client that goes away leaves the writer a broken pipe and the answer stops.
Called by ``api.serving``; ``api.audit_logs`` marks its exports.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import select
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Response, request

from api.errors import render_error

log = logging.getLogger("agentauth.streaming")

#: the response header by which the app marks a streamed answer (the front removes it)
STREAMED = "X-Agentauth-Streamed"
#: set in the environ by a front that streams: only then does :func:`mark` mark
STREAMS = "agentauth.streams"
#: written in place of the rest of an answer that failed part-way: not JSON, not a CSV row of
#: the export's columns, so that a saved copy fails ``agentauth audit verify`` saying why
FAILED_LINE = b"!! the server failed while writing this answer: it is incomplete\n"
#: how long granian may take to open the pipe
OPEN_SECONDS = 30
#: how long a client may take nothing before its answer is given up (aborted): the thread
#: of the app that writes it, and the database snapshot it reads, are then free again
STALL_SECONDS = 120
#: pidfd_getfd(2) (the same number on every Linux architecture)
_PIDFD_GETFD = 438


def mark(response: Response) -> Response:
    """``response`` marked to be sent as it is produced, when the front can."""
    if request.environ.get(STREAMS):
        response.headers[STREAMED] = "1"
    return response


def is_marked(headers: list[tuple[str, str]]) -> bool:
    return any(k.lower() == STREAMED.lower() for k, _ in headers)


def unmarked(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() != STREAMED.lower()]


class Channel:
    """A FIFO of no other use in a folder of its own (mode 0700), for one answer."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="agentauth-stream-")
        self.path = os.path.join(self.folder, "answer")
        os.mkfifo(self.path, 0o600)

    @contextlib.contextmanager
    def writer(self) -> Iterator[int]:
        """The write end, once granian has opened the read end; the name is gone by then. If
        granian has not opened it within :data:`OPEN_SECONDS` (its client went away first),
        a reader of this process's own takes its place and leaves at once: the writer then
        meets a broken pipe."""
        guard = threading.Timer(OPEN_SECONDS, self._stand_in)
        guard.start()
        try:
            fd = os.open(self.path, os.O_WRONLY)
        finally:
            guard.cancel()
            shutil.rmtree(self.folder, ignore_errors=True)
        try:
            os.set_blocking(fd, False)  # this end only: a write waits in _write, with a deadline
            yield fd
        finally:
            os.close(fd)

    def _stand_in(self) -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))


def pump(chunks: Iterable[bytes], channel: Channel, stall: float = STALL_SECONDS) -> None:
    """Write ``chunks`` into ``channel`` as granian takes them. When they fail part-way (the
    error is logged), :data:`FAILED_LINE` follows what was written and the answer is aborted;
    when the client goes away, the rest is not produced; when it takes nothing for ``stall``
    seconds, the rest is not produced either and the answer is aborted after what the pipe
    holds."""
    with channel.writer() as fd:
        produced = iter(chunks)
        try:
            while True:
                try:
                    chunk = next(produced, None)
                except Exception as exc:
                    render_error(exc)  # logged as an unexpected error, with its traceback
                    _abort(fd, stall)
                    return
                if chunk is None:
                    return
                _write(fd, chunk, stall)
        except BrokenPipeError:  # the client went away
            return
        except _Stalled:
            log.warning("a client took nothing of an answer for %g seconds: given up", stall)
            if _readers_nonblocking(fd):
                _hold(fd)


class _Stalled(Exception):
    """The client has taken nothing of the answer for too long."""


def _write(fd: int, data: bytes, stall: float) -> None:
    view = memoryview(data)
    waiting = select.poll()
    waiting.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # the pipe is full: the client takes nothing now
            if not waiting.poll(stall * 1000):
                raise _Stalled from None


def _abort(fd: int, stall: float) -> None:
    """End the answer as cut short: its reader (granian's) is made non-blocking, so that once
    it has taken :data:`FAILED_LINE` its next read fails (rather than waiting, or meeting the
    end of a whole answer) and granian aborts the transfer. The line goes before that, but for
    its newline, which goes after: it wakes a read already waiting (one that a non-blocking
    reader does not make fail), and the text is in the pipe before any read can fail. Where
    the reader cannot be reached (not Linux, no pidfd_getfd), the answer ends after the line,
    which still tells it."""
    try:
        _write(fd, FAILED_LINE[:-1], stall)
        reachable = _readers_nonblocking(fd)
        _write(fd, FAILED_LINE[-1:], stall)
    except BrokenPipeError:  # the client went away
        return
    except _Stalled:  # the pipe is full, no read waits: the client aborts once it takes it
        reachable = _readers_nonblocking(fd)
    if reachable:
        _hold(fd)


def _hold(fd: int) -> None:
    """Keep the pipe's write end open, on a thread of its own, until its reader has taken
    what is left and failed, or its client has gone: the pipe's end would end the answer as
    whole. No deadline: it lasts as long as granian keeps the connection, and costs a sleeping
    thread and a descriptor meanwhile."""
    copy = os.dup(fd)

    def wait() -> None:
        try:
            waiting = select.poll()
            waiting.register(copy, 0)  # POLLERR alone: the pipe has no reader left
            waiting.poll()
        finally:
            os.close(copy)

    threading.Thread(target=wait, name="agentauth-answer-hold", daemon=True).start()


def _readers_nonblocking(fd: int) -> bool:
    """Make every other open end of ``fd``'s pipe in this process (granian's) non-blocking.
    Each is taken by pidfd_getfd(2), a copy that cannot be another file even if the number
    was reused meanwhile, and checked to be this pipe before it is changed. The reader's open
    met the writer's, but its descriptor may not be in the process's table yet (the kernel
    puts it there as its open returns, and says so to no one): looked for again a few times."""
    try:
        pidfd = os.pidfd_open(os.getpid())
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (AttributeError, OSError):
        return False
    try:
        for _ in range(_LOOKS):
            if _nonblocking(fd, pidfd, syscall):
                return True
            time.sleep(_LOOK_SECONDS)
        return False
    finally:
        os.close(pidfd)


#: how many times, how far apart, the reader's descriptor is looked for
_LOOKS = 100
_LOOK_SECONDS = 0.01


def _nonblocking(fd: int, pidfd: int, syscall: Any) -> bool:
    pipe = os.fstat(fd)
    found = False
    for name in os.listdir("/proc/self/fd"):
        number = int(name)
        if number == fd or not _same(f"/proc/self/fd/{number}", pipe):
            continue
        copy = syscall(_PIDFD_GETFD, pidfd, number, 0)
        if copy < 0:
            continue
        try:
            if _same(copy, pipe):
                flags = fcntl.fcntl(copy, fcntl.F_GETFL)
                fcntl.fcntl(copy, fcntl.F_SETFL, flags | os.O_NONBLOCK)
                found = True
        finally:
            os.close(copy)
    return found


def _same(file: int | str, pipe: os.stat_result) -> bool:
    try:
        other = os.fstat(file) if isinstance(file, int) else os.stat(file)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (pipe.st_dev, pipe.st_ino)
