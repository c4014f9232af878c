"""The audit chain's arithmetic (decisions §7): entry hashes over the v1 fields in RFC 8785
canonical JSON, the chain, and C2SP signed notes, checked against Go's ``sumdb/note`` test
vectors so a checkpoint of ours verifies with other implementations."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core.domain.auditchain import (
    ZERO_HASH,
    Checkpoint,
    VerifierKey,
    chain_hash,
    entry_hash,
    origin_of,
    parse_note,
    sign_note,
    verify_note,
)

# golang.org/x/mod/sumdb/note's tests: a signer key, its verifier key, and a note it signed
GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZS"
    "NXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def go_private_key() -> Ed25519PrivateKey:
    raw = base64.b64decode(GO_SIGNER.split("+", 4)[4])  # the base64 holds a "+" too
    assert raw[0] == 1  # Ed25519
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


def test_the_verifier_key_of_gos_signer_is_gos_verifier_key():
    assert VerifierKey.of(go_private_key(), "PeterNeumann").text() == GO_VERIFIER


def test_a_note_signed_here_is_byte_for_byte_the_one_go_signs():
    assert sign_note(GO_TEXT, go_private_key(), "PeterNeumann") == GO_NOTE


def test_gos_note_verifies_and_a_changed_one_does_not():
    key = VerifierKey.parse(GO_VERIFIER)
    assert verify_note(parse_note(GO_NOTE), key)
    changed = GO_NOTE.replace("cryptography", "cryptographY")
    assert not verify_note(parse_note(changed), key)


def test_a_verifier_key_with_any_character_changed_is_refused():
    for index in range(len(GO_VERIFIER)):
        mangled = GO_VERIFIER[:index] + chr(ord(GO_VERIFIER[index]) + 1) + GO_VERIFIER[index + 1 :]
        with pytest.raises(ValueError, match="verifier key"):
            VerifierKey.parse(mangled)


def test_a_note_signed_by_another_key_does_not_verify():
    other = Ed25519PrivateKey.generate()
    note = sign_note(GO_TEXT, other, "PeterNeumann")  # same name, another key: another key ID
    assert not verify_note(parse_note(note), VerifierKey.parse(GO_VERIFIER))


def test_a_checkpoint_round_trips_through_a_signed_note():
    private = Ed25519PrivateKey.generate()
    head = hashlib.sha256(b"head").digest()
    checkpoint = Checkpoint(origin_of("69eeec25-e415-56b9-8a83-75732fda392f"), 42, head)
    note = sign_note(checkpoint.text(), private)
    parsed = parse_note(note)
    assert verify_note(parsed, VerifierKey.of(private))
    assert Checkpoint.parse(parsed.text) == checkpoint
    assert parsed.text.splitlines() == [
        "agentauth/69eeec25-e415-56b9-8a83-75732fda392f",
        "42",
        base64.b64encode(head).decode(),
    ]


@pytest.mark.parametrize(
    "text",
    ["", "agentauth/x\n", "agentauth/x\n01\nAAAA\n", "agentauth/x\n-1\n" + "A" * 44 + "\n",
     "agentauth/x\n1\nAAAA\n", "\n1\n" + base64.b64encode(bytes(32)).decode() + "\n"],
)  # fmt: skip
def test_what_is_not_a_checkpoint_is_refused(text):
    with pytest.raises(ValueError, match="not a checkpoint"):
        Checkpoint.parse(text)


def test_the_entry_hash_covers_the_v1_fields_in_canonical_json_and_nothing_else():
    entry = {
        "id": "01a213d1-53c4-7d3e-b052-70414202988c",
        "seq": 1,
        "agentId": "67553dfe-db0b-4b10-90be-8b0f3e426657",
        "action": "authorize",
        "toolName": "payments.refund",
        "parameters": {"order": "ORD-1", "amount": 1500.0},
        "result": "escalated",
        "policyId": "89fe8f8c-138a-4cc4-b8fd-6be9bd0dc3d1",
        "ruleIndex": 0,  # not a v1 field: not hashed
        "approvalId": "01a213d1-53c4-73aa-8cd5-8428d08f6108",
        "reason": "approval required",
        "latencyMs": 3.47,
        "timestamp": "2026-11-25T17:46:55.297163Z",
    }
    # written out by hand: members sorted by name, 1500.0 as 1500, sessionId null
    canonical = (
        '{"action":"authorize","agentId":"67553dfe-db0b-4b10-90be-8b0f3e426657",'
        '"approvalId":"01a213d1-53c4-73aa-8cd5-8428d08f6108",'
        '"id":"01a213d1-53c4-7d3e-b052-70414202988c","latencyMs":3.47,'
        '"parameters":{"amount":1500,"order":"ORD-1"},'
        '"policyId":"89fe8f8c-138a-4cc4-b8fd-6be9bd0dc3d1","reason":"approval required",'
        '"result":"escalated","seq":1,"sessionId":null,'
        '"timestamp":"2026-11-25T17:46:55.297163Z","toolName":"payments.refund"}'
    )
    assert json.loads(canonical)["seq"] == 1
    assert entry_hash(entry) == hashlib.sha256(canonical.encode()).digest()
    assert entry_hash({**entry, "ruleIndex": 7}) == entry_hash(entry)
    assert entry_hash({**entry, "reason": "approval required!"}) != entry_hash(entry)


def test_the_chain_links_raw_digests_from_32_zero_bytes():
    first, second = hashlib.sha256(b"1").digest(), hashlib.sha256(b"2").digest()
    head = chain_hash(chain_hash(ZERO_HASH, first), second)
    expected = hashlib.sha256(hashlib.sha256(bytes(32) + first).digest() + second).digest()
    assert head == expected
    assert chain_hash(chain_hash(ZERO_HASH, second), first) != head
