"""The prefix-cache hit rate of the best static partition of a run's prompts
over the replicas: the reference a routing policy's hit rate is read against.

Each system prompt (a group: its conversations with it) lives on one
replica; each replica is an LRU cache of `capacity_blocks` KV blocks hashed
as vLLM hashes them (full blocks of `block_size` tokens, each hash covering
every token before it; the prompt's last token is always computed, never
found); the requests are replayed in the order the run sent them. All
partitions are tried for 2 replicas and up to `EXHAUSTIVE_GROUPS` groups;
otherwise the most even split of the groups' working sets, improved by
single moves while that raises the hit rate.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

EXHAUSTIVE_GROUPS = 12

# (group, prompt token ids) per request, in the order sent.
Requests = Sequence[tuple[int, Sequence[int]]]


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    out, h = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[start : start + block_size])))
        out.append(h)
    return out


def replay(
    requests: Requests, on: dict[int, int], capacity_blocks: int, block_size: int
) -> tuple[int, int]:
    """(tokens found, tokens looked up) with group g's requests on replica on[g]."""
    return _replay(_hashed(requests, block_size), on, capacity_blocks, block_size)


# (group, prompt tokens, its block hashes) per request.
_Hashed = list[tuple[int, int, list[int]]]


def _hashed(requests: Requests, block_size: int) -> _Hashed:
    return [(group, len(tokens), block_hashes(tokens, block_size)) for group, tokens in requests]


def _replay(
    requests: _Hashed, on: dict[int, int], capacity_blocks: int, block_size: int
) -> tuple[int, int]:
    caches: dict[int, OrderedDict[int, None]] = {}
    hits = queries = 0
    for group, length, hashes in requests:
        cache = caches.setdefault(on[group], OrderedDict())
        found = 0
        for h in hashes[: max(0, (length - 1) // block_size)]:
            if h not in cache:
                break
            found += 1
        hits += found * block_size
        queries += length
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hits, queries


def best_static_hit_rate(
    requests: Requests, replicas: int, capacity_blocks: int, block_size: int
) -> tuple[float, dict[int, int]]:
    groups = sorted({g for g, _ in requests})
    if not groups or replicas < 1:
        return 0.0, {}
    hashed = _hashed(requests, block_size)

    def rate(on: dict[int, int]) -> float:
        hits, queries = _replay(hashed, on, capacity_blocks, block_size)
        return hits / queries if queries else 0.0

    if replicas == 1:
        on = {g: 0 for g in groups}
        return rate(on), on
    if replicas == 2 and len(groups) <= EXHAUSTIVE_GROUPS:
        best: tuple[float, dict[int, int]] = (-1.0, {})
        first, *rest = groups
        for sides in itertools.product((0, 1), repeat=len(rest)):
            on = {first: 0, **dict(zip(rest, sides, strict=True))}
            best = max(best, (rate(on), on), key=lambda x: x[0])
        return best
    # The most even split of the working sets, then single moves.
    size = {g: 0 for g in groups}
    for g, tokens in requests:
        size[g] = max(size[g], len(tokens))
    load = [0] * replicas
    on = {}
    for g in sorted(groups, key=lambda g: -size[g]):
        r = min(range(replicas), key=lambda i: load[i])
        on[g] = r
        load[r] += size[g]
    current = rate(on)
    improved = True
    while improved:
        improved = False
        for g, r in itertools.product(groups, range(replicas)):
            if on[g] == r:
                continue
            moved = {**on, g: r}
            if (x := rate(moved)) > current:
                on, current, improved = moved, x, True
    return current, on
