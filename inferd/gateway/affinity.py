"""What prefix a request carries, without a tokenizer, and where this gateway
sent prefixes before.

A chat request's prompt is its `messages` array (a completion's, its
`prompt`), and a conversation's next turn repeats the previous turn's bytes
and appends to them. So the raw body, from that key on, is cut into blocks of
`block_bytes` and each full block gets a chained CRC-32: block k's hash
covers the blocks before it, like vLLM's own block hashes cover every token
before. No JSON parsing and no tokenizer. To stay within the gateway's CPU
budget, only the last `SAMPLE_BYTES` of each block are hashed: two prompts
that differ only inside the unhashed bytes, at equal lengths, look alike and
are sent to the same replica (a lost cache hit at worst, never a wrong
answer); any insertion or deletion shifts every byte after it and is seen.

Two things come out of it:
- `home`: the hash of the first block (seeded with the endpoint and the
  adapter). It is the same for every turn of a conversation and for every
  request sharing a system prompt, and the same in every `inferd serve`
  process (CRC-32 is not salted per process as `hash()` is), so rendezvous
  hashing on it (`routing.choose_replica`) makes instances agree without
  talking to each other.
- the chain of block hashes, which `PrefixTable` maps to the replica each
  prefix was first sent to: a turn that was spilled off its home replica
  (load bound) keeps following the replica that holds its own conversation,
  while the shared part (a system prompt) stays where it first went.
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

# Where the prompt starts in a request body; whatever comes before (model,
# stream, sampling knobs) must not change a prefix's hash.
_PROMPT_KEYS = (b'"messages"', b'"prompt"', b'"input"')
# The requested model (an adapter's name when it is not the base model's) is
# one of the first or last keys of every client's body; searching only there
# keeps the cost flat however long the prompt is.
_MODEL = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,200})"')
_MODEL_WINDOW = 512
# Bytes hashed per block (the block's last ones): a quarter of a 512-byte
# block; measured in benchmarks/gateway_overhead.py.
SAMPLE_BYTES = 128


@dataclass(frozen=True)
class RequestPrefix:
    # Rendezvous key: seeded hash of the first block; None when the prompt is
    # shorter than one block (nothing worth keeping a cache for).
    home: int | None
    # Chained hashes of the full blocks, first block first.
    blocks: tuple[int, ...]
    adapter: str | None


def requested_model(body: bytes) -> str | None:
    """The `model` field's value, looked for near either end of the body."""
    head = _MODEL.search(body, 0, _MODEL_WINDOW)
    if head is None and len(body) > _MODEL_WINDOW:
        head = _MODEL.search(body, len(body) - _MODEL_WINDOW)
    if head is None:
        return None
    try:
        return head.group(1).decode()
    except UnicodeDecodeError:
        return None


def request_prefix(
    body: bytes,
    endpoint_id: str,
    *,
    base_model: str,
    block_bytes: int,
    max_blocks: int,
) -> RequestPrefix:
    """The prefix hashes of one request body (see the module docstring)."""
    model = requested_model(body)
    adapter = model if model and model != base_model else None
    start = -1
    for key in _PROMPT_KEYS:
        start = body.find(key)
        if start >= 0:
            break
    start = max(start, 0)
    end = min(len(body), start + block_bytes * max_blocks)
    # The adapter changes every cached key (vLLM keys KV blocks by LoRA too).
    h = zlib.crc32(f"{endpoint_id}\0{adapter or ''}".encode())
    view = memoryview(body)
    blocks = []
    crc32 = zlib.crc32
    sample = min(SAMPLE_BYTES, block_bytes)
    for stop in range(start + block_bytes, end + 1, block_bytes):
        h = crc32(view[stop - sample : stop], h)
        blocks.append(h)
    return RequestPrefix(blocks[0] if blocks else None, tuple(blocks), adapter)


class PrefixTable:
    """Block hash -> the replica this gateway first sent that prefix to.

    Bounded: at most `max_entries` hashes, least recently used evicted first.
    An entry is an int key in an ordered dict pointing at a shared replica id
    string: about 100 bytes, so the default 65,536 entries stay under 8 MiB
    per gateway. Entries of replicas that went away are not hunted down: the
    routing choice ignores a replica that is not ready, and the next request
    with that prefix overwrites them.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._where: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def lookup(self, blocks: Sequence[int]) -> str | None:
        """The replica holding the longest known prefix of these blocks."""
        where = self._where
        for h in reversed(blocks):
            replica_id = where.get(h)
            if replica_id is not None:
                where.move_to_end(h)
                return replica_id
        return None

    def record(
        self, blocks: Sequence[int], replica_id: str, serving: Callable[[], Container[str]]
    ) -> None:
        """Note that these blocks were sent to `replica_id`. A block already
        placed on another replica that is still `serving()` (the ids of the
        replicas taking requests, asked at most once, and only when a block
        was placed elsewhere) stays there: a request spilled off a prefix's
        replica by the load bound leaves a copy elsewhere, but the next
        request of that prefix should still go where it first went, so that
        each prefix lives on one replica and the fleet's caches add up
        (rather than every replica holding the hot prefixes and evicting the
        rest). Blocks of a replica that stopped serving move here."""
        where = self._where
        serving_now: Container[str] | None = None
        for h in blocks:
            placed = where.get(h)
            if placed is not None and placed != replica_id:
                if serving_now is None:
                    serving_now = serving()
                if placed not in serving_now:
                    where[h] = replica_id
            elif placed is None:
                where[h] = replica_id
            where.move_to_end(h)
        while len(where) > self.max_entries:
            where.popitem(last=False)
