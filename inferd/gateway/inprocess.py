"""What marks a request the server makes to its own gateway, in-process
(the Batch API's; `inferd.gateway.caller` makes them).

They take the path a client's request takes (token check, routing,
adapters, hold at zero, retries, metering), as an ASGI call with no socket.
Two things only in-process code can put on an ASGI scope, since a server
builds the scope of a request from the wire and never copies keys into it:
- `inferd.priority` = `batch`: the gateway's hold releases it only when no
  interactive request waits (`inferd.gateway.hold`);
- `inferd.grant`: an `InProcessGrant` for one endpoint, standing for the
  token that was shown when the work was created (a batch is created with
  one of the endpoint's tokens, which are kept only as hashes). The gateway
  takes it in place of a token for that endpoint alone, as the client whose
  token it stands for: that client's share, rate limit and usage (a client
  token revoked since is refused, as the token itself would be). A grant
  marked `background` (a batch created with `capacity: running`) runs only
  on replicas that are up for other reasons: refused at once (503
  `no_ready_replica`) while none is ready, so it wakes none, and left out of
  the load the autoscaler reads (`inferd.gateway.traffic`), so it keeps none
  up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.gateway.fairness import OWNER

PRIORITY_KEY = "inferd.priority"
PRIORITY_HEADER = b"x-inferd-priority"
BATCH_PRIORITY = "batch"
GRANT_KEY = "inferd.grant"


@dataclass(frozen=True)
class InProcessGrant:
    """Work this process runs for an endpoint, authorized when it was
    created (`why`: what it is, for logs: a batch's id)."""

    endpoint_id: str
    why: str
    # Whose token it stands for: OWNER ("") or a client token's name.
    client: str = OWNER
    # Only on replicas up anyway: it neither wakes the endpoint nor keeps it up.
    background: bool = False


def granted(scope: Any, endpoint_id: str) -> bool:
    return grant_of(scope, endpoint_id) is not None


def grant_of(scope: Any, endpoint_id: str) -> InProcessGrant | None:
    """The scope's grant when it is one for `endpoint_id`, else None."""
    grant = scope.get(GRANT_KEY)
    if isinstance(grant, InProcessGrant) and grant.endpoint_id == endpoint_id:
        return grant
    return None
