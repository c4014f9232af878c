"""WSGI entry point for servers other than ``agentauth serve``, e.g. ``granian --interface wsgi
api.wsgi:app``. Settings come from ``AGENTAUTH_*`` variables; run ``agentauth db upgrade`` first.
The app alone: the read deadlines and the refusal of a keyless body before it is read are
``agentauth serve``'s (``api.serving``), so put such a server behind a proxy that has them."""

from api import create_app

app = create_app()
