"""The verifiable audit log's arithmetic (decisions §7): an entry's hash over its versioned field
set in RFC 8785 canonical JSON, the chain that links them, and checkpoints as C2SP signed notes
(Ed25519, key names and ids as C2SP ``signed-note`` says). Pure: no database, no files; the
keys come in as bytes. What a third party needs to check the log is exactly what is here, so
the README's recipe can be written from this module alone; which is why it is one module of
over 300 lines: hashing, notes and verification change together or not at all.
"""

from __future__ import annotations

import base64
import hashlib
import operator
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: the fields an entry's hash covers, version 1, in no particular order (canonical JSON sorts)
ENTRY_FIELDS_V1 = (
    "id", "seq", "agentId", "action", "toolName", "parameters", "result", "policyId",
    "approvalId", "sessionId", "reason", "latencyMs", "timestamp",
)  # fmt: skip
#: version 2 (entries written since decisions §10): the v1 fields and the would-be decision
ENTRY_FIELDS_V2 = (*ENTRY_FIELDS_V1, "wouldBe")
#: each version's fields, by the ``hashVersion`` an entry carries (1 when it carries none)
ENTRY_FIELDS = {1: ENTRY_FIELDS_V1, 2: ENTRY_FIELDS_V2}
#: the version of every entry written now
HASH_VERSION = 2
#: hash(0): the head of an empty chain
ZERO_HASH = bytes(32)
#: the key name of every checkpoint this service signs
KEY_NAME = "agentauth"
#: C2SP's signature type byte for Ed25519
_ED25519 = b"\x01"
#: what starts a signature line of a signed note: an em dash and a space
_SIGNATURE_START = "\u2014 "
#: the largest integer an IEEE 754 double holds exactly, as RFC 8785 numbers are
_SAFE_INTEGER = 2**53 - 1
#: orjson, set to write what RFC 8785 writes where the two agree (sorted keys, no whitespace)
_ORJSON = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
#: where an entry's seq sits in its canonical JSON (with seq 0): the members after it are
#: sessionId, timestamp and toolName, strings or null, and wouldBe, null or an object without
#: a member seq, so this is its last occurrence
_SEQ_ZERO = b',"seq":0,'
_VALUES = {version: operator.itemgetter(*names) for version, names in ENTRY_FIELDS.items()}


def canonical_json(value: Any) -> bytes:
    """``value`` (as parsed from JSON) in RFC 8785 canonical JSON, as UTF-8.

    orjson writes the same bytes as RFC 8785 for most values (sorted keys, no whitespace, the
    same string escapes), twenty times faster than the ``rfc8785`` package, which writes the
    rest: floats that ECMAScript writes otherwise than Python (``1.0`` as ``1``, ``1e16`` in
    full), keys beyond ASCII (RFC 8785 sorts them by UTF-16 code units), and integers beyond
    2**53, which RFC 8785 reads as the nearest IEEE 754 double (its section 3.2.2.3), so they
    are hashed as that double. Raises ValueError for what JSON cannot hold (a lone surrogate,
    NaN, a key that is not a string, nesting deeper than Python recurses).
    """
    try:
        if _plain(value):
            return orjson.dumps(value, option=_ORJSON)
    except orjson.JSONEncodeError:
        pass  # a lone surrogate: rfc8785 names it
    except RecursionError:
        raise ValueError("not canonical JSON: nested too deep") from None
    return _rfc8785(value)


def _plain(value: Any) -> bool:
    """Whether orjson writes ``value`` exactly as RFC 8785 does. (Strings, null, booleans and
    small integers are tested in the loop rather than by a call each: this runs for every
    entry written and every entry verified.)"""
    kind = type(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or not key.isascii():
                return False
        items: Any = value.values()
    elif kind is list:
        items = value
    else:
        items = (value,)
    for item in items:
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int:
            if not -_SAFE_INTEGER <= item <= _SAFE_INTEGER:
                return False
        elif kind is float:  # repr and ECMAScript agree on finite, non-integral, plain floats
            text = repr(item)
            if item - item != 0.0 or "e" in text or text.endswith(".0"):
                return False
        elif (kind is not dict and kind is not list) or not _plain(item):
            return False
    return True


def _rfc8785(value: Any) -> bytes:
    try:
        return rfc8785.dumps(_as_doubles(value))
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(f"not canonical JSON: {exc}") from None
    except RecursionError:
        raise ValueError("not canonical JSON: nested too deep") from None


def _number(value: float) -> bytes:
    """A float as RFC 8785 writes it (ECMAScript's Number::toString)."""
    text = repr(value)
    if "e" in text or value - value != 0.0:  # exponents, NaN, infinities: rfc8785's way
        return _rfc8785(value)
    return (text[:-2] if text.endswith(".0") else text).encode()


def _as_doubles(value: Any) -> Any:
    """``value`` with integers beyond the double's exact range as the double RFC 8785 reads."""
    if type(value) is int and not -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
        return float(value)
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_as_doubles(item) for item in value]
    return value


