"""The wire: the shapes of docs/protocol.md's server messages as the client
reads them, the check that turns untrusted text into one of them (or
nothing), what a close code says about reconnecting, and the verdict of
the dedupe. No state lives here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

# A parsed server message: a JSON object with a known op and the fields it needs.
Message = Dict[str, Any]


@dataclass(frozen=True)
class Position:
    """A place in a subject's stream (docs/protocol.md, "Positions")."""

    epoch: str
    offset: int


@dataclass(frozen=True)
class Publication:
    """A publication handed to the application; ``data`` is the published JSON."""

    subject: str
    epoch: str
    offset: int
    data: Any


@dataclass(frozen=True)
class Member:
    """A member of a presence subject (docs/protocol.md, "Presence"): one
    connection. ``conn`` is its id, unique in the cluster while it lives;
    ``user`` None when anonymous; ``info`` the token's claim, None without."""

    conn: str
    user: Optional[str]
    info: Any = None


@dataclass(frozen=True)
class PresenceEvent:
    """A ``join`` or ``leave`` of a subject's presence."""

    subject: str
    member: Member


def member(m: Dict[str, Any]) -> Member:
    """A member object of the wire (checked by ``parse_server_message`` or the API's answer)."""
    return Member(m["conn"], m.get("user"), m.get("info"))


@dataclass(frozen=True)
class PresencePage:
    """One page of a presence subject's members, in member-id order."""

    subject: str
    members: List[Member]
    # The cursor of the next page; None on the last.
    next: Optional[str]


@dataclass(frozen=True)
class PresenceStats:
    """A presence subject's exact counts."""

    subject: str
    connections: int
    users: int


def presence_page(subject: str, m: Message) -> PresencePage:
    """A ``presence`` answer (command or API) as a page."""
    return PresencePage(subject, [member(x) for x in m.get("members") or []], m.get("next"))


def presence_stats(subject: str, m: Message) -> PresenceStats:
    """A ``presence_stats`` answer (command or API) as counts."""
    return PresenceStats(subject, int(m["connections"]), int(m["users"]))


KNOWN_OPS = frozenset({"msg", "subscribed", "error", "ok", "pong", "history", "presence", "presence_stats", "join", "leave"})

# 4501 token_expired: get a new token before reconnecting.
TOKEN_EXPIRED = 4501

#: The answers to ``connect`` that refuse its credentials (docs/sdk.md,
#: "Tokens"): the node's ``invalid_token``, the backend proxy's
#: ``proxy_refused`` or ``forbidden``. Final for that token; any other
#: answer is an attempt that failed.
CREDENTIALS_REFUSED = frozenset({"invalid_token", "proxy_refused", "forbidden"})

#: The refusals of a subscribe that pass (docs/sdk.md, "Subscription
#: states"): sent again after a delay, while connected.
SUBSCRIBE_AGAIN = frozenset(
    {"unavailable", "rate_limited", "timeout", "proxy_unavailable", "proxy_busy", "too_many_held"}
)

_MAX_SAFE = 2**53 - 1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_SAFE


def _position(m: Message) -> bool:
    return isinstance(m.get("epoch"), str) and _int(m.get("offset"))


def parse_server_message(text: Any) -> Tuple[Optional[Message], Optional[str]]:
    """Parses one message from the node. The message is returned only for a
    JSON object with a known op and the fields it needs; the op whenever the
    object had a string ``op``, so the caller can tell an unknown op from a
    malformed message."""
    if not isinstance(text, str):
        return None, None
    try:
        value = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(value, dict):
        return None, None
    op = value.get("op")
    if not isinstance(op, str):
        return None, None
    if "id" in value and not _int(value["id"]):
        return None, op
    if op == "msg":
        # The checks of _position spelt out: this branch runs for every
        # publication, and the calls were a tenth of the client's CPU a
        # message. `type(…) is int` refuses bools, as _int does.
        offset = value.get("offset")
        ok = (
            type(value.get("subject")) is str
            and type(value.get("epoch")) is str
            and type(offset) is int
            and 0 <= offset <= _MAX_SAFE
            and "data" in value
        )
    elif op == "subscribed":
        ok = (
            isinstance(value.get("subject"), str)
            and _position(value)
            and value.get("recovered", False) in (True, False)
        )
    elif op == "error":
        ok = isinstance(value.get("code"), str)
    elif op in ("join", "leave"):
        m = value.get("member")
        ok = isinstance(value.get("subject"), str) and isinstance(m, dict) and isinstance(m.get("conn"), str)
    elif op in ("ok", "pong", "history", "presence", "presence_stats"):
        ok = True
    else:
        return None, op
    return (value if ok else None), op


def may_reconnect(code: int) -> bool:
    """Whether a close with ``code`` lets the client reconnect as it is
    (docs/protocol.md, "Close reasons"): not 1002, 1003, 1007, 1009, nor the
    45xx range ("do not reconnect unchanged")."""
    return not (code in (1002, 1003, 1007, 1009) or 4500 <= code <= 4999)


Verdict = Literal["deliver", "duplicate", "gap", "epoch_changed"]


def judge(position: Optional[Union[Position, Publication]], epoch: str, offset: int) -> Verdict:
    """What to do with a publication at (epoch, offset) for a subscription at
    ``position`` (docs/sdk.md, "Recovery and dedupe"): a Position, or the
    last publication handed over, which is at its own."""
    if position is None:
        return "deliver"
    if epoch != position.epoch:
        return "epoch_changed"
    if offset <= position.offset:
        return "duplicate"
    return "deliver" if offset == position.offset + 1 else "gap"
