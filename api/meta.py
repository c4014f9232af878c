"""Endpoints about the service itself: liveness, readiness and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from api.auth import public
from api.context import services
from api.errors import error_response
from api.openapi import document
from core.domain.errors import StorageError
from core.store.migrate import is_current

bp = Blueprint("meta", __name__)


@bp.get("/healthz")
@public
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@bp.get("/readyz")
@public
def readyz() -> Response | dict[str, Any]:
    """Ready to serve: the database answers and its schema is the one this code needs. 503
    otherwise, so a load balancer sends traffic elsewhere until it is (no key needed)."""
    try:
        current = is_current(services().db)
    except StorageError:
        return error_response(503, "NOT_READY", "the database cannot be reached")
    if not current:
        message = "the database schema is not the one this version needs: run agentauth db upgrade"
        return error_response(503, "NOT_READY", message)
    return {"status": "ready"}


@bp.get("/v1/openapi.json")
@public
def openapi() -> dict[str, Any]:
    return document()
