"""``agentauth test DIR``: PolicyTest documents run offline through the server's engine.

The repositories are real files under ``data/policytests`` (see its README); the CLI runs the
way a user runs it, through click's runner, and the JUnit report is parsed back.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from controller.cli import main
from controller.load import Document
from controller.repo import load_repo
from controller.sources import read_files
from controller.tests import TestReport, run_tests
from tests.controller.conftest import agent_doc, write_files

DATA = Path(__file__).parent / "data" / "policytests"
PASSING, FAILING, INVALID = DATA / "passing", DATA / "failing", DATA / "invalid"


@pytest.fixture
def run(tmp_path: Path):
    runner = CliRunner()
    env = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}

    def invoke(*args: object) -> Result:
        return runner.invoke(main, ["test", *map(str, args)], env=env, catch_exceptions=False)

    return invoke


def _report(directory: Path) -> TestReport:
    return run_tests(load_repo(read_files(directory)))


def _outcomes(report: TestReport) -> dict[str, list[bool]]:
    return {d.name: [c.actual_allowed for c in d.cases] for d in report.documents}


def _parse(path: Path) -> ET.Element:
    return ET.parse(path).getroot()  # noqa: S314  (our own output)


# ----------------------------------------------------------------------------- passing repo


def test_a_passing_repository_exits_0_and_prints_only_the_summary(run):
    result = run(PASSING)
    assert result.exit_code == 0, result.output
    assert result.stdout == "17 passed, 0 failed (11 test documents)\n"


def test_verbose_prints_passing_cases_too(run):
    result = run(PASSING, "-v")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("PASS ")]) == 17
    assert (
        'PASS tests/finance.yaml:20 finance-agent "case 3: payments.cancel": denied '
        "(default deny: no policy allows tool 'payments.cancel')"
    ) in lines


def test_a_second_run_from_the_document_cache_gives_the_same_output(run):
    assert run(PASSING, "-v").stdout == run(PASSING, "-v").stdout


def test_rate_limit_cases_share_one_counter_set_per_document_in_order():
    report = _report(PASSING)
    outcomes = _outcomes(report)
    # allowed, over the amount limit (does not consume), allowed, third in the hour denied
    assert outcomes["finance-refund-rate-limit"] == [True, False, True, False]
    assert outcomes["finance-fresh-counters"] == [True]  # a new document, fresh counters
    limited = next(d for d in report.documents if d.name == "finance-refund-rate-limit")
    last = limited.cases[-1]
    assert last.actual_policy == "refunds"
    assert last.actual_reason.endswith("retry after 2700 seconds")


def test_time_windows_follow_berlin_across_the_change_to_summer_time():
    outcomes = _outcomes(_report(PASSING))
    assert outcomes["dst-saturday-winter-time"] == [False]  # 07:30Z = 08:30 CET
    assert outcomes["dst-sunday-summer-time"] == [True]  # 07:30Z = 09:30 CEST
    assert outcomes["dst-sunday-offset-form"] == [True]  # 16:59:59+02:00
    assert outcomes["dst-skipped-hour"] == [False]  # 01:30Z = 03:30 CEST, 02:xx never happens
    assert outcomes["dst-sunday-evening"] == [False]  # 15:30Z = 17:30 CEST


def test_agent_status_in_the_file_denies_before_policies_are_read():
    report = _report(PASSING)
    by_agent = {d.agent: d.cases for d in report.documents}
    for agent, status in (("support-bot", "suspended"), ("archive-bot", "revoked")):
        (case,) = by_agent[agent]
        assert not case.actual_allowed
        assert case.actual_policy is None
        assert case.actual_reason == f"agent is {status}"
    assert [c.actual_allowed for c in by_agent["ops-agent"]] == [True, False]  # active: policies


def test_junit_of_a_passing_repository(run, tmp_path):
    junit = tmp_path / "report.xml"
    assert run(PASSING, "--junit", junit).exit_code == 0
    root = _parse(junit)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("17", "0", "0")
    suites = root.findall("testsuite")
    assert len(suites) == 11
    first = next(s for s in suites if s.get("name") == "tests/finance.yaml::finance-basics")
    cases = first.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "reads an invoice",
        "changing a payee is denied by the guardrails",
        "case 3: payments.cancel",
    ]
    assert {c.get("classname") for c in cases} == {"finance-agent"}
    assert all(float(c.get("time", "x")) >= 0 for c in cases)
    assert not root.findall(".//failure")


# ----------------------------------------------------------------------------- failing repo

FAILURES = [
    'FAIL tests/mistakes.yaml:13 finance-agent "wrong allowed": expected allowed, got denied '
    "by policy 'guardrails' (reason: denied by policy 'guardrails' rule 0 (tool_denylist): "
    "tool 'payments.delete_refund' is denied)",
    'FAIL tests/mistakes.yaml:16 finance-agent "wrong policy": expected allowed by policy '
    "'refund-limits', got allowed by policy 'refunds' (reason: allowed by policy 'refunds' "
    "rule 0 (tool_allowlist))",
    'FAIL tests/mistakes.yaml:20 finance-agent "wrong reason": expected denied by policy '
    "'refund-limits' with a reason containing 'must be at most 100', got denied by policy "
    "'refund-limits' (reason: denied by policy 'refund-limits' rule 0 (parameter_constraint): "
    "parameter 'amount' must be at most 500)",
    'FAIL tests/mistakes.yaml:26 finance-agent "a policy is expected but the default deny '
    "decides\": expected denied by policy 'guardrails', got denied, no policy decided "
    "(reason: default deny: no policy allows tool 'payments.cancel')",
    'FAIL tests/mistakes.yaml:35 finance-agent "second refund of the minute is expected to '
    "pass\": expected allowed by policy 'refunds', got denied by policy 'refund-limits' "
    "(reason: denied by policy 'refund-limits' rule 1 (rate_limit): rate limit of 1 calls per "
    "60 seconds exceeded; retry after 30 seconds)",
    # a name or tool name holds no control character (the schema refuses it); a reason may
    'FAIL tests/mistakes.yaml:40 finance-agent "quotes " & <markup> \'in\' names": expected '
    "allowed with a reason containing 'evil\\x01tool', got denied, no policy decided (reason: "
    "default deny: no policy allows tool 'evil.tool')",
    'FAIL tests/mistakes.yaml:53 support-bot "the policy would allow it, the status does '
    "not\": expected allowed by policy 'support-tickets', got denied, no policy decided "
    "(reason: agent is suspended)",
]


def test_a_failing_repository_prints_each_failure_and_exits_1(run):
    result = run(FAILING)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [*FAILURES, "2 passed, 7 failed (2 test documents)"]


def test_failures_name_what_did_not_match():
    report = _report(FAILING)
    mismatches = {c.name: c.mismatches for d in report.documents for c in d.cases}
    assert mismatches["reads a refund"] == ()
    assert mismatches["wrong allowed"] == ("allowed",)
    assert mismatches["wrong policy"] == ("policy",)
    assert mismatches["wrong reason"] == ("reason",)
    assert mismatches["a policy is expected but the default deny decides"] == ("policy",)
    assert mismatches["second refund of the minute is expected to pass"] == ("allowed", "policy")
    assert (report.passed, report.failed, report.ok) == (2, 7, False)


def test_junit_of_a_failing_repository_parses_back(run, tmp_path):
    junit = tmp_path / "out" / "junit.xml"
    junit.parent.mkdir()
    assert run(FAILING, "--junit", junit).exit_code == 1
    assert junit.read_bytes().startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    root = _parse(junit)
    assert (root.get("tests"), root.get("failures")) == ("9", "7")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {
        "tests/mistakes.yaml::finance-mistakes",
        "tests/mistakes.yaml::support-suspended",
    }
    mistakes = suites["tests/mistakes.yaml::finance-mistakes"]
    assert (mistakes.get("tests"), mistakes.get("failures")) == ("8", "6")
    cases = mistakes.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "reads a refund",
        "wrong allowed",
        "wrong policy",
        "wrong reason",
        "a policy is expected but the default deny decides",
        "first refund of the minute",
        "second refund of the minute is expected to pass",
        "quotes \" & <markup> 'in' names",  # escaped on the way out, intact on the way back
    ]
    failed = [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]
    assert len(failed) == 7
    wrong_policy = cases[2].find("failure")
    assert wrong_policy is not None
    assert wrong_policy.get("message", "").startswith(
        "expected allowed by policy 'refund-limits', got allowed by policy 'refunds'"
    )
    assert cases[2].get("line") == "16"


def test_junit_holds_characters_xml_cannot_as_escapes(run, tmp_path):
    junit = tmp_path / "junit.xml"
    run(FAILING, "--junit", junit)
    assert b"\x01" not in junit.read_bytes()
    failure = _parse(junit).find(".//testcase[@line='40']/failure")
    assert failure is not None
    assert "a reason containing 'evil\\x01tool'" in failure.get("message", "")


def test_an_unwritable_junit_file_is_an_error(run, tmp_path):
    result = run(PASSING, "--junit", tmp_path / "missing" / "junit.xml")
    assert result.exit_code == 1
    assert "error: cannot write" in result.stderr


# --------------------------------------------------------------------------- invalid repos


def test_a_schema_error_is_printed_with_its_location_and_nothing_runs(run, tmp_path):
    junit = tmp_path / "junit.xml"
    result = run(INVALID, "--junit", junit)
    assert result.exit_code == 1
    assert "repo.yaml:16:7: spec.cases[0].allowed: must be a boolean" in result.stdout
    assert "error: 1 problem(s) in the repository" in result.stderr
    assert "passed" not in result.output
    assert not junit.exists()


def test_a_test_of_an_unknown_agent_or_policy_is_refused(run, tmp_path):
    write_files(
        tmp_path,
        {
            "agent.yaml": agent_doc("a"),
            "test.yaml": """
            apiVersion: agentauth/v1
            kind: PolicyTest
            metadata: {name: t}
            spec:
              agent: a
              now: "2026-03-17T10:15:00Z"
              cases:
                - {tool: x, allowed: false, policy: nope}
            ---
            apiVersion: agentauth/v1
            kind: PolicyTest
            metadata: {name: u}
            spec:
              agent: ghost
              now: "2026-03-17T10:15:00Z"
              cases:
                - {tool: x, allowed: false}
            """,
        },
    )
    result = run(tmp_path)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "test.yaml:8:33: spec.cases[0].policy: agent 'a' has no policy named 'nope'",
        "test.yaml:14:3: spec.agent: no Agent document declares 'ghost'",
    ]


# ------------------------------------------------- tests that depend on an invalid document

EXAMPLE = Path(__file__).parents[2] / "policies_repo_example"
REFUNDS = "policies/finance-agent/finance-refunds.yaml"


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """The example repository, to break one file of."""
    return Path(shutil.copytree(EXAMPLE, tmp_path / "example"))


def _break(repo: Path, path: str, old: str, new: str) -> None:
    text = (repo / path).read_text(encoding="utf-8")
    assert old in text
    (repo / path).write_text(text.replace(old, new, 1), encoding="utf-8")


def _finance_tests() -> list[tuple[Document, list[dict]]]:
    """The example's PolicyTest documents of finance-agent, with the cases that name
    finance-refunds."""
    intact = load_repo(read_files(EXAMPLE))
    assert not intact.errors
    finance = [t for t in intact.tests if t.spec["agent"] == "finance-agent"]
    assert len(finance) > 1
    return [
        (t, [c for c in t.spec["cases"] if c.get("policy") == "finance-refunds"]) for t in finance
    ]


def _lines(result: Result) -> list[str]:
    return result.stdout.splitlines()


def _validate(directory: Path, tmp_path: Path) -> Result:
    env = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    return CliRunner().invoke(main, ["validate", str(directory)], env=env, catch_exceptions=False)


def test_an_invalid_policy_skips_each_test_of_its_agent_with_one_note(run, example, tmp_path):
    """Instead of an error for every case naming the policy: the policy's own problem, and
    one note per PolicyTest document of its agent (the agent's policy set is incomplete, so
    every result would be meaningless). The other agents' tests are not touched."""
    _break(example, REFUNDS, "maxCalls: 20", "maxCalls: -5")
    expected = [
        f"{REFUNDS}:27:9: spec.rules[2].rateLimit.maxCalls: must be at least 1",
        *(
            f"{t.file}:{t.line}:{t.column}: spec.cases: {len(t.spec['cases'])} case(s) not "
            f"checked: policy 'finance-refunds' ({REFUNDS}) of agent 'finance-agent' is invalid "
            "(warning)"
            for t, _ in _finance_tests()
        ),
    ]

    validated = _validate(example, tmp_path)
    assert validated.exit_code == 1
    assert _lines(validated) == expected
    assert f"1 error(s), {len(expected) - 1} warning(s)" in validated.stderr

    tested = run(example)
    assert tested.exit_code == 1
    assert _lines(tested) == expected
    assert "error: 1 problem(s) in the repository" in tested.stderr
    assert "passed" not in tested.output


