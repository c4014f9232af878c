"""The shared case table of every guard (``conformance/guard-cases.yaml``): loading it, playing
a case's service on a real loopback socket, and judging what a guard did with it. The core
guard's tests and each adapter's tests run every case through their own way of calling a tool
and hand the outcome to :func:`judge`, so that no integration can drift from the core."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agentauth.faults import faulty_service
from tests.server import free_port

TABLE = Path(__file__).resolve().parents[2] / "conformance" / "guard-cases.yaml"
DENIED_PREFIX = "Authorization denied: "
#: the guard's client deadline for a case whose service holds its answer (the others: 10 s)
HOLD_TIMEOUT = 0.3


@dataclass(frozen=True)
class Case:
    name: str
    service: dict[str, Any]
    runs: dict[str, bool]
    denial: dict[str, Any] = field(default_factory=dict)
    #: the warn policies' warnings the guard surfaces (decisions §10)
    warned: list[dict[str, str]] = field(default_factory=list)

    @property
    def timeout(self) -> float:
        """The client time-out to give the guard: only a held answer must outlast it."""
        return HOLD_TIMEOUT if self.service.get("hold") else 10.0


def load() -> list[Case]:
    table = yaml.safe_load(TABLE.read_text(encoding="utf-8"))
    assert table["version"] == 1
    return [Case(**case) for case in table["cases"]]


CASES = load()


def each_case() -> Any:
    """``@each_case()`` parametrizes a test with ``case`` and ``on_error``, by the cases' names."""

    def decorate(test: Any) -> Any:
        test = pytest.mark.parametrize("on_error", ["deny", "allow"])(test)
        return pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])(test)

    return decorate


@contextmanager
def stand_in(case: Case) -> Iterator[str]:
    """The case's service on a loopback port; yields its base URL."""
    service = case.service
    if service.get("closed"):
        yield f"http://127.0.0.1:{free_port()}"
        return
    # the table's text is sent as bytes one for one (latin-1), so "\xFF" is the byte 0xFF
    body = service.get("body", "").encode("latin-1") * int(service.get("body_times", 1))
    with faulty_service(
        service["status"], body, headers=service.get("headers"), hold=bool(service.get("hold"))
    ) as (base, _received):
        yield base


def judge(case: Case, on_error: str, ran: bool, denial: str | None, key: str) -> None:
    """What the guard did: the tool ran (and then there is no denial), or it did not and the
    model got ``denial``, the case's text."""
    assert ran is case.runs[on_error], f"{case.name}: the tool ran: {ran}"
    if ran:
        assert denial is None
        return
    assert denial is not None, f"{case.name}: no denial text"
    assert denial.startswith(DENIED_PREFIX), denial
    assert key not in denial
    assert len(denial) < 2_000
    if "is" in case.denial:
        assert denial == case.denial["is"]
    for part in case.denial.get("has", []):
        assert part in denial, f"{case.name}: {part!r} not in {denial!r}"


def judge_warnings(case: Case, records: list[logging.LogRecord]) -> None:
    """The Python guard's warnings: one WARNING on the ``agentauth`` logger for each of the
    case's ``warned`` (naming its policy and reason), and no other."""
    logged = [
        r.getMessage() for r in records if r.name == "agentauth" and r.levelno == logging.WARNING
    ]
    assert len(logged) == len(case.warned), f"{case.name}: {logged}"
    for message, wanted in zip(logged, case.warned, strict=True):
        assert wanted["policyId"] in message, message
        assert wanted["reason"] in message, message
        assert f"would have {wanted['result']}" in message, message
