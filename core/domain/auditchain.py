"""The verifiable audit log's arithmetic (decisions §7): an entry's hash over its versioned field
set in RFC 8785 canonical JSON, the chain that links them, and checkpoints as C2SP signed notes
(Ed25519, key names and ids as C2SP ``signed-note`` says). Pure: no database, no files; the
keys come in as bytes. What a third party needs to check the log is exactly what is here, so
the README's recipe can be written from this module alone.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: the fields an entry's hash covers, version 1, in no particular order (canonical JSON sorts)
ENTRY_FIELDS_V1 = (
    "id", "seq", "agentId", "action", "toolName", "parameters", "result", "policyId",
    "approvalId", "sessionId", "reason", "latencyMs", "timestamp",
)  # fmt: skip
#: hash(0): the head of an empty chain
ZERO_HASH = bytes(32)
#: the key name of every checkpoint this service signs
KEY_NAME = "agentauth"
#: C2SP's signature type byte for Ed25519
_ED25519 = b"\x01"
#: what starts a signature line of a signed note: an em dash and a space
_SIGNATURE_START = "\u2014 "


def entry_hash(entry: Mapping[str, Any]) -> bytes:
    """SHA-256 of the entry's v1 fields in RFC 8785 canonical JSON; a field the entry does not
    carry (or does not use yet) is null."""
    fields = {name: entry.get(name) for name in ENTRY_FIELDS_V1}
    return hashlib.sha256(rfc8785.dumps(fields)).digest()


def chain_hash(previous: bytes, entry: bytes) -> bytes:
    """hash(n) = SHA-256(hash(n-1) || entryHash(n)), over the raw 32-byte digests."""
    return hashlib.sha256(previous + entry).digest()


# --------------------------------------------------------------------------- keys (C2SP)


def public_key_bytes(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte key ID of C2SP signed notes: SHA-256(name || 0x0A || 0x01 || key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + _ED25519 + public_key).digest()[:4]


@dataclass(frozen=True)
class VerifierKey:
    """A C2SP verifier key: ``<name>+<key id hex>+<base64 of 0x01 || public key>``."""

    name: str
    id: bytes
    public_key: bytes

    def text(self) -> str:
        encoded = base64.b64encode(_ED25519 + self.public_key).decode()
        return f"{self.name}+{self.id.hex()}+{encoded}"

    @classmethod
    def of(cls, private: Ed25519PrivateKey, name: str = KEY_NAME) -> VerifierKey:
        public = public_key_bytes(private)
        return cls(name, key_id(name, public), public)

    @classmethod
    def parse(cls, text: str) -> VerifierKey:
        """A verifier key as the public-key endpoint answers it; ValueError when it is not one
        (a wrong type byte, length or key ID included)."""
        parts = text.strip().split("+", 2)  # base64 may hold "+" too
        if len(parts) != 3 or not parts[0] or len(parts[1]) != 8:
            raise ValueError("not a verifier key: expected <name>+<8 hex>+<base64>")
        name, hex_id, encoded = parts
        try:
            wanted = bytes.fromhex(hex_id)
            raw = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise ValueError("not a verifier key: bad hex or base64") from None
        if len(raw) != 33 or raw[:1] != _ED25519:
            raise ValueError("not an Ed25519 verifier key")
        if key_id(name, raw[1:]) != wanted:
            raise ValueError("the verifier key's ID does not match its name and key")
        return cls(name, wanted, raw[1:])


# ------------------------------------------------------------------------ signed notes


def sign_note(text: str, private: Ed25519PrivateKey, name: str = KEY_NAME) -> str:
    """``text`` (which must end with a newline) as a C2SP signed note with one signature."""
    if not text.endswith("\n"):
        raise ValueError("a note's text ends with a newline")
    public = public_key_bytes(private)
    signature = private.sign(text.encode())
    line = base64.b64encode(key_id(name, public) + signature).decode()
    return f"{text}\n{_SIGNATURE_START}{name} {line}\n"


@dataclass(frozen=True)
class Note:
    text: str
    #: (key name, 4-byte key ID, 64-byte signature) per signature line
    signatures: tuple[tuple[str, bytes, bytes], ...]


def parse_note(note: str) -> Note:
    """The text and signature lines of a signed note; ValueError when it is not one."""
    text, separator, rest = note.rpartition("\n\n")
    if not separator or not rest.endswith("\n"):
        raise ValueError("not a signed note: no blank line before signatures")
    signatures = []
    for line in rest[:-1].split("\n"):
        if not line.startswith(_SIGNATURE_START):
            raise ValueError("not a signed note: a signature line must start with an em dash")
        name, space, encoded = line[len(_SIGNATURE_START) :].rpartition(" ")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise ValueError("not a signed note: a signature is not base64") from None
        if not space or not name or len(raw) < 5:
            raise ValueError("not a signed note: malformed signature line")
        signatures.append((name, raw[:4], raw[4:]))
    return Note(text + "\n", tuple(signatures))


def verify_note(note: Note, key: VerifierKey) -> bool:
    """Whether one of the note's signatures is ``key``'s, and valid."""
    for name, found_id, signature in note.signatures:
        if name != key.name or found_id != key.id:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(key.public_key).verify(signature, note.text.encode())
        except InvalidSignature:
            return False
        return True
    return False


# ------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint says: the log of ``origin`` had ``size`` entries with head ``head``."""

    origin: str
    size: int
    head: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.head).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "":
            raise ValueError("not a checkpoint: expected origin, size and head lines")
        origin, size, head = lines[0], lines[1], lines[2]
        if not origin or not size.isdigit() or (size != "0" and size.startswith("0")):
            raise ValueError("not a checkpoint: bad origin or size")
        try:
            raw = base64.b64decode(head, validate=True)
        except ValueError:
            raise ValueError("not a checkpoint: the head is not base64") from None
        if len(raw) != 32:
            raise ValueError("not a checkpoint: the head is not 32 bytes")
        return cls(origin, int(size), raw)


def origin_of(workspace_id: str) -> str:
    return f"{KEY_NAME}/{workspace_id}"