def test_an_unreadable_policy_file_skips_the_cases_naming_what_it_may_declare(
    run, example, tmp_path
):
    """A file that is not YAML declares no name anyone can read: the cases naming a policy
    no other file declares are not checked, one note per test document that has any."""
    _break(example, REFUNDS, "  rules:", "  rules: [")
    validated = _validate(example, tmp_path)
    assert validated.exit_code == 1
    lines = _lines(validated)
    assert lines[0].startswith(f"{REFUNDS}:12:5: $: is not valid YAML:")
    assert lines[1:] == [
        f"{t.file}:{t.line}:{t.column}: spec.cases: {len(naming)} case(s) not checked: no "
        f"document declares policy 'finance-refunds', and {REFUNDS} could not be read (warning)"
        for t, naming in _finance_tests()
        if naming
    ]
    assert "has no policy named" not in validated.output
    assert _lines(run(example)) == lines


def test_a_policy_of_another_agent_skips_only_the_cases_naming_it(example, tmp_path):
    """A policy whose agent is misspelt is invalid, but whose policy set it belongs to is
    unknown: the cases naming it are skipped, every other case is still checked."""
    _break(example, REFUNDS, "agent: finance-agent", "agent: finanse-agent")
    _break(example, "tests/support-bot.yaml", "policy: support-tickets", "policy: support-tikets")
    lines = _lines(_validate(example, tmp_path))
    assert f"{REFUNDS}:9:3: spec.agent: no Agent document declares 'finanse-agent'" in lines
    errors = [line for line in lines if "has no policy named" in line]
    assert len(errors) == 1
    assert "agent 'support-bot' has no policy named 'support-tikets'" in errors[0]
    notes = [line for line in lines if "not checked" in line]
    assert notes == [
        f"{t.file}:{t.line}:{t.column}: spec.cases: {len(naming)} case(s) not checked: "
        f"policy 'finance-refunds' ({REFUNDS}) is invalid (warning)"
        for t, naming in _finance_tests()
        if naming
    ]


