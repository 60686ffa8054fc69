"""The pause before a reconnect attempt (docs/sdk.md, "Reconnect:
back-off"): exponential with full jitter, so that clients cut off together
do not come back together."""

from __future__ import annotations

from typing import Callable


def backoff(attempt: int, minimum: float, maximum: float, random: Callable[[], float]) -> float:
    """The pause in seconds before attempt ``attempt`` (1 is the first of an
    outage): uniform in [0, min(maximum, minimum × 2^(attempt − 1))). The
    exponent is capped so that a long outage cannot overflow. Rounded down to
    the millisecond, as the TypeScript client does."""
    ceiling = min(maximum, minimum * 2 ** min(max(attempt - 1, 0), 30))
    return int(random() * ceiling * 1000) / 1000
