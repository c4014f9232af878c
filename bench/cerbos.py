"""The real Cerbos server, the peer of the HTTP benchmark (:mod:`bench.peer_compare`).

- :func:`ensure_cerbos` installs Cerbos 0.55.0 (:data:`VERSION`) into the bench's own cache
  (``~/.cache/agentauth-bench/cerbos-<version>/``, or under ``$XDG_CACHE_HOME``): the Linux
  binary that the npm package ``@cerbos/cerbos-linux-x64`` ships, pinned with its integrity hash
  by ``bench/cerbos/package-lock.json``. Both files are copied into the cache folder and
  ``npm ci`` runs there, once: a binary already in place that reports the right version is
  used as it is. Never a dependency of the service (not in setup.cfg, not in the root).
- :func:`to_cerbos` translates the in-process comparison's policies
  (:data:`bench.engine_compare.POLICIES`) into one Cerbos resource policy, so both servers
  decide by the same policy.
- :func:`cerbos_server` starts ``cerbos server`` on free loopback ports (HTTP, and gRPC, which
  Cerbos always opens), disk storage on a policy folder, audit on with the file backend (access
  and decision logs, into a file of the work folder), telemetry off; stops it by its PID.

How the translation copes with what Cerbos lacks (the README has the table):

- No priorities: in a resource policy any matching ``EFFECT_DENY`` rule beats every allow. As
  :func:`bench.engine_compare.to_cedar` does, each allowlist rule becomes one ``EFFECT_ALLOW``
  rule whose condition excludes the deny conditions of its own policy and of every
  higher-priority one; each policy's deny condition is written once, as a policy variable
  (``V.deny_<policy>``), so the text grows linearly, not quadratically.
- Globs: CEL has none; a tool pattern becomes an anchored RE2 expression (``*`` is ``.*``, ``?``
  is ``.``) matched with ``matches`` against the resource id (the tool name).
- Regex constraints: CEL's ``matches`` is an unanchored RE2 search, as ours is.
- Types: ``min``/``max`` need ``type(v) == double`` (JSON numbers reach CEL as doubles; a
  string or a boolean fails), ``regex``/``enum`` need ``type(v) == string``; a missing
  parameter fails (``"name" in R.attr.params``).
- Time windows: CEL's ``now()`` with ``getHours(zone)`` and ``getDayOfWeek(zone)`` (Sunday is
  0, as in ``allowedDays``), so Cerbos reads the real clock in each IANA zone, as ours does.
- Rate limits and budgets: Cerbos keeps no counters. They are left out of its policy; ours gets
  them with limits so high that they never refuse (see :mod:`bench.peer_compare`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.engine_compare import deny_condition

VERSION = "0.55.0"
PACKAGE = "@cerbos/cerbos-linux-x64"
#: package.json and package-lock.json (with the integrity hash), committed next to this module
LOCK_FOLDER = Path(__file__).with_name("cerbos")
RESOURCE_KIND = "tool"
ACTION = "call"
PRINCIPAL = "ops-assistant"


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentauth-bench" / f"cerbos-{VERSION}"


def binary_path() -> Path:
    return cache_folder() / "node_modules" / PACKAGE / PACKAGE.rsplit("/", 1)[1]


def installed_version(binary: Path) -> str | None:
    """The version ``binary --version`` reports (its first line), or None."""
    if not binary.is_file():
        return None
    try:
        shown = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = shown.stdout.strip().splitlines()
    return lines[0].strip() if shown.returncode == 0 and lines else None


def ensure_cerbos(report: Any = print) -> Path:
    """The path of the Cerbos binary, installed into the bench's cache with ``npm ci`` from the
    committed lock when it is not there yet."""
    binary = binary_path()
    if installed_version(binary) == VERSION:
        return binary
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit(
            f"the Cerbos peer is the Linux x86-64 binary of {PACKAGE}; this machine is "
            f"{platform.system()} {platform.machine()}: run the bench with --skip http"
        )
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            f"npm is needed once, to install Cerbos {VERSION} ({PACKAGE}) into "
            f"{cache_folder()}: install Node.js and npm, then run `make bench` again"
        )
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(LOCK_FOLDER / name, folder / name)
    report(f"installing Cerbos {VERSION} ({PACKAGE}, from {LOCK_FOLDER}) into {folder}")
    command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"npm ci failed in {folder}:\n{done.stdout}{done.stderr}")
    found = installed_version(binary)
    if found != VERSION:
        raise SystemExit(f"{binary} reports version {found!r}, not {VERSION}")
    return binary


# ------------------------------------------------------------------------- translation


def _cel_str(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid CEL string literal


_RE2_META = set("\\.+*?()|[]{}^$")


def glob_regex(pattern: str) -> str:
    """Our whole-name glob (``*`` any run, ``?`` one character) as an anchored RE2 pattern."""
    out = []
    for char in pattern:
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char in _RE2_META:
            out.append("\\" + char)
        else:
            out.append(char)
    return "^" + "".join(out) + "$"


def _cel_tools(tools: Sequence[str] | None) -> str:
    if tools is None or "*" in tools:
        return "true"
    parts = [
        f"R.id.matches({_cel_str(glob_regex(t))})"
        if "*" in t or "?" in t
        else f"R.id == {_cel_str(t)}"
        for t in tools
    ]
    return parts[0] if len(parts) == 1 else "(" + " || ".join(parts) + ")"


def _cel_number(bound: Any) -> str:
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        raise ValueError(f"not a number: {bound!r}")
    return repr(float(bound))  # a double literal: JSON numbers reach CEL as doubles


def _cel_constraint(name: str, spec: dict[str, Any]) -> str:
    value = f"R.attr.params[{_cel_str(name)}]"
    holds = [f"{_cel_str(name)} in R.attr.params"]
    if "regex" in spec or "enum" in spec:
        holds.append(f"type({value}) == string")
    if "regex" in spec:
        holds.append(f"{value}.matches({_cel_str(spec['regex'])})")
    if "enum" in spec:
        holds.append(f"{value} in [{', '.join(_cel_str(v) for v in spec['enum'])}]")
    if "min" in spec or "max" in spec:
        holds.append(f"type({value}) == double")
    if "min" in spec:
        holds.append(f"{value} >= {_cel_number(spec['min'])}")
    if "max" in spec:
        holds.append(f"{value} <= {_cel_number(spec['max'])}")
    return "(" + " && ".join(holds) + ")"


def _cel_window(window: dict[str, Any]) -> str:
    zone = _cel_str(window.get("timezone", "UTC"))
    holds = []
    if "allowedHours" in window:
        holds.append(f"now().getHours({zone}) in {sorted(window['allowedHours'])}")
    if "allowedDays" in window:
        holds.append(f"now().getDayOfWeek({zone}) in {sorted(window['allowedDays'])}")
    return "(" + " && ".join(holds) + ")"


def _cel_denies(rule: dict[str, Any]) -> str | None:
    return deny_condition(rule, _cel_tools, _cel_constraint, _cel_window)


def _identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def to_cerbos(policies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One Cerbos resource policy (kind ``tool``, action ``call``) deciding as ``policies`` do:
    one ``EFFECT_ALLOW`` rule per allowlist rule, whose condition is its tools and none of the
    deny conditions of its own policy or of any higher-priority one (Cerbos has no priorities;
    anything not allowed is denied, as ours denies by default)."""
    ordered = sorted(policies, key=lambda p: -p["priority"])
    variables: dict[str, str] = {}
    rules: list[dict[str, Any]] = []
    denying: list[str] = []
    for policy in ordered:
        variable = "deny_" + _identifier(policy["name"])
        if variable in variables:
            raise ValueError(f"two policies are named like {policy['name']!r}")
        denies = [d for d in map(_cel_denies, policy["rules"]) if d is not None]
        variables[variable] = " ||\n".join(denies) or "false"
        denying.append(f"V.{variable}")
        for index, rule in enumerate(policy["rules"]):
            if rule["type"] != "tool_allowlist":
                continue
            rules.append(
                {
                    "name": f"{_identifier(policy['name'])}-{index}",
                    "actions": [ACTION],
                    "effect": "EFFECT_ALLOW",
                    "roles": ["*"],
                    "condition": {
                        "match": {
                            "expr": f"{_cel_tools(rule.get('tools'))} && !({' || '.join(denying)})"
                        }
                    },
                }
            )
    return {
        "apiVersion": "api.cerbos.dev/v1",
        "resourcePolicy": {
            "resource": RESOURCE_KIND,
            "version": "default",
            "variables": {"local": variables},
            "rules": rules,
        },
    }


