"""Checkpoints kept outside the database (decisions §9): with ``AGENTAUTH_CHECKPOINT_FILE``
set, ``agentauth serve``'s maintenance process (``api.outbox``) appends a signed checkpoint of
each workspace whose log grew to that file, at most every
``AGENTAUTH_CHECKPOINT_INTERVAL_SECONDS``, and says how far the newest checkpoint kept is
behind each log (``agentauth_checkpoint_lag_entries``).

The file is the one ``agentauth audit checkpoint --out`` appends to and ``agentauth audit
verify --checkpoint`` reads: C2SP signed notes one after another, each written whole and
synced before the next. Put it on another disk or host than the database: whoever can rewrite
the database cannot then rewrite history the file has already seen.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select

from api.metrics import CHECKPOINT_LAG
from core.domain.auditchain import Checkpoint, origin_of, parse_note, sign_note, split_notes
from core.store.database import Database
from core.store.models import AuditHead

log = logging.getLogger("agentauth.checkpoints")


class CheckpointFile:
    """The file and the newest size it holds of each log (read once, when it starts)."""

    def __init__(self, path: Path, interval_seconds: float, key: Ed25519PrivateKey) -> None:
        self.path = path
        self.interval = interval_seconds
        self._key = key
        self._kept = newest_sizes(path)
        self._written_at: float | None = None

    def tick(self, db: Database, now: float) -> int:
        """Each log's lag, into the metric; a checkpoint of each log that grew, appended when
        ``interval`` has passed since the last ones (``now``: monotonic seconds). How many
        were appended."""
        with db.transaction() as session:
            heads = session.execute(
                select(AuditHead.workspace_id, AuditHead.seq, AuditHead.hash)
            ).all()
        grown = []
        for workspace_id, size, head in heads:
            lag = int(size) - self._kept.get(origin_of(workspace_id), 0)
            CHECKPOINT_LAG.labels(workspace_id).set(max(lag, 0))
            if lag > 0:
                grown.append((workspace_id, int(size), bytes.fromhex(head)))
        due = self._written_at is None or now - self._written_at >= self.interval
        if not grown or not due:
            return 0
        notes = [
            sign_note(Checkpoint(origin_of(w), size, head).text(), self._key)
            for w, size, head in grown
        ]
        with self.path.open("a", encoding="utf-8") as file:
            file.write("".join(notes))
            file.flush()
            os.fsync(file.fileno())
        self._written_at = now
        for workspace_id, size, _ in grown:
            self._kept[origin_of(workspace_id)] = size
            CHECKPOINT_LAG.labels(workspace_id).set(0)
        return len(notes)


def newest_sizes(path: Path) -> dict[str, int]:
    """The largest size of each log's checkpoints in ``path`` (none when it does not exist);
    a note that does not parse is skipped, and said."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    sizes: dict[str, int] = {}
    for number, note in enumerate(split_notes(text), start=1):
        try:
            found = Checkpoint.parse(parse_note(note).text)
        except ValueError as exc:
            log.warning("checkpoint %d of %s does not parse (%s): skipped", number, path, exc)
            continue
        sizes[found.origin] = max(sizes.get(found.origin, 0), found.size)
    return sizes
