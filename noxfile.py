"""Environments of their own, for libraries two majors of which cannot share one with the main
suite's (``requirements/test.txt``): each session installs its lock (with hashes, as the main
suite does) and runs the tests of that line. ``.ci/run`` runs every session.

    .venv/bin/nox -s mcp2      # the guard's adapters on mcp 2.x and fastmcp 4.x (the main
                               # suite pins mcp 1.x)
    .venv/bin/nox -s frameworks  # the agent frameworks' integrations
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True


def _install(session: nox.Session, lock: str) -> None:
    session.install("-q", "--require-hashes", "-r", lock)
    session.install("-q", "--no-deps", "--no-build-isolation", "-e", ".")


@nox.session(name="mcp2")
def mcp2(session: nox.Session) -> None:
    """mcp 2.x (MCPServer, the low-level Server) and fastmcp 4.x, guarded
    (tests/agentauth/mcp2)."""
    _install(session, "requirements/mcp2.txt")
    session.run("python", "-m", "pytest", "-q", "tests/agentauth/mcp2", *session.posargs)


@nox.session(name="frameworks")
def frameworks(session: nox.Session) -> None:
    """The agent frameworks' integrations (tests/agentauth/frameworks)."""
    _install(session, "requirements/frameworks.txt")
    session.run("python", "-m", "pytest", "-q", "tests/agentauth/frameworks", *session.posargs)
