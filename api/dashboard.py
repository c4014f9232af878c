"""The web dashboard at ``/dashboard/``: one HTML page, a style sheet and two scripts, shipped in
``api/web/`` and served as they are (no build step, nothing fetched from elsewhere).

The page holds no data of its own: signed in with an API key (kept in the tab's session storage
and sent as the Bearer header), it calls the public ``/v1`` API like any other client, so a
read-only key can do in the page exactly what it can do with curl. The files need no key; they
are served with a strict Content-Security-Policy (scripts and styles from this origin only, no
inline code, no framing) and no referrer. Registered by ``create_app``.
"""

from __future__ import annotations

from importlib.resources import files

from flask import Blueprint, Response, abort, redirect

from api.auth import public

bp = Blueprint("dashboard", __name__)

_WEB = files("api") / "web"
#: every file the page is made of, and its type; anything else under /dashboard/ is 404
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@bp.get("/dashboard")
@public
def dashboard_slash() -> Response:
    return redirect("/dashboard/", code=308)  # type: ignore[return-value]


@bp.get("/dashboard/")
@public
def dashboard() -> Response:
    return asset("index.html")


@bp.get("/dashboard/<name>")
@public
def asset(name: str) -> Response:
    kind = ASSETS.get(name)
    if kind is None:
        abort(404)
    body = (_WEB / name).read_bytes()
    return Response(body, content_type=kind, headers=SECURITY_HEADERS)
