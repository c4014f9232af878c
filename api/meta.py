"""Endpoints about the service itself: liveness and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.auth import public
from api.openapi import document

bp = Blueprint("meta", __name__)


@bp.get("/healthz")
@public
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@bp.get("/v1/openapi.json")
@public
def openapi() -> dict[str, Any]:
    return document()
