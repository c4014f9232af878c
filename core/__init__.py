"""The domain and its storage, shared by the API (``api``) and the controller (``controller``).

Three layers, each importing only the ones below it (import-linter holds this in CI):

``core.hotpath``
    The authorize hot path, the one package that talks to the database driver directly:
    ``reads`` (the caller's key and the agent, straight through the driver), ``recorder``
    (group commit of decisions: audit entries and counters, one transaction per batch),
    ``decisions`` (read, evaluate, record) and ``approvals`` (approvals used, reused, created
    and decided inside those batches, with the webhook events they raise). Every audit entry
    is written by the recorder. Everything else goes through SQLAlchemy.
``core.store``
    SQLAlchemy: ``database`` (engines, sessions, error translation), ``models``, ``migrate``
    and the Alembic ``migrations``, and one module per stored noun (``agents``, ``policies``,
    ``keys``, ``audit``, ``approvals`` (reads), ``webhooks``, ``limits``, ``sync_status``,
    ``paging``). Transactions belong to the caller; nothing here commits on its own.
``core.config``
    ``Settings``: the only place that reads the environment.
``core.domain``
    Pure: ``engine`` (compiled policies + request + now -> Decision), ``compiler``, ``globs``,
    ``limits`` (rate-limit windows), ``approvals`` (the parameters digest, statuses, what the
    engine asks of stored approvals), ``webhooks`` (event types, address checks, signatures,
    the retry schedule), ``auditchain`` (entry hashes, the chain, signed checkpoints),
    ``rules``, ``redaction``, ``validation``, ``jsonvalues``, ``errors`` (the tree in its
    docstring), ``clock`` and ``ids``. No SQLAlchemy, no driver, no IO beyond the clock.
"""
