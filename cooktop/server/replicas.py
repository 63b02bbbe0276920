"""Replicas of the server on a Ray cluster, through Ray Serve (``cooktop serve --ray ADDRESS --replicas N``).

Each replica is a Ray Serve replica running the same FastAPI app as ``cooktop
serve`` (:func:`cooktop.server.app.create_app`) on a ``Llama`` of its own: local
to the replica's node, or split across nodes when ``--device`` names them
(``cooktop.cluster``; the replica then owns its segment actors). Ray Serve's HTTP
proxy (on the head node) balances requests across replicas: each replica takes at
most ``-np + 1`` requests at a time (one waits in its queue), the rest wait in
Serve's queue (at most ``--max-queue``; more get 503) and go to whichever replica
frees first.

Faults: a segment that dies fails the requests running on that replica with a
503 naming the node (``ClusterError``); the replica's health check
(every :data:`HEALTH_PERIOD_S` s; three failures in a row) pings its segments, fails, and Ray Serve
replaces the replica, whose model is placed again (on the same nodes when it
names them, so it comes back once they do); the other replicas keep serving.
Every response carries ``x-cooktop-replica`` (the replica's id) and, for a split
model, ``x-cooktop-segments`` (``NODE/DEVICE=PID,...``: the process of each
segment); ``GET /cluster`` says the same as JSON.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from ..cluster import connect
from .app import ServerConfig, create_app

log = logging.getLogger("cooktop.server")

#: Seconds between Ray Serve's health checks of a replica, and how long one may take.
HEALTH_PERIOD_S = 1.0
HEALTH_TIMEOUT_S = 15.0
APP_NAME = "cooktop"


class CooktopReplica:
    """Body of one Ray Serve replica: a loaded ``Llama`` and the server app on it.

    Raises (from the constructor, so Ray Serve retries the replica): whatever loading raises.
    """

    def __init__(self, config: ServerConfig):
        from ray import serve

        from ..api import Llama

        self.config = config
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.llm = Llama(model_path=config.model_path, verbose=False, embedding=True, **config.llama_kwargs)
        self.llm.chat_template_choice()
        log.info("replica %s loaded %s", self.replica_id, config.model_path)

    def _model(self) -> Any:
        return self.llm._engine.model

    def cluster_info(self) -> dict[str, Any]:
        """``{"replica", "pid", "placement", "segments": [{"node", "selector", "pid", "weights"}]}``."""
        import ray

        segs = [{"node": s.node.name, "selector": s.selector, "pid": s.pid, "weights": s.how}
                for s in getattr(self._model(), "segments", []) if hasattr(s, "node")]
        return {"replica": self.replica_id, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "placement": self.llm._engine.placement.summary(), "segments": segs}

    def __serve_build_asgi_app__(self):
        from fastapi.responses import JSONResponse

        app = create_app(self.config, self.llm)
        replica = self.replica_id
        segments = ",".join(f"{s['selector']}={s['pid']}" for s in self.cluster_info()["segments"])

        tags = [(b"x-cooktop-replica", replica.encode())]
        if segments:
            tags.append((b"x-cooktop-segments", segments.encode()))

        class Tag:
            """Pure ASGI middleware adding ``tags`` to every HTTP response's headers (not Starlette's
            ``BaseHTTPMiddleware``, which would hide a client's disconnect from the endpoints)."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner

            async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
                async def tagged(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        message = {**message, "headers": [*message.get("headers", []), *tags]}
                    await send(message)
                await self.inner(scope, receive, tagged if scope["type"] == "http" else send)

        app.add_middleware(Tag)

        @app.get("/cluster")
        async def cluster() -> JSONResponse:
            return JSONResponse(await asyncio.to_thread(self.cluster_info))

        return app

    async def check_health(self) -> None:
        """Ray Serve's health check: every segment of a split model must answer (else the replica is replaced).

        Raises:
            ClusterError: a segment died or did not answer.
        """
        model = self._model()
        if hasattr(model, "check"):
            await asyncio.to_thread(model.check, HEALTH_TIMEOUT_S / 2)


def application(config: ServerConfig, n_replicas: int) -> Any:
    """The Ray Serve application of ``n_replicas`` :class:`CooktopReplica` s serving ``config``."""
    from ray import serve

    ingress = serve.ingress()(CooktopReplica)
    deployment = serve.deployment(
        name="cooktop", num_replicas=n_replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=config.n_parallel + 1, max_queued_requests=config.max_queue,
        health_check_period_s=HEALTH_PERIOD_S, health_check_timeout_s=HEALTH_TIMEOUT_S)(ingress)
    return deployment.bind(config)


def serve_forever(config: ServerConfig, ray_address: str | None, n_replicas: int, host: str, port: int,
                  on_ready: Callable[[], None] | None = None, stop: threading.Event | None = None) -> None:
    """Deploy :func:`application` on the cluster, listen on ``host:port`` (Serve's proxy on the head
    node) until SIGINT/SIGTERM (or ``stop``), then delete it. ``on_ready()`` runs once every replica is up.

    Raises:
        ClusterError: Ray missing, cluster unreachable. CooktopError: Ray Serve failed to deploy.
    """
    from ..errors import CooktopError

    connect(ray_address)
    from ray import serve

    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    stop = stop or threading.Event()
    try:
        serve.run(application(config, n_replicas), name=APP_NAME, route_prefix="/")
    except Exception as e:  # noqa: BLE001 - a replica failing to start, mostly
        _delete()
        raise CooktopError(f"Ray Serve could not start the replicas: {type(e).__name__}: "
                           f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from None
    if on_ready is not None:
        on_ready()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        _delete()


def _delete() -> None:
    """Remove the app; shut Serve down when nothing else is deployed there."""
    from ray import serve

    try:
        serve.delete(APP_NAME)
        if not serve.status().applications:
            serve.shutdown()
    except Exception as e:  # noqa: BLE001 - leaving anyway
        log.warning("could not remove the Ray Serve app: %s", e)
