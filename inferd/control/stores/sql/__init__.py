"""The SQL store, written once: a `Database` (`database.py`) over a dialect
per engine (`sqlite_dialect.py`, `postgres_dialect.py`), the tables described
once (`tables.py`), one list of migrations (`migrations.py`), and a
repository per aggregate (endpoints and tokens, replicas, adapters, models,
accounts, admin keys, batches; what they share: `repository.py`) that
`store.py` puts together."""