def test_an_invalid_agent_skips_its_tests_with_one_note_each(example, tmp_path):
    _break(
        example, "agents/finance-agent.yaml", "name: finance-agent", "name: finance-agent\n  x: 1"
    )
    lines = _lines(_validate(example, tmp_path))
    notes = [line for line in lines if "tests/" in line]
    assert notes == [
        f"{t.file}:{t.line}:{t.column}: spec.cases: {len(t.spec['cases'])} case(s) not checked: "
        "agent 'finance-agent' (agents/finance-agent.yaml) is invalid (warning)"
        for t, _ in _finance_tests()
    ]


def test_run_tests_refuses_a_repository_with_errors():
    with pytest.raises(ValueError, match="has errors"):
        _report(INVALID)


def test_a_repository_without_tests_passes_with_a_warning(run, tmp_path):
    write_files(tmp_path, {"agent.yaml": agent_doc("a")})
    result = run(tmp_path)
    assert result.exit_code == 0
    assert result.stdout == "0 passed, 0 failed (0 test documents)\n"
    assert "warning: no PolicyTest documents" in result.stderr


def test_a_missing_directory_is_an_error(run, tmp_path):
    result = run(tmp_path / "nowhere")
    assert result.exit_code == 1
    assert "is not a directory" in result.stderr


