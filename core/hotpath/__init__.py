"""The authorize hot path: the one package that talks to the driver directly."""
