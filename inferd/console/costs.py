"""What a choice costs: the envelope of scaling settings, and a settings
change. Pure functions of prices; the console shows them before saving."""

from __future__ import annotations

from dataclasses import dataclass

# Hours in an average month (365.25 x 24 / 12).
HOURS_PER_MONTH = 730.5


@dataclass(frozen=True)
class Envelope:
    """The cost range that min/max replicas imply at one replica's hourly price."""

    hourly_price: float
    min_replicas: int
    max_replicas: int

    @property
    def idle_floor_per_hour(self) -> float:
        return self.min_replicas * self.hourly_price

    @property
    def idle_floor_per_month(self) -> float:
        """What the endpoint costs with no traffic at all (minReplicas kept up)."""
        return self.idle_floor_per_hour * HOURS_PER_MONTH

    @property
    def ceiling_per_hour(self) -> float:
        """The most one hour can cost (every replica up)."""
        return self.max_replicas * self.hourly_price

    @property
    def ceiling_per_month(self) -> float:
        return self.ceiling_per_hour * HOURS_PER_MONTH


@dataclass(frozen=True)
class SettingsChange:
    before: Envelope
    after: Envelope

    @property
    def floor_delta_per_month(self) -> float:
        return self.after.idle_floor_per_month - self.before.idle_floor_per_month

    @property
    def ceiling_delta_per_hour(self) -> float:
        return self.after.ceiling_per_hour - self.before.ceiling_per_hour

    @property
    def price_delta_per_hour(self) -> float:
        return self.after.hourly_price - self.before.hourly_price


def cost_so_far(replica_seconds: float, hourly_price: float) -> float:
    return replica_seconds / 3600 * hourly_price
