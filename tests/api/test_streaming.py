"""``api.streaming`` in process: the pipe between the app's thread and the server, read here as
granian reads it (opened by its name, blocking reads). A whole answer ends with the end of the
pipe; one that fails part-way ends with the failure's line and then a read that fails, never
with the end of the pipe (which the server would send as a whole answer); a reader that goes
away stops the answer being produced."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from api.streaming import FAILED_LINE, Channel, pump


class Reader(threading.Thread):
    """Reads the channel's pipe as granian does, until it ends, fails, or ``limit`` bytes."""

    def __init__(
        self, channel: Channel, limit: int | None = None, pause: threading.Event | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.path, self.limit, self.pause = channel.path, limit, pause
        self.data = bytearray()
        self.ending: str | BaseException = "running"

    def run(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while self.limit is None or len(self.data) < self.limit:
                if self.pause is not None and self.data:  # once it has something: a pause
                    self.pause.wait()
                part = os.read(fd, 4096)
                if not part:
                    self.ending = "end"
                    return
                self.data += part
            self.ending = "left"
        except OSError as exc:
            self.ending = exc
        finally:
            os.close(fd)


def _answer(lines: int, fail: bool, produced: list[int] | None = None) -> Iterator[bytes]:
    for n in range(lines):
        if produced is not None:
            produced.append(n)
        yield b'{"seq":%d}\n' % (n + 1)
    if fail:
        raise RuntimeError("the database went away")


def _run(answer: Iterator[bytes], limit: int | None = None) -> Reader:
    channel = Channel()
    reader = Reader(channel, limit)
    reader.start()
    pump(answer, channel)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert not os.path.exists(channel.folder)  # nothing left on disk
    return reader


def test_a_whole_answer_ends_with_the_end_of_the_pipe():
    reader = _run(_answer(20_000, fail=False))
    assert reader.ending == "end"
    assert bytes(reader.data) == b"".join(_answer(20_000, fail=False))


@pytest.mark.parametrize("lines", [0, 1, 20_000])
def test_an_answer_that_fails_ends_with_its_line_then_a_read_that_fails(lines, caplog):
    reader = _run(_answer(lines, fail=True))
    assert isinstance(reader.ending, BlockingIOError), reader.ending
    whole = b"".join(_answer(lines, fail=False))
    assert bytes(reader.data) == whole + FAILED_LINE
    assert "the database went away" in caplog.text


def test_a_reader_that_goes_away_stops_the_answer():
    produced: list[int] = []
    reader = _run(_answer(1_000_000, fail=False, produced=produced), limit=8192)
    assert reader.ending == "left"
    # what the pipe held when the reader left, and not much more, was produced
    assert len(produced) < 100_000


def test_the_pipe_is_private():
    channel = Channel()
    try:
        assert os.stat(channel.folder).st_mode & 0o777 == 0o700
        assert os.stat(channel.path).st_mode & 0o777 == 0o600
    finally:
        os.unlink(channel.path)
        os.rmdir(channel.folder)


def test_a_client_that_takes_nothing_is_given_up_and_its_answer_aborted():
    """The reader takes a first part, then nothing until the writer has given up (its thread
    is free, the rest not produced); what the pipe held then reaches it, then a read fails."""
    produced: list[int] = []
    channel = Channel()
    resume = threading.Event()
    reader = Reader(channel, pause=resume)
    reader.start()
    pump(_answer(1_000_000, fail=False, produced=produced), channel, stall=0.2)
    resume.set()
    reader.join(timeout=30)
    assert isinstance(reader.ending, BlockingIOError), reader.ending
    assert len(produced) < 100_000
    whole = b"".join(_answer(len(produced), fail=False))
    assert whole.startswith(bytes(reader.data))
    assert len(reader.data) > 4096  # the pipe's part too, not only what it took first