@dataclass(frozen=True)
class Leaf:
    """An entry's canonical JSON around its ``seq``, made before the seq is known (off the
    write lock): ``hash(seq)`` is then one SHA-256 over a few hundred bytes."""

    before: bytes
    after: bytes

    @classmethod
    def of(cls, entry: Mapping[str, Any], parameters_json: bytes | None = None) -> Leaf:
        """``parameters_json``: the entry's parameters in canonical JSON, when they were
        written so already (off the write lock, for an entry made under it)."""
        fields = {**entry, "seq": 0}
        before, _, after = entry_json(fields, parameters_json).rpartition(_SEQ_ZERO)
        return cls(before + _SEQ_ZERO[:-2], _SEQ_ZERO[-1:] + after)

    def hash(self, seq: int) -> bytes:
        return hashlib.sha256(self.before + str(seq).encode() + self.after).digest()


def entry_json(entry: Mapping[str, Any], parameters_json: bytes | None = None) -> bytes:
    """The entry's fields of its ``hashVersion`` (1 when it carries none: v1; 2: the v1 fields
    and ``wouldBe``) in RFC 8785 canonical JSON; a field the entry does not carry (or does not
    use yet) is null. ``parameters_json``: :func:`canonical_json` of its parameters, when
    already made. Raises ValueError for a version that is not 1 or 2.

    ``latencyMs``, a float in every entry, is written apart, so that an entry whose parameters
    need no care takes orjson's path. Its other fields are strings, null and seq in every entry
    written (and ``wouldBe``, null or an object of strings, null and a small integer); in an
    entry changed to hold something else there, orjson's bytes may not be RFC 8785's, but they
    still differ from those of every entry that does (orjson writes each parsed JSON value as
    text that parses back to it), which is all verifying needs."""
    version = entry.get("hashVersion", 1)
    names = ENTRY_FIELDS.get(version) if type(version) is int else None
    if names is None:
        raise ValueError(f"not a hash version: {version!r}")
    try:
        fields = dict(zip(names, _VALUES[version](entry), strict=True))
    except KeyError:  # an entry without some field: null
        fields = {name: entry.get(name) for name in names}
    latency, parameters = fields["latencyMs"], fields["parameters"]
    if type(latency) is float:
        try:
            if parameters_json is not None or _plain(parameters):
                fields["latencyMs"] = orjson.Fragment(_number(latency))
                if parameters_json is not None:
                    fields["parameters"] = orjson.Fragment(parameters_json)
                return orjson.dumps(fields, option=_ORJSON)
        except (orjson.JSONEncodeError, RecursionError):
            fields["latencyMs"], fields["parameters"] = latency, parameters
    return canonical_json(fields)


def entry_hash(entry: Mapping[str, Any]) -> bytes:
    """SHA-256 of :func:`entry_json`."""
    return hashlib.sha256(entry_json(entry)).digest()


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


def split_notes(text: str) -> list[str]:
    """The signed notes of a file holding several one after the other (as ``agentauth audit
    checkpoint --out`` appends them); blank lines between notes are skipped."""
    notes: list[str] = []
    current: list[str] = []
    signed = False
    for line in text.splitlines(keepends=True):
        if signed and not line.startswith(_SIGNATURE_START):
            notes.append("".join(current))
            current, signed = [], False
        if not current and not line.strip():
            continue
        current.append(line)
        signed = signed or line.startswith(_SIGNATURE_START)
    if current:
        notes.append("".join(current))
    return notes


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


# ---------------------------------------------------------------------------- verifying


@dataclass(frozen=True)
class Finding:
    """The first thing that does not hold: at ``seq``, ``what`` (changed, missing, inserted,
    reordered, head differs from checkpoint, bad signature, malformed), and why in words."""

    seq: int
    what: str
    detail: str


