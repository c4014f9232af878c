"""The lock (``requirements/*.txt``, made by ``make lock``) and ``setup.cfg`` agree: every range
of ``setup.cfg`` is satisfied by the locked version, every package named in one is in the
other, nothing is locked that nothing needs, and the environment running the tests was
installed from the lock. So an upgrade is a deliberate commit (``make lock``, then the suite),
never whatever a registry serves on the day of the install."""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
#: each lock and the extras of setup.cfg it is compiled from (always with build.in)
EXTRAS = {"run.txt": (), "test.txt": ("test",), "dev.txt": ("dev",)}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
_FROM_SETUP = "agentauth (setup.cfg)"
_FROM_BUILD = "-r requirements/build.in"


@dataclass(frozen=True)
class Pin:
    version: str
    marker: str | None
    #: what needs it, as the lock says: a package name, setup.cfg or build.in
    needed_by: frozenset[str]

    def applies_here(self) -> bool:
        return self.marker is None or Marker(self.marker).evaluate()


def read_lock(name: str) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    current: str | None = None
    pending: dict[str, tuple[str, str | None, set[str]]] = {}
    for line in (LOCKS / name).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match[1])
            pending[current] = (match[2], match[3], set())
        elif current is not None and line.startswith("    #   "):
            source = line[len("    #   ") :].strip()
            if not source.startswith("-c "):  # a constraint is not a need
                pending[current][2].add(source)
        elif current is not None and line.startswith("    # via "):
            pending[current][2].add(line[len("    # via ") :].strip())
    for package, (version, marker, sources) in pending.items():
        needs = {s if s in (_FROM_SETUP, _FROM_BUILD) else canonicalize_name(s) for s in sources}
        pins[package] = Pin(version, marker, frozenset(needs))
    return pins


def declared(extras: tuple[str, ...]) -> dict[str, Requirement]:
    """What setup.cfg asks for with these extras, plus what the build needs (build.in)."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["options"]["install_requires"].splitlines()
    for extra in extras:
        lines += parser["options.extras_require"][extra].splitlines()
    lines += (LOCKS / "build.in").read_text().splitlines()
    wanted = [Requirement(s) for line in lines if (s := line.split("#")[0].strip())]
    return {canonicalize_name(r.name): r for r in wanted}


LOCK_NAMES = sorted(EXTRAS)


@pytest.mark.parametrize("lock", LOCK_NAMES)
def test_every_range_of_setup_cfg_is_met_by_the_lock(lock):
    pins = read_lock(lock)
    for name, requirement in declared(EXTRAS[lock]).items():
        assert name in pins, f"{name} is in setup.cfg but not in requirements/{lock}: make lock"
        version = pins[name].version
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{lock} locks {name}=={version}, outside setup.cfg's "
            f"'{requirement}': make lock, or widen the range on purpose"
        )


@pytest.mark.parametrize("lock", LOCK_NAMES)
def test_the_lock_names_setup_cfg_as_the_source_of_exactly_its_packages(lock):
    pins = read_lock(lock)
    direct = {n for n, p in pins.items() if p.needed_by & {_FROM_SETUP, _FROM_BUILD}}
    wanted = set(declared(EXTRAS[lock]))
    assert direct == wanted, (
        f"requirements/{lock} and setup.cfg disagree: only in the lock {sorted(direct - wanted)}, "
        f"only in setup.cfg {sorted(wanted - direct)}: make lock"
    )


@pytest.mark.parametrize("lock", LOCK_NAMES)
def test_nothing_is_locked_that_nothing_needs(lock):
    pins = read_lock(lock)
    reached = {n for n, p in pins.items() if p.needed_by & {_FROM_SETUP, _FROM_BUILD}}
    grew = True
    while grew:
        more = {n for n, p in pins.items() if n not in reached and p.needed_by & reached}
        reached |= more
        grew = bool(more)
    assert set(pins) == reached, f"locked but needed by nothing: {sorted(set(pins) - reached)}"


def test_the_locks_agree_on_every_version():
    dev = read_lock("dev.txt")
    for lock in ("run.txt", "test.txt"):
        for name, pin in read_lock(lock).items():
            assert dev[name].version == pin.version, f"{name}: {lock} and dev.txt differ"


def test_this_environment_was_installed_from_the_lock():
    """The suite ran against the versions the lock names (README: install from it)."""
    wrong = []
    for name, pin in read_lock("test.txt").items():
        if not pin.applies_here():
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name} is not installed (the lock has {pin.version})")
            continue
        if canonicalize_name(installed) != canonicalize_name(pin.version):
            wrong.append(f"{name} {installed} is installed, the lock has {pin.version}")
    assert not wrong, "install from requirements/test.txt (see README): " + "; ".join(wrong)


def test_the_mcp2_lock_is_the_test_lock_but_for_the_mcp_line():
    """requirements/mcp2.txt (nox -s mcp2) differs from test.txt only where mcp 2.x needs it:
    its mcp and fastmcp are mcp2.in's, and every package both locks hold that mcp 2.x does not bring
    has the test lock's version, so its session tests the same service."""
    wanted = (LOCKS / "mcp2.in").read_text().splitlines()
    pins = [Requirement(line) for line in wanted if line and line[0] != "#"]
    mcp2, test = read_lock("mcp2.txt"), read_lock("test.txt")
    for pin in pins:
        assert mcp2[canonicalize_name(pin.name)].version == str(pin.specifier).removeprefix("==")
    assert test["mcp"].version.split(".")[0] == "1"
    assert mcp2["mcp"].version.split(".")[0] == "2"
    for name in ("flask", "sqlalchemy", "httpx", "anyio", "pytest", "granian", "psycopg"):
        assert mcp2[name].version == test[name].version, name
