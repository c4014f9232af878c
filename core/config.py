"""Settings: the only place that reads the environment (variables prefixed ``AGENTAUTH_``).

Built once at the edge (the CLI, the WSGI entry point, a test fixture) and passed down
explicitly; nothing below reads ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core.domain.errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///agentauth.db"
#: the help of every command's --db option
DATABASE_URL_HELP = f"database URL (default: $AGENTAUTH_DATABASE_URL, else {DEFAULT_DATABASE_URL})"
SQLITE_SYNC_MODES = ("FULL", "NORMAL", "OFF", "EXTRA")
#: the forms of a prune's archive: the JSONL one always, a Parquet one beside it with parquet
ARCHIVE_FORMATS = ("jsonl", "parquet")
#: the most the controller reads of one policy file, and of all a repository's policy files
DEFAULT_MAX_POLICY_FILE_BYTES = 1024 * 1024
DEFAULT_MAX_POLICY_REPO_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """What the service is configured with.

    ``sqlite_synchronous``: ``FULL`` (default) makes every acknowledged decision survive a power
    loss; ``NORMAL`` is faster but may lose the last committed transactions on power loss (not
    on a process crash). ``sqlite_busy_timeout_ms``: how long a write waits for SQLite's write
    lock while another process holds it, before the request fails with 500.
    """

    database_url: str = DEFAULT_DATABASE_URL
    rate_limit_per_minute: int = 600
    max_body_bytes: int = 1024 * 1024
    #: how long a client has to send a request's headers, and then its body (``agentauth
    #: serve``): a connection whose headers are late is closed, a late body gets 408
    read_timeout_seconds: int = 10
    sqlite_synchronous: str = "FULL"
    sqlite_busy_timeout_ms: int = 30_000
    #: where the controller caches parsed policy files ("" turns the cache off)
    cache_dir: str = ""
    #: a policy file larger than this is refused (a problem of that file), and a repository
    #: whose policy files hold more than ``max_policy_repo_bytes`` in all is not read
    max_policy_file_bytes: int = DEFAULT_MAX_POLICY_FILE_BYTES
    max_policy_repo_bytes: int = DEFAULT_MAX_POLICY_REPO_BYTES
    #: webhooks may reach loopback, private, link-local and other non-public addresses
    webhook_allow_private: bool = False
    #: the Ed25519 key that signs audit checkpoints: this file (created, mode 0600, when
    #: absent), unless ``audit_key`` holds the key itself (C2SP's PRIVATE+KEY+... form)
    audit_key_file: str = "agentauth-audit.key"
    audit_key: str = field(default="", repr=False)
    #: ``agentauth serve`` appends a signed checkpoint of each workspace whose log grew to this
    #: file ("" for none), at most every ``checkpoint_interval_seconds`` (decisions §9)
    checkpoint_file: str = ""
    checkpoint_interval_seconds: int = 60
    #: ``agentauth serve`` archives and prunes each workspace's entries older than this many
    #: days into ``audit_archive_dir`` (decisions §9); 0 and "" keep everything
    audit_retention_days: int = 0
    audit_archive_dir: str = ""
    #: ``jsonl``, or ``parquet`` to write a Parquet archive beside each JSONL one
    audit_archive_format: str = "jsonl"
    #: the most entries one ``format=parquet`` export holds (it is written whole to a
    #: temporary file before it is sent: this bounds that file); not read from the environment
    parquet_export_limit: int = 1_000_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``AGENTAUTH_*`` variables; keyword overrides that are not None win."""
        env = os.environ if environ is None else environ
        settings = cls(
            database_url=env.get("AGENTAUTH_DATABASE_URL") or DEFAULT_DATABASE_URL,
            rate_limit_per_minute=_int(env, "AGENTAUTH_RATE_LIMIT_PER_MINUTE", 600),
            read_timeout_seconds=_int(env, "AGENTAUTH_READ_TIMEOUT_SECONDS", 10),
            sqlite_synchronous=env.get("AGENTAUTH_SQLITE_SYNCHRONOUS", "FULL").upper(),
            sqlite_busy_timeout_ms=_int(env, "AGENTAUTH_SQLITE_BUSY_TIMEOUT_MS", 30_000),
            cache_dir=env.get("AGENTAUTH_CACHE_DIR", _default_cache_dir(env)),
            max_policy_file_bytes=_int(
                env, "AGENTAUTH_MAX_POLICY_FILE_BYTES", DEFAULT_MAX_POLICY_FILE_BYTES
            ),
            max_policy_repo_bytes=_int(
                env, "AGENTAUTH_MAX_POLICY_REPO_BYTES", DEFAULT_MAX_POLICY_REPO_BYTES
            ),
            webhook_allow_private=_bool(env, "AGENTAUTH_WEBHOOK_ALLOW_PRIVATE", False),
            audit_key_file=env.get("AGENTAUTH_AUDIT_KEY_FILE") or _default_key_file(env),
            audit_key=env.get("AGENTAUTH_AUDIT_KEY", ""),
            checkpoint_file=env.get("AGENTAUTH_CHECKPOINT_FILE", ""),
            checkpoint_interval_seconds=_int(env, "AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS", 60),
            audit_retention_days=_int(env, "AGENTAUTH_AUDIT_RETENTION_DAYS", 0),
            audit_archive_dir=env.get("AGENTAUTH_AUDIT_ARCHIVE_DIR", ""),
            audit_archive_format=env.get("AGENTAUTH_AUDIT_ARCHIVE_FORMAT", "jsonl").lower(),
        )
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse settings that cannot work, with a message naming the variable."""
        if self.rate_limit_per_minute < 1:
            raise ConfigError("AGENTAUTH_RATE_LIMIT_PER_MINUTE must be at least 1")
        if not 1 <= self.read_timeout_seconds <= 3600:
            raise ConfigError("AGENTAUTH_READ_TIMEOUT_SECONDS must be between 1 and 3600")
        if self.sqlite_busy_timeout_ms < 0:
            raise ConfigError("AGENTAUTH_SQLITE_BUSY_TIMEOUT_MS must not be negative")
        if self.max_policy_file_bytes < 1:
            raise ConfigError("AGENTAUTH_MAX_POLICY_FILE_BYTES must be at least 1")
        if self.max_policy_repo_bytes < 1:
            raise ConfigError("AGENTAUTH_MAX_POLICY_REPO_BYTES must be at least 1")
        if not 1 <= self.checkpoint_interval_seconds <= 86400:
            raise ConfigError("AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS must be between 1 and 86400")
        if self.audit_retention_days < 0:
            raise ConfigError("AGENTAUTH_AUDIT_RETENTION_DAYS must be a whole number of days")
        if bool(self.audit_retention_days) != bool(self.audit_archive_dir):
            raise ConfigError(
                "AGENTAUTH_AUDIT_RETENTION_DAYS and AGENTAUTH_AUDIT_ARCHIVE_DIR go together: set"
                " both to archive and prune old audit entries, or neither to keep everything"
            )
        if self.audit_archive_format not in ARCHIVE_FORMATS:
            raise ConfigError(
                "AGENTAUTH_AUDIT_ARCHIVE_FORMAT must be one of " + ", ".join(ARCHIVE_FORMATS)
            )
        if self.sqlite_synchronous not in SQLITE_SYNC_MODES:
            raise ConfigError(
                "AGENTAUTH_SQLITE_SYNCHRONOUS must be one of " + ", ".join(SQLITE_SYNC_MODES)
            )


def _default_key_file(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CONFIG_HOME") or (
        os.path.join(env["HOME"], ".config") if env.get("HOME") else ""
    )
    return os.path.join(base, "agentauth", "audit.key") if base else "agentauth-audit.key"


def _default_cache_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else ""
    )
    return os.path.join(base, "agentauth") if base else ""


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