# ----------------------------------------------------------------------------- approvals

APPROVALS_REPO = {
    "agents.yaml": agent_doc("payments-agent"),
    "policies.yaml": """
    apiVersion: agentauth/v1
    kind: Policy
    metadata:
      name: refunds
    spec:
      agent: payments-agent
      rules:
        - type: require_approval
          tools: [payments.refund]
          parameters: {amount: {max: 1000}}
        - type: tool_allowlist
          tools: ["payments.*"]
    """,
    "tests.yaml": """
    apiVersion: agentauth/v1
    kind: PolicyTest
    metadata:
      name: refunds-need-a-human
    spec:
      agent: payments-agent
      now: "2026-03-02T10:00:00Z"
      cases:
        - {name: small refund, tool: payments.refund, parameters: {amount: 20}, outcome: allowed}
        - name: large refund
          tool: payments.refund
          parameters: {amount: 5000}
          outcome: escalated
          policy: refunds
          reason: "must be at most 1000"
        - {name: asked again, tool: payments.refund, parameters: {amount: 5000}, allowed: false}
        - name: both given
          tool: payments.refund
          parameters: {amount: 5000}
          allowed: false
          outcome: escalated
        - {name: wrong outcome, tool: payments.refund, parameters: {amount: 5000}, outcome: denied}
        - {name: wrong allowed, tool: payments.refund, parameters: {amount: 5000}, allowed: true}
    """,
}


