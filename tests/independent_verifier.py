"""A verifier of the audit log written by a third party from the README alone ("Verifying the
audit log": its recipe, and the Python given there, copied as it stands), so that the recipe is
tested as a reader would use it. It imports nothing of this project: only the standard library,
``rfc8785`` and ``cryptography`` (tests/api/test_audit_chain.py checks that it stays so).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# ---------------------------------------------------------------- the README's code, as given

FIELDS = ("id", "seq", "agentId", "action", "toolName", "parameters", "result", "policyId",
          "approvalId", "sessionId", "reason", "latencyMs", "timestamp")  # fmt: skip
VERSIONS = {1: FIELDS, 2: (*FIELDS, "wouldBe")}  # by the line's hashVersion (absent: 1)


def heads(lines):  # yields (seq, head) after each entry; raises at the first that fails
    head, n = bytes(32), 0
    for line in lines:
        entry = json.loads(line)
        assert entry["seq"] == n + 1, f"seq {n + 1} missing or out of place"
        n = entry["seq"]
        if entry.get("erased"):
            own = bytes.fromhex(entry["entryHash"])
        else:
            fields = VERSIONS[entry.get("hashVersion", 1)]
            own = hashlib.sha256(rfc8785.dumps({f: entry.get(f) for f in fields})).digest()
        head = hashlib.sha256(head + own).digest()
        assert head.hex() == entry["hash"], f"entry {n} changed"
        yield n, head


def checkpoint(note, public_key_text):  # (size, head) that the note signs
    text, _, signatures = note.partition("\n\n")
    name, key_id, key = public_key_text.strip().split("+", 2)  # noqa: RUF059
    key = base64.b64decode(key)[1:]
    for line in signatures.splitlines():
        raw = base64.b64decode(line.split(" ")[-1])
        if raw[:4] == bytes.fromhex(key_id):
            Ed25519PublicKey.from_public_bytes(key).verify(raw[4:], (text + "\n").encode())
            origin, size, head = text.split("\n")  # noqa: RUF059
            return int(size), base64.b64decode(head)
    raise ValueError("not signed by this key")


# ------------------------------------------------------------ the reader's own few lines more


@dataclass(frozen=True)
class Outcome:
    """What this verifier found: whether all holds, the size and head it read up to, and (when
    something fails) the first seq that does not hold."""

    ok: bool
    size: int
    head: bytes
    failed_at: int | None = None


def verify(export: str, notes: list[str], public_key_text: str) -> Outcome:
    """The export's lines read in order, then each checkpoint held against the head after its
    entry N ("a log shorter than N has lost entries")."""
    after: dict[int, bytes] = {0: bytes(32)}
    size = 0
    try:
        for size, head in heads(line for line in export.splitlines() if line.strip()):
            after[size] = head
    except AssertionError:
        return Outcome(False, size, after[size], size + 1)
    for note in notes:
        signed_size, signed_head = checkpoint(note, public_key_text)  # raises if forged
        if signed_size > size:
            return Outcome(False, size, after[size], size + 1)
        if after[signed_size] != signed_head:
            return Outcome(False, size, after[size], signed_size)
    return Outcome(True, size, after[size])
