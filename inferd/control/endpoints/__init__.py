"""Endpoints: the endpoint service (create, read, update, delete, tokens),
their records, placement and price, and the views the gateway reads."""