def test_cases_may_expect_an_escalation_and_allowed_false_passes_for_one(run, tmp_path):
    write_files(tmp_path, APPROVALS_REPO)
    report = _report(tmp_path)
    (document,) = report.documents
    by_name = {case.name: case for case in document.cases}
    assert [by_name[n].mismatches for n in ("small refund", "large refund")] == [(), ()]
    assert by_name["asked again"].mismatches == ()
    assert by_name["both given"].mismatches == ()
    assert by_name["wrong outcome"].mismatches == ("outcome",)
    assert by_name["wrong allowed"].mismatches == ("allowed",)
    assert by_name["large refund"].actual_outcome == "escalated"
    result = run(tmp_path)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        'FAIL tests.yaml:22 payments-agent "wrong outcome": expected denied, got escalated by '
        "policy 'refunds' (reason: approval required by policy 'refunds' rule 0 "
        "(require_approval): parameter 'amount' must be at most 1000)",
        'FAIL tests.yaml:23 payments-agent "wrong allowed": expected allowed, got escalated by '
        "policy 'refunds' (reason: approval required by policy 'refunds' rule 0 "
        "(require_approval): parameter 'amount' must be at most 1000)",
    ]


def test_a_case_with_neither_allowed_nor_outcome_is_a_validation_error(run, tmp_path):
    files = dict(APPROVALS_REPO)
    files["tests.yaml"] = files["tests.yaml"].replace(", outcome: allowed}", "}")
    write_files(tmp_path, files)
    result = run(tmp_path)
    assert result.exit_code != 0
    assert "a case needs allowed or outcome" in result.output


# ---------------------------------------------------------------------- budgets and sessions

