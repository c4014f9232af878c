"""Fault tests: real servers killed mid-load, and the database taken away under them."""