def check_body(tool: str, params: dict[str, Any]) -> dict[str, Any]:
    """The ``POST /api/check/resources`` body asking whether the agent may call ``tool``."""
    return {
        "principal": {"id": PRINCIPAL, "roles": ["agent"]},
        "resources": [
            {
                "actions": [ACTION],
                "resource": {"kind": RESOURCE_KIND, "id": tool, "attr": {"params": params}},
            }
        ],
    }


def allowed(answer: Any) -> bool:
    """Whether a ``/api/check/resources`` answer allows the call; ValueError when it is not
    an answer to :func:`check_body`."""
    try:
        effect = answer["results"][0]["actions"][ACTION]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"not a Cerbos check answer: {answer!r}") from exc
    if effect not in ("EFFECT_ALLOW", "EFFECT_DENY"):
        raise ValueError(f"unknown effect {effect!r}")
    return bool(effect == "EFFECT_ALLOW")


# ------------------------------------------------------------------------------ server


@dataclass(frozen=True)
class CerbosSetup:
    """What :func:`write_setup` made: the command to run and the files it uses."""

    command: list[str]
    base: str  # http://127.0.0.1:PORT
    audit_log: Path
    policy_file: Path


def write_setup(
    binary: Path, workdir: Path, policies: Sequence[dict[str, Any]], ports: Sequence[int]
) -> CerbosSetup:
    """The policy folder, the configuration and the command line of a Cerbos server in
    ``workdir``, listening on 127.0.0.1 only (``ports``: HTTP, gRPC, debug listener)."""
    http_port, grpc_port, debug_port = ports
    folder = workdir / "cerbos-policies"
    folder.mkdir(parents=True, exist_ok=True)
    policy_file = folder / "tools.json"  # JSON is YAML: Cerbos reads .json policy files too
    policy_file.write_text(json.dumps(to_cerbos(policies), indent=2) + "\n")
    audit_log = workdir / "cerbos-audit.log"
    config = {
        "server": {
            "httpListenAddr": f"127.0.0.1:{http_port}",
            "grpcListenAddr": f"127.0.0.1:{grpc_port}",
        },
        "storage": {
            "driver": "disk",
            "disk": {"directory": str(folder), "watchForChanges": False},
        },
        "audit": {
            "enabled": True,
            "accessLogsEnabled": True,
            "decisionLogsEnabled": True,
            "backend": "file",
            "file": {"path": str(audit_log)},
        },
        "telemetry": {"disabled": True},
    }
    config_file = workdir / "cerbos.yaml"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    command = [
        str(binary),
        "server",
        f"--config={config_file}",
        f"--debug-listen-addr=127.0.0.1:{debug_port}",
    ]
    return CerbosSetup(command, f"http://127.0.0.1:{http_port}", audit_log, policy_file)


