"""WSGI entry point for servers other than ``agentauth serve``: ``gunicorn api.wsgi:app``.
Settings come from ``AGENTAUTH_*`` variables; run ``agentauth db upgrade`` first."""

from api import create_app

app = create_app()
