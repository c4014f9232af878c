"""What PolicyTest documents name, checked against what the repository declares: the agent of
each test, and the policy each case expects to decide.

A test that depends on an invalid document (one with errors of its own, which builds nothing)
is not checked, and says so in one note instead of an error per case: the whole test when its
agent, or one of its agent's policies, is invalid (its results would be meaningless), else the
cases that name an invalid policy. The invalid document's own problems are reported where it
is. Called by ``controller.repo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.load import Document, LoadedFile
from schemas import Problem


@dataclass(frozen=True)
class _Declared:
    """What the repository declares: the agents and policies built, and what the invalid
    documents declare as far as it can be read."""

    agents: Mapping[str, Document]  # built, by name
    policies_of: dict[str, set[str]]  # the names of the policies built, by agent
    policies: set[str]  # the names of all policies built
    invalid_agents: dict[str, str]  # the name of an agent that was not built -> its file
    invalid_policies: list[tuple[str, str, str | None]]  # (name, file, agent), not built
    unreadable: list[str]  # files with a document nothing could be read from, not even a name


def check_tests(
    tests: Sequence[Document],
    loaded: Sequence[LoadedFile],
    agents: Mapping[str, Document],
    policies: Mapping[str, Document],
) -> list[Problem]:
    """Errors for names nothing declares, notes for what was not checked. ``agents`` and
    ``policies`` are the documents built, by name."""
    declared = _declared(loaded, agents, policies)
    return [problem for test in tests for problem in _check_test(test, declared)]


def _declared(
    loaded: Sequence[LoadedFile], agents: Mapping[str, Document], policies: Mapping[str, Document]
) -> _Declared:
    policies_of: dict[str, set[str]] = {}
    for policy, document in policies.items():
        policies_of.setdefault(document.spec["agent"], set()).add(policy)
    invalid_agents: dict[str, str] = {}
    invalid_policies: list[tuple[str, str, str | None]] = []
    for f in loaded:
        for d in f.documents:
            kind, metadata, spec = d.body.get("kind"), d.body.get("metadata"), d.body.get("spec")
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str):
                continue
            if kind == "Agent" and name not in agents:
                invalid_agents.setdefault(name, d.file)
            elif kind == "Policy" and policies.get(name) is not d:  # duplicates included
                agent = spec.get("agent") if isinstance(spec, dict) else None
                invalid_policies.append((name, d.file, agent if isinstance(agent, str) else None))
    # the loader's own problems are at "$": YAML it could not read, or a document not a mapping
    unreadable = [
        f.path for f in loaded if any(p.path == "$" and p.severity == "error" for p in f.problems)
    ]
    return _Declared(
        agents, policies_of, set(policies), invalid_agents, invalid_policies, unreadable
    )


#: the calls one PolicyTest may make, its cases' and their ``before`` calls together: a
#: repository is input, and a pull request must not keep its CI evaluating for hours
MAX_TEST_CALLS = 100_000


def _check_test(test: Document, declared: _Declared) -> list[Problem]:
    agent, cases = test.spec["agent"], test.spec["cases"]
    calls = sum(
        1 + sum(earlier.get("times", 1) for earlier in case.get("before") or ()) for case in cases
    )
    if calls > MAX_TEST_CALLS:
        message = (
            f"makes {calls:,} calls (its cases and their before calls); "
            f"a PolicyTest makes at most {MAX_TEST_CALLS:,}"
        )
        return [test.problem("spec.cases", message)]
    whole = _why_test_not_checked(agent, declared)
    if whole is not None:
        return [_not_checked(test, len(cases), whole)]
    if agent not in declared.agents:
        return [test.problem("spec.agent", f"no Agent document declares '{agent}'")]
    own = declared.policies_of.get(agent, set())
    out: list[Problem] = []
    skipped: dict[str, int] = {}  # cases not checked, by why
    for index, case in enumerate(cases):
        expected = case.get("policy")
        if expected is None or expected in own:
            continue
        why = None if expected in declared.policies else _why_policy_unknown(expected, declared)
        if why is None:
            message = f"agent '{agent}' has no policy named '{expected}'"
            out.append(test.problem(f"spec.cases[{index}].policy", message))
        else:
            skipped[why] = skipped.get(why, 0) + 1
    return out + [_not_checked(test, count, why) for why, count in skipped.items()]


def _why_test_not_checked(agent: str, declared: _Declared) -> str | None:
    if agent in declared.invalid_agents:
        return f"agent '{agent}' ({declared.invalid_agents[agent]}) is invalid"
    if agent not in declared.agents:  # an error of the test, unless it may be in what was unread
        if not declared.unreadable:
            return None
        return f"no document declares agent '{agent}', and {_unreadable(declared)}"
    incomplete = [(name, file) for name, file, owner in declared.invalid_policies if owner == agent]
    if not incomplete:
        return None
    listed = ", ".join(f"'{name}' ({file})" for name, file in incomplete)
    if len(incomplete) == 1:
        return f"policy {listed} of agent '{agent}' is invalid"
    return f"policies {listed} of agent '{agent}' are invalid"


def _why_policy_unknown(name: str, declared: _Declared) -> str | None:
    files = sorted({file for policy, file, _ in declared.invalid_policies if policy == name})
    if files:
        return f"policy '{name}' ({', '.join(files)}) is invalid"
    if declared.unreadable:
        return f"no document declares policy '{name}', and {_unreadable(declared)}"
    return None


def _unreadable(declared: _Declared) -> str:
    files = declared.unreadable
    if len(files) == 1:
        return f"{files[0]} could not be read"
    return f"{len(files)} files could not be read ({', '.join(files)})"


def _not_checked(test: Document, count: int, why: str) -> Problem:
    """One note, at the test's first line, for ``count`` of its cases."""
    message = f"{count} case(s) not checked: {why}"
    return Problem(test.file, test.line, "spec.cases", message, test.column, "warning")
