"""The errors the client hands the application: one base type with a
stable ``code`` (docs/sdk.md, "Errors") and one sub-type per source.
Application code switches on ``code``, never on the message."""

from __future__ import annotations

from typing import Any, Dict


class MyriadError(Exception):
    """Every error of the SDK. ``code`` is stable; ``message`` is for humans."""

    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(message if message is not None else code)
        self.code = code
        self.message = message if message is not None else code


class ServerError(MyriadError):
    """The node answered a command with ``error``; ``code`` is the node's own."""


class PresenceFullError(ServerError):
    """``presence_full``: a subscribe to a presence subject that already holds
    its namespace's ``presence_max_members`` members. The subscription goes
    to ``unsubscribed`` with this error; subscribe again once members leave."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__("presence_full", message)
        self.subject = subject


def server_error(m: Dict[str, Any]) -> ServerError:
    """The node's ``error`` answer as a typed error: ``presence_full`` gets its own class."""
    message = str(m.get("message", m["code"]))
    if m["code"] == "presence_full":
        return PresenceFullError(str(m.get("subject", "")), message)
    return ServerError(m["code"], message)


class TimeoutError(MyriadError):  # noqa: A001 - the spec's name; not the builtin
    """A command was not answered in time (``code`` is ``timeout``)."""

    def __init__(self, what: str) -> None:
        super().__init__("timeout", f"{what} not answered in time")


class UnauthorizedError(MyriadError):
    """This user may not connect: raised by the application's ``get_token``
    when its backend refuses (``unauthorized``), or made by the client when
    the node refused a fresh token (``invalid_token``) or the backend's
    connect proxy refused it (``proxy_refused``, ``forbidden``; the message
    is the backend's reason). Terminal: the client goes to ``closed``."""

    def __init__(self, message: str = "unauthorized", code: str = "unauthorized") -> None:
        super().__init__(code, message)
