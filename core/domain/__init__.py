"""The pure domain: no SQLAlchemy, no driver, no IO."""
