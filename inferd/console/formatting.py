"""Jinja filters: how money, rates, durations and times read on a page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def money(value: float | None, currency: str = "USD") -> str:
    """Cents for amounts of a cent or more; more digits below (a token costs
    a tiny fraction of a cent, and '0.00' would hide it)."""
    if value is None:
        return "-"
    if value == 0:
        return f"0.00 {currency}"
    if abs(value) >= 0.01:
        return f"{value:,.2f} {currency}"
    return f"{value:.6f}".rstrip("0") + f" {currency}"


def signed_money(value: float, currency: str = "USD") -> str:
    text = money(abs(value), currency)
    return ("+" if value > 0 else "-" if value < 0 else "±") + text


def duration(seconds: float | int | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def clock_time(text: str | None) -> str:
    """RFC 3339 -> 'YYYY-MM-DD HH:MM:SS UTC' (what a person reads)."""
    if not text:
        return "-"
    return text.replace("T", " ")[:19] + " UTC"


# The API's status values as a person reads them (the API keeps its values).
_STATUS_WORDS = {
    "scaledToZero": "scaled to zero",
    "initializing": "starting",
}


def status_word(status: str | None) -> str:
    if not status:
        return "-"
    return _STATUS_WORDS.get(status, status)


FILTERS: dict[str, Callable[..., Any]] = {
    "status_word": status_word,
    "money": money,
    "signed_money": signed_money,
    "duration": duration,
    "number": number,
    "clock_time": clock_time,
}