def write_tests(setup: CerbosSetup, requests: Sequence[Any]) -> Path:
    """A Cerbos test suite next to the policy (``*_test.json``, which the server's disk store
    skips): each request of the mix with its expected effect (``request.expect`` starts with
    ``allow`` or ``deny``), at its own instant (``options.now``), so ``cerbos compile`` checks
    the translation, time windows included, at the fixed instants the in-process comparison
    uses rather than at the real clock."""
    resources: dict[str, Any] = {}
    tests: dict[str, dict[str, Any]] = {}
    for index, request in enumerate(requests):
        key = f"r{index:02d}"
        resources[key] = {
            "kind": RESOURCE_KIND,
            "id": request.tool,
            "attr": {"params": request.params},
        }
        instant = request.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        test = tests.setdefault(
            instant,
            {
                "name": f"the mix at {instant}",
                "options": {"now": instant},
                "input": {"principals": ["agent"], "resources": [], "actions": [ACTION]},
                "expected": [],
            },
        )
        test["input"]["resources"].append(key)
        effect = "EFFECT_ALLOW" if request.expect.startswith("allow") else "EFFECT_DENY"
        test["expected"].append(
            {"principal": "agent", "resource": key, "actions": {ACTION: effect}}
        )
    suite = {
        "name": "BenchMix",
        "description": "bench.engine_compare.REQUESTS with their expected outcomes",
        "principals": {"agent": {"id": PRINCIPAL, "roles": ["agent"]}},
        "resources": resources,
        "tests": list(tests.values()),
    }
    path = setup.policy_file.with_name("tools_test.json")
    path.write_text(json.dumps(suite, indent=2) + "\n")
    return path


