"""Storage: SQLAlchemy models, sessions, migrations and one module per stored noun."""
