"""The baseline for the HTTP benchmark: a bare Flask app with one POST route that parses the
JSON body and returns a small JSON object. No auth, no database, no validation.

``python -m bench.bare_app --host 127.0.0.1 --port N --workers 2 --threads 4`` serves it through
``api.server.serve`` itself, the function ``agentauth serve`` calls, with only the WSGI app
swapped: the server's options (granian's workers, the front's threads and deadlines, no access
log) are therefore the service's own, not a copy that could drift.
"""

from __future__ import annotations

import argparse
from typing import Any

from flask import Flask, request

app = Flask("bare")


@app.post("/v1/authorize")
def authorize() -> dict[str, Any]:
    body = request.get_json()
    return {"allowed": True, "tool": body.get("tool_name") if isinstance(body, dict) else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    from api import server
    from core.config import Settings

    print(f"bare app serving on http://{args.host}:{args.port}", flush=True)
    server.serve(Settings(), args.host, args.port, args.workers, args.threads, make_app=bare)


def bare(_settings: Any) -> Flask:
    """What each worker serves (module level: a worker may be spawned rather than forked)."""
    return app


if __name__ == "__main__":
    main()