def server_env() -> dict[str, str]:
    """The environment for Cerbos: no telemetry, no CERBOS_* setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CERBOS_")}
    env["CERBOS_NO_TELEMETRY"] = "1"
    return env


def compile_check(binary: Path, setup: CerbosSetup) -> int:
    """``cerbos compile`` on the policy folder, which also runs the test suite there (see
    :func:`write_tests`): a policy Cerbos refuses, or a request of the mix it decides otherwise
    than expected, stops the bench with Cerbos's own report, before any server starts. Returns
    how many tests passed."""
    folder = setup.policy_file.parent
    done = subprocess.run(
        [str(binary), "compile", "--output=json", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(),
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = None
    failures, passed = _test_results(report)
    if done.returncode != 0 or failures:
        detail = "\n".join(failures) or f"{done.stdout}{done.stderr}"
        raise RuntimeError(f"cerbos compile failed in {folder}:\n{detail}")
    return passed


def _test_results(report: Any) -> tuple[list[str], int]:
    """The failed tests of a ``cerbos compile --output=json`` report, one line each, and the
    count of passed ones."""
    failures, passed = [], 0
    suites = report.get("suites", []) if isinstance(report, dict) else []
    for suite in suites:
        for case in suite.get("testCases", []):
            for principal in case.get("principals", []):
                for resource in principal.get("resources", []):
                    for action in resource.get("actions", []):
                        details = action.get("details", {})
                        if details.get("result") == "RESULT_PASSED":
                            passed += 1
                            continue
                        failures.append(
                            f"{case.get('name')}: {resource.get('name')} {action.get('name')}: "
                            f"{details.get('result')} {json.dumps(details.get('failure'))}"
                        )
    return failures, passed


@dataclass(frozen=True)
class CerbosServer:
    pid: int
    setup: CerbosSetup
    tests_passed: int  # the mix's requests Cerbos's own test runner checked at fixed instants


@contextlib.contextmanager
def cerbos_server(
    binary: Path,
    workdir: Path,
    policies: Sequence[dict[str, Any]],
    requests: Sequence[Any] = (),
) -> Iterator[CerbosServer]:
    """A running Cerbos server deciding by ``policies``, stopped by its PID at the end.
    ``requests`` (with ``tool``, ``params``, ``now`` and ``expect``) are checked first with
    Cerbos's own test runner."""
    from bench.http_compare import free_port, http, running

    setup = write_setup(binary, workdir, policies, [free_port(), free_port(), free_port()])
    if requests:
        write_tests(setup, requests)
    passed = compile_check(binary, setup)

    def ready() -> bool:
        return http("GET", setup.base + "/_cerbos/health")[0] == 200

    with running(setup.command, server_env(), workdir / "cerbos.log", ready, "cerbos") as pid:
        yield CerbosServer(pid, setup, passed)


def decision_entries(audit_log: Path) -> int:
    """Decision entries in Cerbos's audit file (one JSON line each)."""
    count = 0
    with contextlib.suppress(FileNotFoundError), audit_log.open("rb") as lines:
        for line in lines:
            if b'"log.kind":"decision"' in line:
                count += 1
    return count
