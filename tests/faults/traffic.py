"""Authorize traffic for the fault tests: client threads (httpx, loopback) calling
``POST /v1/authorize`` until stopped, keeping every complete answer they received.

Each call carries a parameter ``seq`` of its own, so the audit entry of any call can be told
apart from every other call's, answered or not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tests.conftest import bearer

#: how long one call may take before the client gives up: a guard against a server that
#: hangs, far above any answer's real time (a timed-out call is reported, never retried)
CALL_TIMEOUT = 30


@dataclass(frozen=True)
class Answer:
    """A complete HTTP answer one call received."""

    seq: str
    tool: str
    status: int
    body: Any  # the parsed JSON, or the raw text when it was not JSON
    sent_in: str  # the traffic's phase when the call was sent, and when its answer arrived
    answered_in: str
    request_id: str | None  # X-Request-Id, by which operators find the call in the logs

    @property
    def allowed(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("allowed") is True


class Traffic:
    """``clients`` threads, each with its own connection, sending calls round-robin over
    ``tools`` until :meth:`stop`. A call that gets no complete answer (the connection broke, or
    it timed out) is kept in :attr:`broken` and ends its client."""

    def __init__(
        self, base: str, key: str, agent_id: str, tools: Sequence[str], *, clients: int, name: str
    ) -> None:
        self.base = base
        self.key = key
        self.agent_id = agent_id
        self.tools = list(tools)
        self.name = name
        self.phase = "start"
        self.answers: list[Answer] = []
        self.sent: list[str] = []
        self.broken: list[tuple[str, str, str]] = []  # (seq, phase, error)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(n,), name=f"{name}-{n}", daemon=True)
            for n in range(clients)
        ]

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def mark(self, phase: str) -> None:
        """Calls sent (and answers received) from now on belong to ``phase``."""
        self.phase = phase

    def wait_for(self, what: str, done: Callable[[list[Answer]], bool], seconds: float) -> None:
        """Block until ``done(answers)`` holds; fail naming ``what`` if it does not within
        ``seconds`` (a hang guard) or every client has ended first."""
        with self._changed:
            self._changed.wait_for(lambda: done(self.answers) or not self._running(), seconds)
            if not done(self.answers):
                raise AssertionError(f"{self.name}: no {what} within {seconds} s; {self.summary()}")

    def stop(self) -> None:
        """Stop sending; every client has ended when this returns (or it fails)."""
        self._stop.set()
        deadline = time.monotonic() + CALL_TIMEOUT + 10
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        assert not alive, f"{self.name}: clients {alive} did not end"

    def summary(self) -> str:
        statuses: dict[int, int] = {}
        for answer in self.answers:
            statuses[answer.status] = statuses.get(answer.status, 0) + 1
        return f"{len(self.sent)} sent, answers by status {statuses}, broken {self.broken[:3]}"

    def _running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _client(self, number: int) -> None:
        try:
            with httpx.Client(
                base_url=self.base, headers=bearer(self.key), timeout=CALL_TIMEOUT
            ) as http:
                self._send_until_stopped(http, number)
        finally:
            with self._changed:
                self._changed.notify_all()  # a waiter learns that this client has ended

    def _send_until_stopped(self, http: httpx.Client, number: int) -> None:
        count = 0
        while not self._stop.is_set():
            tool = self.tools[(number + count) % len(self.tools)]
            seq = f"{self.name}-{number}-{count}"
            count += 1
            body = {
                "agent_id": self.agent_id,
                "tool_name": tool,
                "parameters": {"seq": seq, "amount": 5},
            }
            sent_in = self.phase
            with self._changed:
                self.sent.append(seq)
            try:
                response = http.post("/v1/authorize", json=body)
            except httpx.TransportError as exc:  # no complete answer: this client is done
                with self._changed:
                    self.broken.append((seq, self.phase, repr(exc)))
                return
            try:
                parsed: Any = response.json()
            except ValueError:
                parsed = response.text
            answer = Answer(
                seq,
                tool,
                response.status_code,
                parsed,
                sent_in,
                self.phase,
                response.headers.get("X-Request-Id"),
            )
            with self._changed:
                self.answers.append(answer)
                self._changed.notify_all()
