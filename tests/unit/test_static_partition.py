"""The routing benchmark's reference: the best static partition's hit rate."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from static_partition import best_static_hit_rate, replay


def conversation(group: int, prompt_blocks: int, turns: int) -> list[tuple[int, list[int]]]:
    """A system prompt of `prompt_blocks` 4-token blocks, then turns that
    each add one block."""
    tokens = [1000 * group + i for i in range(4 * prompt_blocks)]
    out = []
    for turn in range(turns):
        tokens = [*tokens, *[-(1000 * group + 10 * turn + i) for i in range(4)]]
        out.append((group, tokens))
    return out


def test_a_replayed_conversation_hits_its_earlier_turns() -> None:
    requests = conversation(0, 3, 2)  # 16 then 20 tokens
    hits, queries = replay(requests, {0: 0}, capacity_blocks=100, block_size=4)
    assert queries == 36
    assert hits == 16  # the second turn finds the first turn's 4 blocks


def test_the_last_token_is_never_found() -> None:
    requests = [(0, list(range(8))), (0, list(range(8)))]
    assert replay(requests, {0: 0}, capacity_blocks=100, block_size=4) == (4, 16)


def test_the_best_partition_splits_what_one_cache_cannot_hold() -> None:
    # 4 prompts of 10 blocks (12 with their turns), caches of 26 blocks:
    # two fit a replica, three thrash it.
    requests = []
    for turn in range(3):
        for g in range(4):
            requests.append(conversation(g, 10, 3)[turn])
    rate, on = best_static_hit_rate(requests, replicas=2, capacity_blocks=26, block_size=4)
    assert sorted(list(on.values()).count(r) for r in (0, 1)) == [2, 2]
    three_one = {0: 0, 1: 0, 2: 0, 3: 1}
    hits, queries = replay(requests, three_one, 26, 4)
    assert rate > hits / queries
    assert rate == replay(requests, on, 26, 4)[0] / queries


def test_more_replicas_than_exhaustive_search_covers() -> None:
    requests = [r for g in range(6) for r in conversation(g, 10, 3)]
    rate, on = best_static_hit_rate(requests, replicas=3, capacity_blocks=26, block_size=4)
    assert sorted(list(on.values()).count(r) for r in range(3)) == [2, 2, 2]
    assert rate > 0.5