@dataclass(frozen=True)
class ChainReport:
    """What a verification found: how many entries it read (erased ones among them), the size
    and head of the chain it verified, the checkpoints it matched, and the first failure."""

    entries: int
    erased: int
    size: int
    head: bytes
    checkpoints: int
    failure: Finding | None
    #: the size it started after: the entries before were pruned (decisions §9), or are in an
    #: archive before this export
    start: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None


def signed_checkpoints(
    notes: Iterable[str], key: VerifierKey
) -> tuple[list[Checkpoint], Finding | None]:
    """The checkpoints of ``notes`` signed by ``key``; a Finding (seq 0) for the first note that
    is not a checkpoint or whose signature does not verify."""
    found: list[Checkpoint] = []
    for number, text in enumerate(notes, start=1):
        try:
            note = parse_note(text)
            checkpoint = Checkpoint.parse(note.text)
        except ValueError as exc:
            return found, Finding(0, "malformed", f"checkpoint {number}: {exc}")
        if not verify_note(note, key):
            what = f"checkpoint {number} (size {checkpoint.size})"
            return found, Finding(
                checkpoint.size, "bad signature", f"{what} is not signed by {key.text()}"
            )
        found.append(checkpoint)
    return found, None


@dataclass(frozen=True)
class Start:
    """Where a verification starts: after entry ``size``, whose chain hash is ``head`` (the
    counts so far carry over into the report)."""

    size: int = 0
    head: bytes = ZERO_HASH
    erased: int = 0
    matched: int = 0


def verify_chain(
    entries: Iterable[Mapping[str, Any]],
    checkpoints: Iterable[Checkpoint] = (),
    *,
    window: int = 8,
    start: Start = Start(),
) -> ChainReport:
    """Recompute every entry's hash and the chain over ``entries`` in ``seq`` order (full entries
    as the API renders them, with ``seq`` and ``hash``; erased ones as ``{seq, entryHash, hash,
    erased: true}``), and hold the chain against each checkpoint. Stops at the first failure,
    naming it; ``window`` entries around it are used to tell a moved entry from a changed one.
    ``entries`` start after ``start`` (the first one is ``start.size + 1``)."""
    wanted: dict[int, list[Checkpoint]] = {}
    empty: list[Checkpoint] = []  # checkpoints of the size it starts at
    for checkpoint in checkpoints:
        if checkpoint.size > start.size:
            wanted.setdefault(checkpoint.size, []).append(checkpoint)
        elif checkpoint.size == start.size:
            empty.append(checkpoint)
    ahead: deque[Mapping[str, Any]] = deque()
    behind: deque[Mapping[str, Any]] = deque(maxlen=window)
    source = iter(entries)
    previous, size, erased, matched = start.head, start.size, start.erased, start.matched

    def report(failure: Finding | None) -> ChainReport:
        return ChainReport(size - start.size, erased, size, previous, matched, failure, start.size)

    for checkpoint in empty:  # of the size it starts at: the empty log's, or a pruned head
        if checkpoint.head != start.head:
            what = "the empty log's" if start.size == 0 else f"the log's at {start.size}"
            detail = f"the checkpoint of size {start.size} signs another head than {what}"
            return report(Finding(start.size, "head differs from checkpoint", detail))
        if start.size == 0:  # one of a later size was counted where the start was taken
            matched += 1

    while True:
        while len(ahead) <= window:
            item = next(source, None)
            if item is None:
                break
            ahead.append(item)
        if not ahead:
            break
        entry = ahead.popleft()
        expected = size + 1
        try:
            seq, stored, own = _read(entry)
        except ValueError as exc:
            return report(Finding(expected, "malformed", str(exc)))
        if seq != expected:
            return report(_out_of_place(seq, expected, ahead))
        computed = own if own is not None else _entry_hash_or_none(entry)
        if own is not None:
            erased += 1
        head = chain_hash(previous, computed or b"")
        if computed is None or head != stored:
            return report(_why_not(entry, seq, previous, list(behind), list(ahead)))
        for checkpoint in wanted.pop(seq, []):
            if checkpoint.head != head:
                detail = f"the checkpoint of size {seq} signs another head than the log's"
                return report(Finding(seq, "head differs from checkpoint", detail))
            matched += 1
        previous, size = head, seq
        behind.append(entry)
    if wanted:
        longest = max(wanted)
        detail = f"the log ends at {size}, a checkpoint says it held {longest} entries"
        return report(Finding(size + 1, "missing", detail))
    return report(None)


