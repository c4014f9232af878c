"""The Ed25519 key that signs audit checkpoints, kept outside the database (decisions §7): in a
file, created with mode 0600 on first use when absent, or given as a setting. Its text is the
C2SP signer key form (``PRIVATE+KEY+agentauth+<key id hex>+<base64 of 0x01 || seed>``), the one
Go's ``sumdb/note`` reads, so the same key can sign with other tools too."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from core.config import Settings
from core.domain.auditchain import KEY_NAME, VerifierKey, key_id, public_key_bytes
from core.domain.errors import ConfigError

_PREFIX = "PRIVATE+KEY+"


def signer_text(private: Ed25519PrivateKey, name: str = KEY_NAME) -> str:
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    encoded = base64.b64encode(b"\x01" + seed).decode()
    return f"{_PREFIX}{name}+{key_id(name, public_key_bytes(private)).hex()}+{encoded}"


def parse_signer(text: str) -> Ed25519PrivateKey:
    """A C2SP signer key; ValueError (never echoing the key) when it is not one of ours."""
    parts = text.strip().split("+", 4)
    if len(parts) != 5 or f"{parts[0]}+{parts[1]}+" != _PREFIX or parts[2] != KEY_NAME:
        raise ValueError(f"not a signer key: expected {_PREFIX}{KEY_NAME}+<key id>+<key>")
    try:
        raw = base64.b64decode(parts[4], validate=True)
        wanted = bytes.fromhex(parts[3])
    except ValueError:
        raise ValueError("not a signer key: bad hex or base64") from None
    if len(raw) != 33 or raw[:1] != b"\x01":
        raise ValueError("not an Ed25519 signer key")
    private = Ed25519PrivateKey.from_private_bytes(raw[1:])
    if key_id(KEY_NAME, public_key_bytes(private)) != wanted:
        raise ValueError("the signer key's ID does not match its key")
    return private


def load_or_create(settings: Settings, *, create: bool = True) -> Ed25519PrivateKey:
    """The signing key of ``settings``; its file is made (mode 0600, atomically, never over
    an existing one) when absent and ``create``. ConfigError says what is wrong."""
    if settings.audit_key:
        try:
            return parse_signer(settings.audit_key)
        except ValueError as exc:
            raise ConfigError(f"AGENTAUTH_AUDIT_KEY: {exc}") from None
    path = Path(settings.audit_key_file)
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        if not create:
            raise ConfigError(
                f"no audit signing key at {path}: set AGENTAUTH_AUDIT_KEY_FILE to the key"
                " file of the server that wrote the log"
            ) from None
        return _create(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the audit signing key {path}: {exc}") from None
    try:
        return parse_signer(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def verifier(settings: Settings, *, create: bool = True) -> VerifierKey:
    return VerifierKey.of(load_or_create(settings, create=create))


def _create(path: Path) -> Ed25519PrivateKey:
    """A new key written to a private temporary file, then linked to ``path``: a process that
    finds the file finds it whole, and of two processes creating it, one key wins."""
    private = Ed25519PrivateKey.generate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(signer_text(private) + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process made it first: that key it is
            return parse_signer(path.read_text(encoding="ascii"))
        finally:
            temporary.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot create the audit signing key {path}: {exc}") from None
    return private
