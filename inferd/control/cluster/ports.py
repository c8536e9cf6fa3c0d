"""The `Coordination` port: how the instances of one control plane agree on
who leads, share their gateways' load and wake the leader.

A single instance is a cluster of one (`Solo`: it leads at once, nobody
else publishes load, a wake-up rings its own reconciler); instances sharing
a PostgreSQL elect one leader and talk through the database (`Postgres`).
The rest of the control plane sees only this port, so both run modes take
one code path. One contract suite runs against both adapters
(`tests/contract/test_coordination.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from inferd.control.model import Deposed as Deposed  # raised by the stores too: defined below them


class LeaderDuties(Protocol):
    """What the leader runs: started with the term on election, stopped the
    moment leadership ends (and again on shutdown; both idempotent)."""

    async def start(self, term: int) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads, as this instance last knew it (`GET /healthz`). All None
    while it cannot tell (it lost its lead and has not read the row since)."""

    term: int | None
    holder: str | None
    since: datetime | None = None
    heartbeat_at: datetime | None = None


class Coordination(Protocol):
    """What the rest of the control plane calls, and nothing more: join and
    leave, the term that fences this instance's writes, a wake-up for the
    leader, and the health line. How an adapter shares load (`Postgres`'s
    load rows, fed by constructor callbacks) and confirms a term are its own
    (the contract suite checks them on both adapters)."""

    @property
    def ends_with_instance(self) -> bool:
        """True for a cluster of one: when its instance stops, nobody adopts
        the replicas, so the instance stops them; False where another
        instance takes over and adopts them."""
        ...

    @property
    def term(self) -> int | None:
        """The term this instance leads under (the fence of its writes);
        None while it does not lead."""
        ...

    async def start(self, duties: LeaderDuties) -> None:
        """Join: publish this gateway's load, take part in the election.
        `duties` are started with the term each time this instance is
        elected and stopped when its lead ends. Returns at once (`Solo`:
        after its duties started)."""
        ...

    async def stop(self) -> None:
        """Leave: the duties stop, the lead and this instance's load go with
        it, so another instance takes over at once. Idempotent."""
        ...

    def wake(self, endpoint_id: str) -> None:
        """A request is held with no replica ready: wake the leader's
        reconciler wherever it runs. Never waits (the gateway's path)."""
        ...

    def health(self) -> dict[str, Any]:
        """This instance and its leader, as `GET /healthz` shows them."""
        ...
