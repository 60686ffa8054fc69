"""Typed-enough events for one object. A listener never stalls nor breaks
the emitter's caller (the client's read loop): a plain function is called
in place and its exception is handed to ``caught``, which the client counts
and reports (docs/sdk.md, "Objects"); a coroutine function is started as its
own task, so slow work never delays later messages, and its exception goes
to ``caught`` as well."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Dict, Set, Tuple


Listener = Callable[[Any], Any]


class Emitter:
    def __init__(self) -> None:
        # Tuples, replaced on each change rather than changed in place: an
        # emit walks the tuple it found, so a listener added or removed by a
        # listener waits for the next event, without a copy on every emit.
        self._listeners: Dict[str, Tuple[Listener, ...]] = {}
        # Tasks of coroutine listeners still running: held so they are not
        # collected before they finish.
        self._tasks: Set["asyncio.Task[Any]"] = set()
        # Where a listener's exception goes; set by the client.
        self.caught: Callable[[BaseException], None] = lambda error: None

    def _add(self, name: str, listener: Listener) -> Callable[[], None]:
        """Adds ``listener`` for ``name``; returns a function that removes it.
        The subclasses' typed ``on`` calls it."""
        self._listeners[name] = self._listeners.get(name, ()) + (listener,)
        return lambda: self.off(name, listener)

    def off(self, name: str, listener: Listener) -> None:
        listeners = self._listeners.get(name, ())
        if listener in listeners:
            i = listeners.index(listener)
            self._listeners[name] = listeners[:i] + listeners[i + 1 :]

    def _emit(self, name: str, payload: Any) -> None:
        for listener in self._listeners.get(name, ()):
            try:
                result = listener(payload)
                if result is not None and inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(self._task_done)
            except Exception as error:  # noqa: BLE001 - a listener's failure is the application's
                self.caught(error)

    def _task_done(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            assert error is not None
            self.caught(error)
