"""``agentauth serve`` with the audit chain's work taken out, for the benchmark only: what the
chain costs authorize is the difference between this server and the real one, measured in the
same run (bench.http_compare).

Everything else is the service itself, started by its own command line. Two functions are
replaced before the server forks its workers (so the workers inherit them): making an entry's
canonical JSON (``core.store.audit.leaf``) and reading, extending and writing the chain's heads
(``core.hotpath.chain.Chain``). (The canonical JSON of a pending decision's parameters, made in
``core.hotpath.decisions``, stays: the bench's policy has none.) Entries are then written
with seq, entry_hash and hash NULL, which SQLite's schema allows (PostgreSQL's does not: this
runs on SQLite only). Never a way to run the service: a log written so cannot be verified.

``python -m bench.unchained_app serve --db sqlite:///... [agentauth serve's options]``
"""

from __future__ import annotations

from typing import Any


def _unchained() -> None:
    from core.hotpath import chain
    from core.store import audit

    def extend(self: Any, row: Any) -> tuple[Any, ...]:
        return (*row.values, None, None, None)

    audit.leaf = lambda *args: None  # type: ignore[assignment]
    chain.Chain.extend = extend  # type: ignore[method-assign]
    chain.Chain.extend_all = lambda self, rows: [extend(self, row) for row in rows]  # type: ignore[method-assign]
    chain.Chain.write = lambda self: None  # type: ignore[method-assign]


if __name__ == "__main__":
    _unchained()
    from controller.cli import main

    main()
