"""The Batch API: files of requests run on an endpoint's idle capacity.

`model` (records, the state machine), `jsonl` (an input file checked line
by line), `service` (what the HTTP routes call), `runner` (the leader's duty
that runs them). Where they are kept: `inferd.control.stores.sql.batches`.
"""
