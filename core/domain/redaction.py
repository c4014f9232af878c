"""Redaction of audit parameters: applied to every entry before it is written.

A key is sensitive when, lowercased with ``_ - .`` and spaces removed, it equals one of the
spec's keys treated the same way, or when one of its words (split on those characters and on
camelCase) is a sensitive word. So ``client_secret``, ``X-Api-Key``, ``APIKEY``, ``privateKey``
and ``userPassword`` are redacted; ``max_tokens``, ``keyboard`` and ``author`` are not. The whole
value under a sensitive key becomes ``[REDACTED]``; redaction descends into objects and arrays.
Any string holding one of this service's API keys (``svc_`` + 32 hex) has it replaced, whatever
its key.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

MASK = "[REDACTED]"
SPEC_KEYS = (
    "password", "secret", "token", "key", "credential", "authorization",
    "api_key", "apiKey", "access_token", "refresh_token",
)  # fmt: skip
# plurals hold the same secrets ("client_secrets", "cookies"); "tokens" alone is left out on
# purpose, since "max_tokens" is a model parameter, not a credential
SENSITIVE_WORDS = frozenset(
    {"password", "passwords", "passwd", "secret", "secrets", "token", "key", "keys",
     "credential", "credentials", "authorization", "auth", "cookie", "cookies"}
)  # fmt: skip
_SEPARATORS = re.compile(r"[_\-. ]+")
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_API_KEY = re.compile(r"svc_[0-9a-fA-F]{32}")


def _squash(key: str) -> str:
    return _SEPARATORS.sub("", key).lower()


# "accessTokens", "refresh_tokens", "api_keys": the spec's compound keys in the plural
_SPEC_SQUASHED = frozenset(_squash(k) for k in SPEC_KEYS) | {
    _squash(k) + "s" for k in ("api_key", "access_token", "refresh_token")
}


@lru_cache(maxsize=4096)
def is_sensitive(key: str) -> bool:
    """Whether values under ``key`` are secrets."""
    if _squash(key) in _SPEC_SQUASHED:
        return True
    return any(
        word.lower() in SENSITIVE_WORDS
        for part in _SEPARATORS.split(key)
        for word in _WORDS.findall(part)
    )


def scrub(text: str) -> str:
    """``text`` with every API key of this service replaced by the mask."""
    return _API_KEY.sub(MASK, text) if "svc_" in text else text


def redact(value: Any) -> Any:
    """A redacted copy of a JSON value (the input is not modified)."""
    if isinstance(value, dict):
        return {
            scrub(str(k)): MASK if is_sensitive(str(k)) else redact(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str):
        return scrub(value)
    return value
