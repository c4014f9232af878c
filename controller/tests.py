"""The offline policy test runner behind ``agentauth test DIR``: every PolicyTest document of a
repository evaluated by the same engine the server uses (``core.domain.engine.evaluate`` on the
repository's policies compiled by ``controller.impact.compile_desired``), with no database.

Semantics (decisions §5): the clock is fixed at the document's ``now``; one set of in-memory
rate-limit counters per document, shared by its cases in order, so the N+1th call in a window
is denied; an agent whose file sets ``status: suspended | revoked`` is denied every call before
any policy is read, as the server does. No approval is ever granted offline: a call a
require_approval rule sends to a human is escalated (identical calls of a document share its
pending approval). A case passes when ``allowed`` and ``outcome`` match (those given:
``allowed: false`` holds for an escalated call), and, when given, the deciding policy's name
equals ``policy`` and ``reason`` is a substring of the actual reason.

Also the reports of a run: the text lines of failures and passes, the summary, and JUnit XML.
Called by the ``test`` verb of ``controller.cli``. Just over 300 lines: running, the text report
and the JUnit report of one result type.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.impact import compile_desired
from controller.load import Document
from controller.repo import Repo
from core.domain.approvals import MemoryApprovals
from core.domain.clock import isoformat, parse_instant
from core.domain.engine import (
    CompiledPolicy,
    Decision,
    deny_agent_status,
    evaluate,
    settle,
)
from core.domain.limits import MemoryCounters
from core.domain.modes import PolicySet

#: agent statuses that deny every call before policies are read
BLOCKING_STATUSES = ("suspended", "revoked")


@dataclass(frozen=True)
class CaseResult:
    """One case: what was expected, what the engine decided, and which expectations failed
    (``mismatches`` holds ``allowed``, ``outcome``, ``policy`` and/or ``reason``; empty when it
    passed). ``expected_allowed`` and ``expected_outcome`` are None when the case left them
    out."""

    name: str
    tool: str
    line: int
    expected_allowed: bool | None
    actual_allowed: bool
    expected_outcome: str | None
    actual_outcome: str
    expected_policy: str | None
    actual_policy: str | None  # the deciding policy's metadata.name; None: no policy decided
    expected_reason: str | None
    actual_reason: str
    duration: float  # seconds
    mismatches: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.mismatches


@dataclass(frozen=True)
class DocumentResult:
    """One PolicyTest document and its cases, in order."""

    name: str
    file: str
    line: int
    agent: str
    now: datetime
    cases: tuple[CaseResult, ...]

    @property
    def failures(self) -> int:
        return sum(not case.passed for case in self.cases)

    @property
    def duration(self) -> float:
        return sum(case.duration for case in self.cases)


@dataclass(frozen=True)
class TestReport:
    """Every PolicyTest document of a repository, in the repository's order."""

    __test__ = False  # not a pytest class

    documents: tuple[DocumentResult, ...]

    @property
    def passed(self) -> int:
        return sum(len(d.cases) - d.failures for d in self.documents)

    @property
    def failed(self) -> int:
        return sum(d.failures for d in self.documents)

    @property
    def ok(self) -> bool:
        return self.failed == 0


# ------------------------------------------------------------------------------------ running


def run_tests(repo: Repo) -> TestReport:
    """Run every PolicyTest of ``repo``, which must have no errors (``repo.errors`` empty)."""
    if repo.errors:
        raise ValueError("the repository has errors; validate it before running its tests")
    compiled: dict[str, list[CompiledPolicy]] = {}
    names = {policy.id: policy.name for policy in repo.policies.values()}
    results = []
    for document in repo.tests:
        agent = document.spec["agent"]
        if agent not in compiled:
            # the real decision's: warn and shadow policies decide none
            compiled[agent] = list(PolicySet.of(compile_desired(repo.policies_of(agent))).enforced)
        status = repo.agents[agent].status
        blocked = status if status in BLOCKING_STATUSES else None
        results.append(_run_document(document, compiled[agent], blocked, names))
    return TestReport(tuple(results))


def _run_document(
    document: Document,
    policies: list[CompiledPolicy],
    blocked: str | None,
    names: dict[str, str],
) -> DocumentResult:
    now = parse_instant(document.spec["now"])
    # one of each per document: its cases share the rate-limit and budget windows and the
    # pending approvals
    counters, approvals = MemoryCounters(), MemoryApprovals()

    def call(tool: str, parameters: dict[str, Any], session_id: str | None) -> Decision:
        evaluated = evaluate(policies, tool, parameters, now, session_id)
        return settle(evaluated, counters, approvals.for_call(tool, parameters))

    cases = []
    for index, case in enumerate(document.spec["cases"]):
        started = time.perf_counter()
        if blocked is not None:
            decision = deny_agent_status(blocked)
        else:
            tool, parameters = case["tool"], case.get("parameters") or {}
            session_id = case.get("sessionId")
            for earlier in case.get("before") or ():  # counted, not judged
                for _ in range(earlier.get("times", 1)):
                    call(
                        earlier.get("tool", tool),
                        earlier.get("parameters", parameters),
                        earlier.get("sessionId", session_id),
                    )
            decision = call(tool, parameters, session_id)
        duration = time.perf_counter() - started
        line = document.locate(f"spec.cases[{index}]")[0]
        cases.append(_judge(index, case, decision, names, line, duration))
    return DocumentResult(
        document.name, document.file, document.line, document.spec["agent"], now, tuple(cases)
    )


