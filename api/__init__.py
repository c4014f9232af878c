"""The HTTP API: ``create_app(settings)`` builds a Flask app serving ``/v1/...``.

One blueprint module per URL noun; one error table (``errors.py``); authentication, scopes and
per-key rate limits as hooks (``auth.py``). Called by ``agentauth serve`` (through granian and
``api.serving``), by ``api.wsgi`` for other WSGI servers, and by the tests.
"""

from __future__ import annotations

import functools

from flask import Flask

from core.config import Settings
from core.domain.clock import Clock, utc_now
from core.hotpath.decisions import PolicyCache
from core.hotpath.recorder import Recorder
from core.store import signing
from core.store.database import Database


def create_app(settings: Settings | None = None, *, clock: Clock | None = None) -> Flask:
    from api import (
        agents,
        api_keys,
        approvals,
        audit_logs,
        auth,
        authorize,
        dashboard,
        errors,
        meta,
        metrics,
        observe,
        params,
        policies,
        sync_status,
        webhooks,
    )
    from api.context import Services

    settings = settings or Settings.from_env()
    app = Flask("agentauth")
    app.request_class = params.Request
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    database = Database(settings)
    app.extensions["agentauth"] = Services(
        settings,
        database,
        clock or utc_now,
        PolicyCache(),
        Recorder.for_database(database, on_commit=metrics.BATCH_SIZE.observe),
        functools.cache(functools.partial(signing.load_or_create, settings)),
    )
    errors.register(app)
    observe.register(app)
    auth.register(app)
    for module in (
        meta,
        metrics,
        agents,
        policies,
        api_keys,
        audit_logs,
        sync_status,
        webhooks,
    ):
        app.register_blueprint(module.bp)
    app.register_blueprint(approvals.bp)
    app.register_blueprint(api_keys.whoami_bp)
    app.register_blueprint(dashboard.bp)
    # POST /v1/authorize is not a Flask view: see api/authorize.py for why
    app.wsgi_app = authorize.Routes(app.wsgi_app, authorize.Endpoint(app))  # type: ignore[method-assign]
    return app
