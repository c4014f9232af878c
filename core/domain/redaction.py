"""Redaction of audit parameters: applied to every entry before it is written.

A key is sensitive (decisions §4) when, lowercased with ``_ - .`` and spaces removed, it equals
one of the spec's keys treated the same way; or when one of its words (split on those characters
and on camelCase) is a sensitive word; or when, squashed that way, it contains one of the
sensitive fragments, so names written as one word are caught too. So ``client_secret``,
``X-Api-Key``, ``APIKEY``, ``privateKey``, ``userPassword``, ``dbpassword`` and ``SECRETKEY``
are redacted; ``max_tokens``, ``keyboard`` and ``author`` are not. The whole value under a
sensitive key becomes ``[REDACTED]``; redaction descends into objects and arrays. Any string
holding one of this service's API keys (``svc_`` + 32 hex) has it replaced, whatever its key.

This module is the one place that decides what is a secret: the audit entry, and everything
shown from it again (the list, both exports, approvals, their webhook events, ``plan``'s
examples), is redacted by :func:`redact` when the entry is written. Error bodies pass through
:func:`scrub_json` (``api.errors``), so no answer echoes a key a caller sent.
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
# decisions §4's words, and two plurals that hold the same secrets ("api_keys" is caught by
# its fragment, "cookies" and "ssh_keys" only here); "tokens" alone is left out on purpose,
# since "max_tokens" is a model parameter, not a credential
SENSITIVE_WORDS = frozenset(
    {"password", "passwd", "secret", "token", "key", "credential", "credentials",
     "authorization", "auth", "cookie", "keys", "cookies"}
)  # fmt: skip
#: decisions §4: a squashed key containing one of these is sensitive ("dbpassword", "SECRETKEY",
#: "clientSecrets", "accessTokens"), however many words were run together around it
SENSITIVE_FRAGMENTS = (
    "password", "passwd", "secret", "credential", "apikey", "privatekey", "accesstoken",
    "refreshtoken", "authtoken", "sessiontoken", "idtoken",
)  # fmt: skip
_SEPARATORS = re.compile(r"[_\-. ]+")
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
#: an API key of this service, anywhere in a text
KEY_SHAPE = re.compile(r"svc_[0-9a-fA-F]{32}")


def _squash(key: str) -> str:
    return _SEPARATORS.sub("", key).lower()


_SPEC_SQUASHED = frozenset(_squash(k) for k in SPEC_KEYS)
_FRAGMENT = re.compile("|".join(SENSITIVE_FRAGMENTS))


@lru_cache(maxsize=4096)
def is_sensitive(key: str) -> bool:
    """Whether values under ``key`` are secrets."""
    squashed = _squash(key)
    if squashed in _SPEC_SQUASHED or _FRAGMENT.search(squashed):
        return True
    return any(
        word.lower() in SENSITIVE_WORDS
        for part in _SEPARATORS.split(key)
        for word in _WORDS.findall(part)
    )


def scrub(text: str) -> str:
    """``text`` with every API key of this service replaced by the mask."""
    return KEY_SHAPE.sub(MASK, text) if "svc_" in text else text


def scrub_json(value: Any) -> Any:
    """A copy of a JSON value with every API key of this service, in any string or member
    name, replaced by the mask; nothing else changes (for what is sent back, not stored)."""
    if isinstance(value, dict):
        return {scrub(str(k)): scrub_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_json(item) for item in value]
    if isinstance(value, str):
        return scrub(value)
    return value


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


HOLDS_A_KEY = "holds an API key of this service: keys are never stored or shown"


def key_places(value: Any) -> list[tuple[str | int, ...]]:
    """Where a JSON value holds an API key of this service, in a string or in a member's name:
    the path of each such string, or of the member. For input that is stored and shown again
    as sent (names, descriptions, rules), which must then be refused rather than masked."""
    found: list[tuple[str | int, ...]] = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for name, child in item.items():
                if isinstance(name, str) and KEY_SHAPE.search(name):
                    found.append((*path, scrub(name)))
                stack.append(((*path, name), child))
        elif isinstance(item, list):
            stack.extend(((*path, index), child) for index, child in enumerate(item))
        elif isinstance(item, str) and KEY_SHAPE.search(item):
            found.append(path)
    return sorted(found, key=str)
