"""Benchmarks for agentauth, run by ``make bench`` (``python -m bench``); see bench/README.md.

Not part of the installed service: nothing under ``api``, ``core`` or ``controller`` imports it.
"""
