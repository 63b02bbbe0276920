"""Sleeping on idle (llama-server's ``--sleep-idle-seconds``): after that many seconds without a
request, the model, its KV caches and its slots are freed; the next request that needs the model loads
it again before it is answered.

As llama-server (tools/server/server-queue.cpp ``start_loop``, server-context.cpp
``handle_sleeping_state``, ``update_cached_responses``): ``GET /health``, ``/metrics``, ``/props`` and
``/v1/models`` answer while asleep without waking it (``/props`` and ``/models`` from the copies kept
when it fell asleep, ``is_sleeping: true``; ``/metrics`` from the counters, which survive the sleep,
with nothing running); every other request wakes it, and waits for the model. The idle clock starts
when the last request in flight ends. A model that cannot be loaded again answers that request with a
500 naming the reason and is tried again on the next one (llama-server aborts then).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("cooktop.server")

#: (method, path) answered without waking the model (the paths under ``/v1/models/`` too)
BYPASS = frozenset({("GET", "/health"), ("GET", "/v1/health"), ("GET", "/metrics"), ("GET", "/props"),
                    ("GET", "/models"), ("GET", "/v1/models")})


def bypasses(method: str, path: str) -> bool:
    """True when ``method path`` answers without the model (:data:`BYPASS`, ``GET /v1/models/ID``)."""
    return (method, path) in BYPASS or (method == "GET" and path.startswith(("/models/", "/v1/models/")))


class IdleSleep:
    """The idle clock of one server and its watcher thread.

    Args:
        state: the :class:`~cooktop.server.app.ServerState` (its ``sleep()`` / ``wake()`` free and load
            the model; its ``sleeping`` flag).
        seconds: idle seconds before sleeping (``--sleep-idle-seconds``; > 0).

    Requests call :meth:`enter` (on a thread: it may load the model) and :meth:`leave`; the watcher
    puts the server to sleep once no request has been in flight for ``seconds``, holding the same lock,
    so a request never sees the model go away under it.

    Raises:
        ValueError: ``seconds`` not positive.
    """

    def __init__(self, state: Any, seconds: float):
        if not seconds > 0:
            raise ValueError(f"--sleep-idle-seconds {seconds}: expected a positive number of seconds (or -1: never)")
        self.state, self.seconds = state, float(seconds)
        self.in_flight = 0
        self.last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cooktop-sleep", daemon=True)

    def start(self) -> None:
        """Start the watcher thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher thread (the server is shutting down) and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def enter(self) -> None:
        """A request that needs the model begins: counted in flight, and the model loaded first when
        the server sleeps (blocking: call it on a worker thread). A failed reload leaves the server
        asleep with ``state.wake_error`` set for that request's answer."""
        with self._lock:
            self.in_flight += 1
            if self.state.sleeping:
                log.info("server is leaving the sleeping state")
                self.state.wake()

    def leave(self) -> None:
        """A request that :meth:`enter` counted has ended: the idle clock restarts."""
        with self._lock:
            self.in_flight -= 1
            self.last = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last request ended (0 while one is in flight or a job runs)."""
        sched = self.state.scheduler
        if self.in_flight or (sched is not None and (sched.busy or sched.queue_depth)):
            return 0.0
        return time.monotonic() - self.last

    def _watch(self) -> None:
        tick = min(0.1, self.seconds / 10)
        while not self._stop.wait(tick):
            with self._lock:
                if self.state.sleeping or self.state.scheduler is None:
                    continue
                if self.idle_for() >= self.seconds:
                    log.info("server is entering the sleeping state (idle for %.0f s)", self.seconds)
                    self.state.sleep()