def _entry_hash_or_none(entry: Mapping[str, Any]) -> bytes | None:
    """The entry's hash; None for content no entry of this service can hold (a changed one)."""
    try:
        return entry_hash(entry)
    except ValueError:
        return None


# ------------------------------------------------------------------ verifying, fast path
#
# hash(n) = SHA-256(hash(n-1) || entryHash(n)) holds for every n exactly when each entry's
# stored hash is its own link over the stored hash before it. So a run of entries can be
# checked on its own (in a worker process, say), and the runs only need stitching where they
# meet: the parallel, and cheap to send back, form of verify_chain.


@dataclass(frozen=True)
class Run:
    """A run of consecutive entries checked on its own: how many, its first and last seq, the
    first entry's own hash and stored hash (to link it to the run before), the last stored
    hash, how many were erased, the stored hash at each seq asked for (checkpoints), and the
    position in the run of the first entry that does not link to the one before it (None when
    all do)."""

    count: int
    first_seq: int
    last_seq: int
    first_own: bytes
    first_stored: bytes
    last_stored: bytes
    erased: int
    marks: dict[int, bytes]
    broken: int | None


_NO_RUN = Run(0, 0, 0, b"", b"", b"", 0, {}, None)


def check_run(entries: Iterable[Mapping[str, Any]], marks: frozenset[int] = frozenset()) -> Run:
    """Check each entry of a run against the one before it in the run: the costly part of
    verifying (an entry's hash), and the part that runs in parallel."""
    sha256 = hashlib.sha256
    count = erased = first_seq = seq = 0
    first_own = first_stored = stored = b""
    found: dict[int, bytes] = {}
    for entry in entries:
        try:
            at, hashed, mine = _read(entry)
        except ValueError:
            return _broken(count, first_seq, seq, first_own, first_stored, stored, erased, found)
        if mine is None:
            mine = _entry_hash_or_none(entry) or b""
        else:
            erased += 1
        if count == 0:
            first_seq, first_own, first_stored = at, mine, hashed
        elif at != seq + 1 or sha256(stored + mine).digest() != hashed:
            return _broken(count, first_seq, seq, first_own, first_stored, stored, erased, found)
        if at in marks:
            found[at] = hashed
        seq, stored = at, hashed
        count += 1
    if count == 0:
        return _NO_RUN
    return Run(count, first_seq, seq, first_own, first_stored, stored, erased, found, None)


def _broken(count: int, first: int, last: int, own: bytes, first_stored: bytes,
            stored: bytes, erased: int, found: dict[int, bytes]) -> Run:  # fmt: skip
    return Run(count + 1, first, last, own, first_stored, stored, erased, found, count)


def check_lines(lines: list[bytes], marks: frozenset[int] = frozenset()) -> Run:
    """:func:`check_run` of JSON Lines (the export's); a line that is not a JSON object is an
    entry that cannot be read."""
    return check_run((_parsed(line) for line in lines), marks)


def _parsed(line: bytes) -> Mapping[str, Any]:
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {}
    return entry if isinstance(entry, dict) else {}


@dataclass(frozen=True)
class Stopped:
    """Where :func:`chain_runs` found something amiss: verify again from entry ``index``
    (counting from 0 in the order given) with :func:`verify_chain` and ``start``, which then
    names what it is."""

    index: int
    start: Start


