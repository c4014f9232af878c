"""Webhooks in the domain (decisions §6): the event types, which URLs and addresses a webhook
may reach, the signature a receiver checks, and when a failed delivery is tried again.

Pure: no clock reads, no IO. Resolving a host and sending the request are
``api.delivery``'s; storing webhooks and deliveries is ``core.store.webhooks``'s.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from urllib.parse import urlsplit

#: what a webhook may subscribe to, sorted as they are stored
EVENT_TYPES = ("approval.decided", "approval.requested")
#: a try is abandoned after this long (connect, send, answer: all of it)
TRY_TIMEOUT_SECONDS = 10.0
FIRST_RETRY = timedelta(seconds=1)
MAX_RETRY = timedelta(minutes=10)
#: no try is made later than this after the event
GIVE_UP_AFTER = timedelta(hours=24)
DEFAULT_PORTS = {"http": 80, "https": 443}


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a webhook URL points: its scheme (lower case), host (no brackets) and port."""

    scheme: str
    host: str
    port: int


def parse_url(url: str) -> Target:
    """The target of an http or https URL; ValueError saying what is wrong otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("is not a valid URL (check the host and port)") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not hold a user name or password (put a token in the path)")
    if not parts.hostname:
        raise ValueError("has no host")
    return Target(scheme, parts.hostname, DEFAULT_PORTS[scheme] if port is None else port)


def forbidden_reason(address: str) -> str | None:
    """Why a webhook may not reach this IP address ("loopback", "private", ...), or None for a
    public one. An IPv6 address that carries an IPv4 one (IPv4-mapped, 6to4) is judged by
    what it carries too."""
    ip = ipaddress.ip_address(address.partition("%")[0])  # fe80::1%eth0: the zone is no part
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return forbidden_reason(str(ip.ipv4_mapped))
        if ip.sixtofour is not None and (carried := forbidden_reason(str(ip.sixtofour))):
            return carried
    for reason, found in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("not globally routable", not ip.is_global),
    ):
        if found:
            return reason
    return None


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Agentauth-Signature`` value: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>.<body>">``, keyed with the secret's UTF-8 bytes."""
    message = str(timestamp).encode("ascii") + b"." + body
    digest = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def retry_delay(tries: int) -> timedelta:
    """How long to wait after the ``tries``-th failed try: 1 s after the first, doubling,
    at most 10 minutes."""
    if tries >= 16:  # 2**15 s is far past the cap already
        return MAX_RETRY
    return min(FIRST_RETRY * (1 << max(tries - 1, 0)), MAX_RETRY)


def next_try(tries: int, created_at: datetime, now: datetime) -> datetime | None:
    """When to try again after the ``tries``-th try failed at ``now``; None when that would
    be more than 24 hours after the event (the delivery has then failed for good)."""
    due = now + retry_delay(tries)
    return due if due <= created_at + GIVE_UP_AFTER else None
