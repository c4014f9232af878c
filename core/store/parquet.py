"""The audit log's entries as Parquet (decisions §9): the lines of the JSONL export
(``core.store.chain.entries``) as one row each, one column per field, named as in the JSON,
for ``GET /v1/audit-logs/export?format=parquet`` and the Parquet archive of a prune
(``api/audit_logs.py``, ``api/retention.py``).

Types: ``seq``, ``ruleIndex`` and ``hashVersion`` int64, ``latencyMs`` double, ``timestamp``
a UTC timestamp of microseconds, ``parameters`` the JSON text of the entry's parameters
(Parquet's JSON type), ``erased`` boolean, ``wouldBe`` a struct of ``result``, ``policyId``,
``ruleIndex`` and ``reason`` (null when the entry has no would-be decision: decisions §10), the
rest strings. An erased entry has ``seq``, ``entryHash``, ``hash`` and
``erased`` true, every other column null; ``entryHash`` is null for the others, as in the
JSONL export. Rows are written a row group of :data:`ROW_GROUP` at a time, so that writing holds
no more than one row group in memory, whatever the number of entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

#: rows a row group holds: what a writer keeps in memory, and a reader's unit of work
ROW_GROUP = 10_000
#: the media type of a Parquet file (IANA, 2024)
MEDIA_TYPE = "application/vnd.apache.parquet"

_JSON = pa.json_(pa.string())
SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("id", pa.string()),
        ("agentId", pa.string()),
        ("action", pa.string()),
        ("toolName", pa.string()),
        ("parameters", _JSON),
        ("result", pa.string()),
        ("policyId", pa.string()),
        ("ruleIndex", pa.int64()),
        ("reason", pa.string()),
        ("latencyMs", pa.float64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("approvalId", pa.string()),
        ("sessionId", pa.string()),
        ("hash", pa.string()),
        ("entryHash", pa.string()),
        ("erased", pa.bool_()),
        ("hashVersion", pa.int64()),
        (
            "wouldBe",
            pa.struct(
                [
                    ("result", pa.string()),
                    ("policyId", pa.string()),
                    ("ruleIndex", pa.int64()),
                    ("reason", pa.string()),
                ]
            ),
        ),
    ]
)
_NAMES = tuple(SCHEMA.names)


def write(lines: Iterable[dict[str, Any]], sink: str | IO[bytes]) -> int:
    """The export's ``lines`` written to ``sink`` (a path or a binary file) as one Parquet
    file; how many rows."""
    rows = 0
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd") as writer:
        batch: list[dict[str, Any]] = []
        for line in lines:
            batch.append(line)
            if len(batch) == ROW_GROUP:
                writer.write_table(_table(batch), row_group_size=ROW_GROUP)
                rows += len(batch)
                batch = []
        if batch or not rows:  # an empty export is a file of no row, with its schema
            writer.write_table(_table(batch), row_group_size=ROW_GROUP)
            rows += len(batch)
    return rows


def _table(lines: list[dict[str, Any]]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in _NAMES}
    for line in lines:
        for name in _NAMES:
            columns[name].append(line.get(name))
    columns["erased"] = [bool(value) for value in columns["erased"]]
    columns["timestamp"] = [_instant(value) for value in columns["timestamp"]]
    parameters = pa.array([_json(value) for value in columns["parameters"]], pa.string())
    arrays = [
        pa.ExtensionArray.from_storage(_JSON, parameters)
        if name == "parameters"
        else pa.array(columns[name], SCHEMA.field(name).type)
        for name in _NAMES
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _instant(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _json(value: Any) -> str | None:
    """An erased entry's parameters are null, not the JSON text ``null``."""
    if value is None:
        return None
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: as the JSONL export writes it
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