BUDGET_REPO = {
    "agents/refund-bot.yaml": agent_doc("refund-bot"),
    "policies/refunds.yaml": """
        apiVersion: agentauth/v1
        kind: Policy
        metadata:
          name: refunds
        spec:
          agent: refund-bot
          rules:
            - type: budget
              tools: [payments.refund]
              budget: {parameter: amount, max: 1000, windowSeconds: 86400}
            - type: rate_limit
              per: session
              rateLimit: {maxCalls: 2, windowSeconds: 3600}
            - type: tool_allowlist
    """,
}


def write_budget_test(root: Path, cases: list[str]) -> None:
    """BUDGET_REPO and a PolicyTest of ``cases`` (each a YAML flow mapping) under ``root``."""
    listed = "".join(f"\n    - {case}" for case in cases)
    document = (
        "apiVersion: agentauth/v1\nkind: PolicyTest\nmetadata:\n  name: refund-budget\n"
        'spec:\n  agent: refund-bot\n  now: "2026-03-18T15:00:00Z"\n  cases:' + listed + "\n"
    )
    write_files(root, {**BUDGET_REPO, "tests/refunds.yaml": document})


def test_a_case_states_the_calls_made_before_it_for_budgets_and_sessions(run, tmp_path):
    """Five refunds of 300 against a budget of 1,000: the fourth is denied, stated as one case
    with three earlier calls; earlier calls of one session count against its own limit only."""
    write_files(
        tmp_path / "repo",
        {
            **BUDGET_REPO,
            "tests/refunds.yaml": """
                apiVersion: agentauth/v1
                kind: PolicyTest
                metadata:
                  name: refund-budget
                spec:
                  agent: refund-bot
                  now: "2026-03-18T15:00:00Z"
                  cases:
                    - name: the fourth refund of 300
                      tool: payments.refund
                      parameters: {amount: 300}
                      sessionId: chat-1
                      before:
                        - {times: 2}
                        - {sessionId: chat-2}
                      allowed: false
                      reason: "exceeded: 900 spent, this call 300"
                    - name: 100 more fits, in a third session
                      tool: payments.refund
                      parameters: {amount: 100}
                      sessionId: chat-3
                      allowed: true
                    - name: chat-1 made two calls, its limit
                      tool: payments.refund
                      parameters: {amount: 0}
                      sessionId: chat-1
                      allowed: false
                      reason: "rate limit of 2 calls per 3600 seconds per session exceeded"
                    - name: without a session the per-session limit denies
                      tool: payments.refund
                      parameters: {amount: 0}
                      allowed: false
                      reason: "rule 1 (rate_limit): session required"
            """,
        },
    )
    result = run(tmp_path / "repo", "-v")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "4 passed, 0 failed (1 test document)"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("before: [{times: 0}]", "before"),
        ("before: [{amount: 5}]", "before"),
        ('sessionId: ""', "sessionId"),
    ],
)
def test_a_bad_before_or_session_is_a_schema_error_and_nothing_runs(run, tmp_path, case, message):
    write_budget_test(tmp_path / "repo", [f"{{tool: payments.refund, allowed: true, {case}}}"])
    result = run(tmp_path / "repo")
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "passed" not in result.stdout


def test_a_test_making_too_many_calls_is_an_error_and_nothing_runs(run, tmp_path):
    """One line of `before` can stand for 10,000 calls: a PolicyTest is bounded at 100,000
    calls in all, so a pull request cannot keep CI evaluating for hours."""
    before = "[" + ", ".join(["{times: 10000}"] * 10) + "]"
    case = f"{{tool: payments.refund, allowed: true, before: {before}}}"
    write_budget_test(tmp_path / "repo", [case, case])
    result = run(tmp_path / "repo")
    assert result.exit_code == 1, result.output
    assert "makes 200,002 calls" in result.output
    assert "at most 100,000" in result.output
    assert "passed" not in result.stdout