def chain_runs(
    runs: Iterable[Run], checkpoints: Iterable[Checkpoint] = (), start: Start = Start()
) -> ChainReport | Stopped:
    """Stitch checked runs, in order, and hold them against ``checkpoints`` (whose sizes the
    runs were asked to mark): the report when everything holds, else where to look closer
    (the start of the run before the one that does not hold, so that :func:`verify_chain` sees
    the entries around it). The runs start after ``start``; a checkpoint of its size is held
    against its head, earlier ones are of entries not given."""
    wanted: dict[int, list[Checkpoint]] = {}
    for checkpoint in checkpoints:
        if checkpoint.size >= start.size:
            wanted.setdefault(checkpoint.size, []).append(checkpoint)
    if any(c.head != start.head for c in wanted.get(start.size, ())):
        return Stopped(0, start)  # verify_chain names it
    state = earlier = (0, start)
    size, head, erased, index = start.size, start.head, start.erased, 0
    matched = start.matched + len(wanted.pop(start.size, ()))
    for run in runs:
        if run.count == 0:
            continue
        linked = hashlib.sha256(head + run.first_own).digest() == run.first_stored
        if run.first_seq != size + 1 or not linked or run.broken is not None:
            return Stopped(earlier[0], earlier[1])
        for at, stored in run.marks.items():
            for checkpoint in wanted.pop(at, ()):
                if checkpoint.head != stored:
                    return Stopped(earlier[0], earlier[1])
                matched += 1
        size, head = run.last_seq, run.last_stored
        erased += run.erased
        index += run.count
        earlier, state = state, (index, Start(size, head, erased, matched))
    if wanted:
        return Stopped(earlier[0], earlier[1])
    return ChainReport(size - start.size, erased, size, head, matched, None, start.size)


def _read(entry: Mapping[str, Any]) -> tuple[int, bytes, bytes | None]:
    """(seq, stored hash, stored entryHash of an erased entry or None)."""
    seq = entry.get("seq")
    if type(seq) is not int or seq < 1:
        raise ValueError("an entry without a positive integer seq")
    try:
        stored = bytes.fromhex(str(entry.get("hash")))
        own = bytes.fromhex(str(entry["entryHash"])) if entry.get("erased") else None
    except (KeyError, ValueError):
        raise ValueError(f"entry {seq}: hash or entryHash is not hex") from None
    if len(stored) != 32 or (own is not None and len(own) != 32):
        raise ValueError(f"entry {seq}: hash or entryHash is not 32 bytes")
    return seq, stored, own


def _out_of_place(seq: int, expected: int, ahead: deque[Mapping[str, Any]]) -> Finding:
    if seq < expected:
        what = "inserted" if seq == expected - 1 else "reordered"
        return Finding(seq, what, f"seq {seq} comes again after {expected - 1}")
    if any(item.get("seq") == expected for item in ahead):
        return Finding(expected, "reordered", f"seq {seq} comes before {expected}")
    return Finding(expected, "missing", f"no entry {expected}: the next one is {seq}")


def _why_not(
    entry: Mapping[str, Any],
    seq: int,
    previous: bytes,
    behind: list[Mapping[str, Any]],
    ahead: list[Mapping[str, Any]],
) -> Finding:
    """An entry whose hash does not chain, and why, from its neighbours:

    - its row (content and hash) was written as entry m, chaining from the head before m: it
      was moved here from a later place (reordered), or, when m is earlier and the entries
      from m on chained, those were put in before it (inserted at m);
    - its content, written as entry m, chains to the hash stored at m: contents traded places
      (reordered);
    - the next entry chains at this seq from the previous head: this one is extra (inserted);
    - otherwise it was changed.
    """
    stored = _hex(entry.get("hash"))
    heads: dict[int, bytes] = {seq - 1: previous, seq: stored}
    for item in [*behind, *ahead]:
        at = item.get("seq")
        if type(at) is int and at not in heads:
            heads[at] = _hex(item.get("hash"))
    if not entry.get("erased"):
        for moved in sorted(at for at in heads if at != seq):
            mine = _entry_hash_or_none({**entry, "seq": moved})
            if mine is None:
                break
            for before in set(heads.values()):
                written = chain_hash(before, mine)
                if written == stored and moved < seq and before == heads.get(moved - 1):
                    detail = f"entries {moved} to {seq - 1} stand where entry {moved} was written"
                    return Finding(moved, "inserted", detail)
                if written in (stored, heads[moved]):
                    return Finding(seq, "reordered", f"entry {seq} was written as entry {moved}")
    if ahead and not ahead[0].get("erased"):
        shifted = _entry_hash_or_none({**ahead[0], "seq": seq})
        if shifted is not None and chain_hash(previous, shifted) == _hex(ahead[0].get("hash")):
            return Finding(seq, "inserted", f"entry {seq} is not part of the chain written")
    return Finding(seq, "changed", f"entry {seq} does not match its hash")


def _hex(value: Any) -> bytes:
    try:
        return bytes.fromhex(str(value))
    except ValueError:
        return b""
