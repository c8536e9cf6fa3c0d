"""Who goes next when an endpoint is at capacity: a fair share between clients.

Every request belongs to a client: the endpoint owner's token (client "")
or one of its named client tokens. Held requests are released by a virtual
token counter per client (VTC, Sheng et al., "Fairness in Serving Large
Language Models", OSDI 2024): each client's counter grows by the tokens it
was served divided by its weight, and the next slot goes to the waiting
client with the smallest counter (its oldest request). A client sending
10x the others gets its weighted share while others wait and all of the
capacity when nobody else does; a light client never waits behind a heavy
one's backlog.

Two details from the paper keep it fair over time:
- A client that starts waiting again is lifted to the smallest counter of
  those waiting (or, with nobody waiting, to the counter of the last client
  that stopped waiting), so an idle spell banks no credit to burst with.
- Tokens are charged when a request is released, as an estimate (its
  prompt, from the body's size, plus the client's recent mean completion),
  then corrected by what its answer reported when it ends (the paper's
  "VTC with length prediction"): a client with many long generations in
  flight is charged for them before they finish.

A priority class sits above the share: a `batch` request is released only
when no interactive request is held for the endpoint (batch requests share
among themselves by the same counters).

Pure: `Claim`, `FairShare` and `Picker` hold numbers and no I/O; the hold
queue (`inferd.gateway.hold`) applies them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

OWNER = ""  # the client of the endpoint owner's token
# Characters per prompt token, for the estimate charged at release (the
# answer's own usage corrects it).
BYTES_PER_TOKEN = 4
# Weight of the newest completion in a client's expected completion length.
_EXPECTED_OUTPUT_ALPHA = 0.2
# Clients remembered per endpoint past which the idle ones are forgotten
# (tokens per endpoint are bounded far below; this bounds revoke-and-create).
MAX_CLIENTS = 1024


@dataclass(frozen=True)
class Claim:
    """What the release policy knows of one request."""

    client: str = OWNER
    weight: float = 1.0
    batch: bool = False
    cost: float = 0.0  # tokens charged when it is released (an estimate)
    # Runs only on replicas up for other reasons (`inferd.gateway.inprocess`):
    # never held for a replica to start, and no load to the autoscaler.
    background: bool = False


INTERACTIVE_OWNER = Claim()


class FairShare:
    """The virtual token counters of one endpoint's clients."""

    __slots__ = ("counters", "expected_output", "floor")

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        # A client's recent mean completion tokens (its length prediction).
        self.expected_output: dict[str, float] = {}
        # The counter of the last client that stopped waiting.
        self.floor = 0.0

    def estimate(self, client: str, body_bytes: int) -> float:
        """Tokens a request is charged when released: its prompt (from its
        body's size) plus the client's expected completion."""
        return body_bytes / BYTES_PER_TOKEN + self.expected_output.get(client, 0.0)

    def started_waiting(self, client: str, waiting: Iterable[str]) -> None:
        """`client` has a request held and had none: lift its counter to the
        smallest of the clients waiting (`waiting`, itself excluded), or to
        the floor when nobody else waits."""
        others = [self.counters.get(c, 0.0) for c in waiting if c != client]
        lifted = min(others) if others else self.floor
        self.counters[client] = max(self.counters.get(client, 0.0), lifted)

    def stopped_waiting(self, client: str) -> None:
        self.floor = self.counters.get(client, 0.0)

    def charge(self, claim: Claim, tokens: float) -> None:
        self.counters[claim.client] = self.counters.get(claim.client, 0.0) + tokens / claim.weight

    def settle(self, claim: Claim, prompt_tokens: int, completion_tokens: int) -> None:
        """The answer reported its usage: charge what the estimate missed
        (or give back what it overcharged) and learn the completion length."""
        self.charge(claim, prompt_tokens + completion_tokens - claim.cost)
        old = self.expected_output.get(claim.client)
        self.expected_output[claim.client] = (
            float(completion_tokens)
            if old is None
            else old + _EXPECTED_OUTPUT_ALPHA * (completion_tokens - old)
        )

    def forget_idle(self, waiting: Iterable[str]) -> None:
        """Past `MAX_CLIENTS`, drop the counters of clients not waiting."""
        if len(self.counters) <= MAX_CLIENTS:
            return
        keep = set(waiting)
        for client in [c for c in self.counters if c not in keep]:
            self.counters.pop(client, None)
            self.expected_output.pop(client, None)


class Picker:
    """The order held requests are released in, one at a time: the waiting
    client with the smallest counter, its oldest request first. Ties go to
    the client with fewer requests waiting (a client that just started
    waiting is lifted to exactly the smallest counter: it goes before the
    backlog it was lifted to), then to the one whose oldest request came
    first (one client alone is first in, first out). Batch requests only once every interactive one
    has been placed. Works on a copy of the counters: `placed` charges the
    copy, so that the next pick sees the last one."""

    __slots__ = ("_batch", "_claims", "_counters", "_interactive_left", "_queues")

    def __init__(self, claims: Sequence[Claim], counters: Mapping[str, float]) -> None:
        self._claims = claims
        self._counters = dict(counters)
        interactive: dict[str, deque[int]] = {}
        self._batch: dict[str, deque[int]] = {}
        for index, claim in enumerate(claims):
            queues = self._batch if claim.batch else interactive
            queues.setdefault(claim.client, deque()).append(index)
        self._queues = interactive
        # Interactive requests not placed yet: while any is held, placeable
        # now or not, no batch request goes.
        self._interactive_left = len(claims) - sum(len(q) for q in self._batch.values())

    def next(self) -> int | None:
        """The next request to try; None when none is left."""
        if not self._queues and self._interactive_left == 0 and self._batch:
            self._queues, self._batch = self._batch, {}
        best: tuple[float, int, int] | None = None
        best_client = ""
        for client, queue in self._queues.items():
            key = (self._counters.get(client, 0.0), len(queue), queue[0])
            if best is None or key < best:
                best, best_client = key, client
        if best is None:
            return None
        queue = self._queues[best_client]
        index = queue.popleft()
        if not queue:
            del self._queues[best_client]
        return index

    def placed(self, index: int) -> None:
        claim = self._claims[index]
        if not claim.batch:
            self._interactive_left -= 1
        self._counters[claim.client] = (
            self._counters.get(claim.client, 0.0) + claim.cost / claim.weight
        )
