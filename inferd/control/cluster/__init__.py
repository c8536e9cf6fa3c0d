"""How the instances of one control plane work as one: the `Coordination`
port (`ports`), its adapters `Solo` (a single instance, a cluster of one)
and `Postgres` (instances sharing a PostgreSQL), their pure policies (the
leader lease in `lease`, load sharing in `loadshare`), and the leader's
duties (`duties`)."""
