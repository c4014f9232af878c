"""A policy repository as desired state: its files loaded and checked one by one
(``controller.load``), then checked as a whole (names, references, ids, unreachable rules) and
turned into the agents and policies it declares, with their stable ids.

Called by every verb that reads a repository: validate, plan, diff, apply, test, watch, sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.cache import DocumentCache, paused_gc
from controller.lint import LintPolicy, shadow_message, shadowed_rules
from controller.load import Document, LoadedFile, SourceFile
from controller.references import check_tests
from core.domain import ids
from schemas import Problem

#: ``--workspace`` when none is given, for the database and for derived ids alike
DEFAULT_WORKSPACE = "default"


@dataclass(frozen=True)
class DesiredAgent:
    id: str
    name: str
    description: str | None
    status: str | None  # None: the repository does not manage the status
    document: Document


@dataclass(frozen=True)
class DesiredPolicy:
    id: str
    name: str
    agent_id: str
    agent: str  # the agent's name
    rules: list[Any]
    priority: int
    enabled: bool
    mode: str  # enforce, warn or shadow (decisions §10)
    document: Document


@dataclass(frozen=True)
class Repo:
    """What a repository declares, and everything wrong with it (errors and warnings)."""

    workspace_id: str
    agents: dict[str, DesiredAgent]  # by name
    policies: dict[str, DesiredPolicy]  # by name
    tests: tuple[Document, ...]
    problems: tuple[Problem, ...]
    by_agent: dict[str, list[DesiredPolicy]] = field(default_factory=dict, repr=False)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity != "error"]

    def policies_of(self, agent: str) -> list[DesiredPolicy]:
        return list(self.by_agent.get(agent, ()))


def object_id(workspace_id: str, kind: str, name: str, pinned: str | None = None) -> str:
    """A git-managed object's id: pinned by ``metadata.id``, else derived from workspace, kind
    and name, so every database the repository is applied to gets the same ids."""
    return pinned or ids.stable_id(workspace_id, kind, name)


def load_repo(
    files: Sequence[SourceFile],
    workspace: str = DEFAULT_WORKSPACE,
    cache: DocumentCache | None = None,
) -> Repo:
    """The repository made of ``files``; nothing here touches a database or the disk, except
    the cache's own file."""
    with paused_gc():
        return _load_repo(files, workspace, cache if cache is not None else DocumentCache(None))


def _load_repo(files: Sequence[SourceFile], workspace: str, own_cache: DocumentCache) -> Repo:
    loaded: list[LoadedFile] = own_cache.load_all(files)
    own_cache.keep_only(files)
    own_cache.save()
    workspace_id = ids.workspace_id(workspace)
    problems: list[Problem] = [p for f in loaded for p in f.problems]
    documents = [d for f in loaded for d in _sound_documents(f)]
    by_kind = _unique_by_kind(documents, problems)
    agents = {
        doc.name: DesiredAgent(
            object_id(workspace_id, "Agent", doc.name, doc.pinned_id),
            doc.name,
            doc.spec.get("description"),
            doc.spec.get("status"),
            doc,
        )
        for doc in by_kind["Agent"]
    }
    policies: dict[str, DesiredPolicy] = {}
    for doc in by_kind["Policy"]:
        agent = agents.get(doc.spec["agent"])
        if agent is None:
            problems.append(_unknown_agent(doc, agents, set(_names(loaded, "Agent"))))
            continue
        policies[doc.name] = DesiredPolicy(
            object_id(workspace_id, "Policy", doc.name, doc.pinned_id),
            doc.name,
            agent.id,
            agent.name,
            doc.spec["rules"],
            int(doc.spec.get("priority", 0)),
            bool(doc.spec.get("enabled", True)),
            str(doc.spec.get("mode", "enforce")),
            doc,
        )
    tests = tuple(by_kind["PolicyTest"])
    problems += check_tests(
        tests,
        loaded,
        {name: agent.document for name, agent in agents.items()},
        {name: policy.document for name, policy in policies.items()},
    )
    problems += _duplicate_ids(list(agents.values()) + list(policies.values()))
    by_agent: dict[str, list[DesiredPolicy]] = {}
    for policy in policies.values():
        by_agent.setdefault(policy.agent, []).append(policy)
    problems += _shadows(by_agent)
    return Repo(workspace_id, agents, policies, tests, tuple(sorted(set(problems))), by_agent)


def _sound_documents(loaded: LoadedFile) -> list[Document]:
    """The file's documents without errors of their own (nothing is built from the others).
    A problem belongs to the document whose lines hold it."""
    error_lines = [p.line or 0 for p in loaded.problems if p.severity == "error"]
    sound = []
    for index, document in enumerate(loaded.documents):
        following = loaded.documents[index + 1].line if index + 1 < len(loaded.documents) else None
        if not any(
            line >= document.line and (following is None or line < following)
            for line in error_lines
        ):
            sound.append(document)
    return sound


def _names(loaded: list[LoadedFile], kind: str) -> list[str]:
    """Names declared for ``kind`` by any document, broken ones included (so a policy naming
    an agent whose file has an error is not also reported as naming an unknown agent)."""
    out = []
    for f in loaded:
        for d in f.documents:
            metadata = d.body.get("metadata")
            if d.body.get("kind") == kind and isinstance(metadata, dict):
                name = metadata.get("name")
                if isinstance(name, str):
                    out.append(name)
    return out


def _unique_by_kind(
    documents: list[Document], problems: list[Problem]
) -> dict[str, list[Document]]:
    out: dict[str, list[Document]] = {"Agent": [], "Policy": [], "PolicyTest": []}
    first: dict[tuple[str, str], Document] = {}
    for doc in documents:
        key = (doc.kind, doc.name)
        if key in first:
            seen = first[key]
            problems.append(
                doc.problem(
                    "metadata.name",
                    f"duplicate {doc.kind} name '{doc.name}' (first declared at "
                    f"{seen.file}:{seen.locate('metadata.name')[0]})",
                )
            )
            continue
        first[key] = doc
        out[doc.kind].append(doc)
    return out


def _unknown_agent(doc: Document, agents: dict[str, DesiredAgent], declared: set[str]) -> Problem:
    name = doc.spec["agent"]
    if name in declared:  # its Agent document is broken and already reported
        return doc.problem("spec.agent", f"agent '{name}' has errors of its own", "error")
    return doc.problem("spec.agent", f"no Agent document declares '{name}'")


def _duplicate_ids(objects: Sequence[DesiredAgent | DesiredPolicy]) -> list[Problem]:
    seen: dict[str, DesiredAgent | DesiredPolicy] = {}
    out = []
    for obj in objects:
        if obj.id in seen:
            other = seen[obj.id]
            out.append(
                obj.document.problem(
                    "metadata.id",
                    f"id {obj.id} is also the id of {other.document.kind} '{other.name}'",
                )
            )
        else:
            seen[obj.id] = obj
    return out


def _shadows(by_agent: dict[str, list[DesiredPolicy]]) -> list[Problem]:
    out = []
    for policies in by_agent.values():
        own = {p.name: p for p in policies}
        lint = [LintPolicy(p.name, p.priority, p.enabled, p.rules, p.mode) for p in own.values()]
        for shadow in shadowed_rules(lint):
            doc = own[shadow.policy].document
            out.append(
                doc.problem(f"spec.rules[{shadow.rule_index}]", shadow_message(shadow), "warning")
            )
    return out