def _judge(
    index: int,
    case: dict[str, Any],
    decision: Decision,
    names: dict[str, str],
    line: int,
    duration: float,
) -> CaseResult:
    actual_policy = None if decision.policy_id is None else names.get(decision.policy_id)
    expected_policy, expected_reason = case.get("policy"), case.get("reason")
    expected_allowed, expected_outcome = case.get("allowed"), case.get("outcome")
    mismatches = []
    if expected_allowed is not None and decision.allowed != expected_allowed:
        mismatches.append("allowed")
    if expected_outcome is not None and decision.outcome != expected_outcome:
        mismatches.append("outcome")
    if expected_policy is not None and actual_policy != expected_policy:
        mismatches.append("policy")
    if expected_reason is not None and expected_reason not in decision.reason:
        mismatches.append("reason")
    return CaseResult(
        name=case_name(index, case),
        tool=case["tool"],
        line=line,
        expected_allowed=expected_allowed,
        actual_allowed=decision.allowed,
        expected_outcome=expected_outcome,
        actual_outcome=decision.outcome,
        expected_policy=expected_policy,
        actual_policy=actual_policy,
        expected_reason=expected_reason,
        actual_reason=decision.reason,
        duration=duration,
        mismatches=tuple(mismatches),
    )


def case_name(index: int, case: dict[str, Any]) -> str:
    """The case's ``name``, else ``case N: TOOL`` (N counting from 1)."""
    name = case.get("name")
    return str(name) if name else f"case {index + 1}: {case['tool']}"


# ------------------------------------------------------------------------------------- text

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    """A character as Python writes it in a string literal: ``\\x01``, ``\\n``, ``\\ud800``."""
    return ascii(match.group())[1:-1]


def _expected_outcome(case: CaseResult) -> str:
    if case.expected_outcome is not None:
        return case.expected_outcome
    return "allowed" if case.expected_allowed else "denied"  # allowed: false, escalated too


def expectation(case: CaseResult) -> str:
    """``expected denied by policy 'p' with a reason containing '...', got allowed by policy
    'q' (reason: ...)``."""
    expected = f"expected {_expected_outcome(case)}"
    if case.expected_policy is not None:
        expected += f" by policy '{case.expected_policy}'"
    if case.expected_reason is not None:
        expected += f" with a reason containing '{case.expected_reason}'"
    got = f"got {case.actual_outcome}"
    got += f" by policy '{case.actual_policy}'" if case.actual_policy else ", no policy decided"
    return f"{expected}, {got} (reason: {case.actual_reason})"


def case_line(document: DocumentResult, case: CaseResult) -> str:
    """``FAIL file:line agent "case name": expected ..., got ...`` (or ``PASS ...``)."""
    where = f'{document.file}:{case.line} {document.agent} "{case.name}"'
    if case.passed:
        line = f"PASS {where}: {case.actual_outcome} ({case.actual_reason})"
    else:
        line = f"FAIL {where}: {expectation(case)}"
    return _CONTROL.sub(_escaped, line)  # names and tools from a file never drive the terminal


def summary(report: TestReport) -> str:
    documents = len(report.documents)
    noun = "test document" if documents == 1 else "test documents"
    return f"{report.passed} passed, {report.failed} failed ({documents} {noun})"


# ------------------------------------------------------------------------------------ JUnit

# characters XML 1.0 cannot hold at all, not even as a character reference
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """``text`` with what XML 1.0 cannot hold written as ``\\xNN`` / ``\\uNNNN``;
    ElementTree escapes the rest (``&``, ``<``, quotes) itself."""
    return _NOT_XML.sub(_escaped, text)


def junit_xml(report: TestReport) -> bytes:
    """The report as JUnit XML: testsuites > one testsuite per PolicyTest document (named
    ``file::metadata.name``) > one testcase per case (classname: the agent)."""
    root = ET.Element("testsuites", name="agentauth test")
    root.attrib.update(_counts(report.documents, report.failed))
    for document in report.documents:
        suite = ET.SubElement(
            root, "testsuite", name=_xml_text(f"{document.file}::{document.name}")
        )
        suite.attrib.update(_counts([document], document.failures))
        suite.set("file", _xml_text(document.file))
        properties = ET.SubElement(suite, "properties")
        for key, value in (("agent", document.agent), ("now", isoformat(document.now))):
            ET.SubElement(properties, "property", name=key, value=_xml_text(value))
        for case in document.cases:
            _junit_case(suite, document, case)
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def _counts(documents: Sequence[DocumentResult], failed: int) -> dict[str, str]:
    return {
        "tests": str(sum(len(d.cases) for d in documents)),
        "failures": str(failed),
        "errors": "0",
        "skipped": "0",
        "time": f"{sum(d.duration for d in documents):.6f}",
    }


def _junit_case(suite: ET.Element, document: DocumentResult, case: CaseResult) -> None:
    element = ET.SubElement(suite, "testcase", name=_xml_text(case.name))
    element.set("classname", _xml_text(document.agent))
    element.set("time", f"{case.duration:.6f}")
    element.set("file", _xml_text(document.file))
    element.set("line", str(case.line))
    if case.passed:
        return
    failure = ET.SubElement(element, "failure")
    failure.set("message", _xml_text(expectation(case)))
    failure.set("type", "PolicyTestFailure")
    failure.text = _xml_text(
        f"{document.file}:{case.line}: tool '{case.tool}' at {isoformat(document.now)}\n"
        f"mismatched: {', '.join(case.mismatches)}\n{expectation(case)}"
    )
