"""What the client reads from a token: only its ``exp``, to refresh before
it (docs/sdk.md, "Tokens"). The node checks the signature; the client never
needs to."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Optional


def token_exp(token: str) -> Optional[float]:
    """The ``exp`` claim (Unix seconds) of a JWT, or None when it has none or is no JWT."""
    parts = token.split(".")
    if len(parts) < 2 or not parts[1]:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, (int, float)) and not isinstance(exp, bool) and math.isfinite(exp):
        return float(exp)
    return None


def refresh_delay(exp: float, now: float) -> float:
    """Seconds from ``now`` until the refresh of a token expiring at ``exp``:
    ``exp − min(30 s, remaining / 2)``, never negative."""
    remaining = exp - now
    return max(0.0, remaining - min(30.0, remaining / 2))
