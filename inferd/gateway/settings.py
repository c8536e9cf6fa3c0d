"""The gateway's knobs, in one frozen object built by whoever composes the server."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferd.gateway.routing import DEFAULT_LOAD_FACTOR, DEFAULT_MIN_LOAD_BOUND, Policy
from inferd.http import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class GatewaySettings:
    # Largest request body forwarded; larger ones get 413 before upstream.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The gateway's own in-flight requests per replica; at this bound the
    # replica takes no more and further requests are held (or refused 429).
    max_in_flight_per_replica: int = 128
    # Requests held while scaling from zero or while every ready replica is
    # at `max_in_flight_per_replica`, bounded by what they cost: the bytes of
    # their bodies plus `held_request_overhead_bytes` each (the socket, the
    # task, the parsed headers), per endpoint and for the whole instance.
    # A burst of thousands of small chats is held, not refused.
    max_held_bytes_per_endpoint: int = 64 * 1024 * 1024
    max_held_bytes: int = 256 * 1024 * 1024
    held_request_overhead_bytes: int = 4096
    # And by count per endpoint: each held request keeps a client socket open.
    max_held_requests: int = 10_000
    # How long one request may be held in all (across its retries).
    max_hold_seconds: float = 180.0
    # Forward attempts per request (the first one included).
    max_attempts: int = 3
    connect_timeout_seconds: float = 2.0
    # How often a held request's endpoint is re-read from the directory, to
    # notice replicas that became ready while others are busy.
    hold_poll_seconds: float = 0.1
    # A streaming chat or completion held while no replica is ready gets its
    # response headers (200, text/event-stream) at once and an SSE comment
    # line saying what it waits for this often, until a replica takes it
    # (`inferd.gateway.held_stream`).
    hold_progress_seconds: float = 5.0
    # Until a cold start has been observed for an endpoint, the Retry-After
    # of a request refused while it scales from zero uses this.
    cold_start_estimate_seconds: float = 10.0
    # Service times kept per endpoint (for Retry-After and the autoscaler).
    service_time_window: int = 64
    # Routing (see `inferd.gateway.routing`): `prefix` sends a request where
    # its prompt's KV cache most likely is, within a load bound of
    # `routing_load_factor` times the mean load; `least_loaded` ignores
    # prefixes.
    routing_policy: Policy = Policy.PREFIX
    routing_load_factor: float = DEFAULT_LOAD_FACTOR
    # ... and never below this many requests per replica.
    routing_min_load_bound: int = DEFAULT_MIN_LOAD_BOUND
    # Place each live prompt prefix by what each replica's KV cache holds
    # (`inferd.gateway.placement`); off: by rendezvous hashing alone.
    routing_place_prefixes: bool = True
    # Prompts are hashed in blocks of this many bytes (about a quarter as many
    # tokens), at most `prefix_max_blocks` of them (the rest of a longer
    # prompt does not change where it goes).
    prefix_block_bytes: int = 512
    prefix_max_blocks: int = 64
    # Block hashes remembered with the replica they were sent to (LRU; about
    # 100 bytes each).
    prefix_table_entries: int = 65_536
    # Held requests are released by a fair share between the endpoint's
    # client tokens (`inferd.gateway.fairness`); off: first in, first out
    # over all of them (the batch priority class still applies).
    fair_queuing: bool = True
    # Of each replica's `max_in_flight_per_replica` slots, the share that
    # batch-priority requests leave free for interactive ones (at least one
    # slot when above 0, and never all of them): a batch request goes to a
    # replica only while it keeps that many free, and waits otherwise, so an
    # interactive request finds a slot without waiting for a batch one to
    # end. 0: batch requests may fill every slot.
    batch_reserved_share: float = 0.25
    # Stream migration (see `inferd.gateway.migration`): a stream whose
    # replica is lost after its first byte is continued on another replica,
    # at most `max_migrations` times per request; endpoints (by id)
    # in `migration_off_endpoints` end such a stream with an error instead.
    migration: bool = True
    max_migrations: int = 3
    migration_off_endpoints: frozenset[str] = frozenset()
    # What the client read of a stream is kept to continue it, up to this
    # many bytes of events per request (past it the stream is not migrated).
    migration_max_transcript_bytes: int = 4 * 1024 * 1024

    @property
    def batch_in_flight_per_replica(self) -> int:
        """The slots of a replica batch requests may fill (`batch_slots`)."""
        return batch_slots(self.max_in_flight_per_replica, self.batch_reserved_share)

    def migrates(self, endpoint_id: str) -> bool:
        return self.migration and endpoint_id not in self.migration_off_endpoints

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        if self.max_in_flight_per_replica < 1:
            raise ValueError("max_in_flight_per_replica must be at least 1")
        if min(self.max_held_requests, self.max_held_bytes_per_endpoint, self.max_held_bytes) < 0:
            raise ValueError("the hold bounds must not be negative")
        if self.held_request_overhead_bytes < 0:
            raise ValueError("held_request_overhead_bytes must not be negative")
        if min(self.max_hold_seconds, self.hold_poll_seconds, self.hold_progress_seconds) <= 0:
            raise ValueError(
                "max_hold_seconds, hold_poll_seconds and hold_progress_seconds must be positive"
            )
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.service_time_window < 1:
            raise ValueError("service_time_window must be at least 1")
        if self.routing_load_factor < 1:
            raise ValueError("routing_load_factor must be at least 1")
        if self.routing_min_load_bound < 1:
            raise ValueError("routing_min_load_bound must be at least 1")
        if self.prefix_block_bytes < 16 or self.prefix_max_blocks < 1:
            raise ValueError("prefix_block_bytes must be at least 16, prefix_max_blocks at least 1")
        if not 0 <= self.batch_reserved_share < 1:
            raise ValueError("batch_reserved_share must be at least 0 and below 1")
        if self.max_migrations < 0 or self.migration_max_transcript_bytes < 0:
            raise ValueError("max_migrations and migration_max_transcript_bytes must be >= 0")
        if self.prefix_table_entries < 1:
            raise ValueError("prefix_table_entries must be at least 1")


def batch_slots(max_in_flight: int, reserved_share: float) -> int:
    """In-flight slots of a replica that batch-priority requests may fill:
    all but `reserved_share` of them (rounded up, at least one when the
    share is above 0), kept free for interactive requests; never fewer than
    one, so that a batch still runs on a replica of one slot."""
    reserved = max(1, math.ceil(max_in_flight * reserved_share)) if reserved_share > 0 else 0
    return max(1, max_in_flight - reserved)
