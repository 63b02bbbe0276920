"""Router mode (llama-server's ``llama-server`` without a model, tools/server/server-models.cpp): one
server, several models (:mod:`.router_models`), each loaded on demand as an instance of the single-model
app (:func:`~cooktop.server.app.create_app`) in this process, with the router's options.

- A request names its model: POST bodies by ``model``, GET requests by ``?model=``; it is answered by
  that model's instance, streams included. Missing: 400 "model name is missing from the request";
  unknown: 400 "model 'X' not found"; not loaded: loaded first (``--no-models-autoload`` or
  ``?autoload=false``: 400 "model is not loaded"), the request waiting while it loads.
- ``GET /models`` (``/v1/models``): every model with ``status.value`` ``unloaded`` / ``loading`` /
  ``loaded`` (``failed``, ``exit_code`` 1 and cooktop's ``error`` after a failed load), ``source``, ``path``,
  and once loaded the instance's own ``/v1/models`` fields; ``?reload=1`` looks for models again.
  ``POST /models/load`` and ``/models/unload`` (``{"model": ID}``) answer ``{"success": true}`` at once
  (the load goes on behind it; "model is not found", "model is already running", "model is not
  running" otherwise). ``GET /props`` without ``?model`` is the router's own (``role: router``,
  ``max_instances``, ``models_autoload``). ``GET`` / ``POST /tools`` (``--tools``, :mod:`.tools`) are the
  router's own too, no model named.
- At most ``--models-max`` instances (default 4, 0 no limit): loading one more first unloads the least
  recently used instance that has no request in flight (503 when every one has).
- The router answers the API key (instances have none), CORS and ``--api-prefix``; an unloaded
  instance frees its model, caches and slots (its app's shutdown).

llama-server runs each instance as a child process; here they share the process (no port per model,
no proxy hop): a model that fails to load fails its requests, not the router.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
import urllib.parse
from typing import Any

from fastapi.responses import JSONResponse

from ..version import __version__
from . import protocol as P
from .router_models import ModelSource, discover
from .slots import default_context, slot_context

log = logging.getLogger("cooktop.server")

LOAD_POLL_S = 0.02


class Lifespan:
    """Drives an ASGI app's lifespan (startup, shutdown) as a server would, for an instance app that is
    mounted, not served: its startup begins loading the model, its shutdown frees it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Send ``lifespan.startup`` and wait for the app to answer it.

        Raises:
            CooktopError: the app's startup failed.
        """
        started: asyncio.Future = asyncio.get_running_loop().create_future()

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"].startswith("lifespan.startup") and not started.done():
                started.set_result(msg)

        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, send))
        await self._inbox.put({"type": "lifespan.startup"})
        msg = await started
        if msg["type"] != "lifespan.startup.complete":
            raise P.CooktopError(f"the model instance did not start: {msg.get('message', '')}")

    async def stop(self) -> None:
        """Send ``lifespan.shutdown`` and wait for the app to finish."""
        if self._task is not None:
            await self._inbox.put({"type": "lifespan.shutdown"})
            await self._task
            self._task = None


@dataclasses.dataclass
class Instance:
    """One model of the router: ``app`` and ``lifespan`` while loaded (loading included), else None;
    ``in_flight``: its requests being answered; ``last_used``: monotonic seconds of the last one."""

    model: ModelSource
    app: Any = None
    lifespan: Lifespan | None = None
    in_flight: int = 0
    last_used: float = 0.0
    error: str | None = None

    @property
    def state(self) -> Any:
        return None if self.app is None else self.app.state.cooktop

    @property
    def status(self) -> str:
        """``unloaded``, ``loading`` or ``loaded`` (llama-server's ``status.value``)."""
        st = self.state
        if st is None or st.load_error is not None:
            return "unloaded"
        return "loading" if st.loading else "loaded"


class Router:
    """The models of a router-mode server and their instances.

    Args:
        template: the ``ServerConfig`` every instance is made from (its ``model_path`` and ``alias`` replaced
            by the model's; no API key, prefix or GCP routes of its own).
        models_dir: ``--models-dir`` or None; cache_dir: the Hugging Face cache (None: the default one).
        models_max: ``--models-max`` (0: no limit); autoload: ``--models-autoload``.
        split_context: split ``llama_kwargs["n_ctx"]`` across the ``n_parallel`` slots of each instance
            (:func:`~cooktop.server.slots.slot_context`; ``cooktop serve -np N`` without ``--kv-unified``).
    Raises:
        CooktopError: ``models_dir`` is not a folder.
    """

    def __init__(self, template: Any, models_dir: str | None = None, cache_dir: Any = None,
                 models_max: int = 4, autoload: bool = True, split_context: bool = False):
        self.template, self.models_dir, self.cache_dir = template, models_dir, cache_dir
        self.split_context = split_context
        self.models_max, self.autoload = models_max, autoload
        self.started = time.time()
        self.instances: dict[str, Instance] = {}
        self._lock = asyncio.Lock()
        self.reload()

    def reload(self) -> None:
        """Look for models again: new ones are added, those gone are dropped unless loaded."""
        found = discover(self.models_dir, self.cache_dir)
        for mid in list(self.instances):
            if mid not in found and self.instances[mid].app is None:
                del self.instances[mid]
        for mid, src in found.items():
            inst = self.instances.get(mid)
            if inst is None:
                self.instances[mid] = Instance(src)
            elif inst.app is None:
                inst.model = src

    def _config(self, src: ModelSource) -> Any:
        kw = dict(self.template.llama_kwargs)
        if self.split_context:  # -c across -np as for one model, with this model's -c 0
            n_ctx, n_parallel = kw.get("n_ctx", 0), self.template.n_parallel
            kw["n_ctx"] = slot_context(n_ctx or default_context(src.path), n_parallel)
        return dataclasses.replace(self.template, model_path=src.path, alias=src.id, api_key=None, api_prefix="",
                                   llama_kwargs=kw, mcp_servers_config="", mcp_servers_json="")  # /tools: the router's

    async def load(self, mid: str) -> Instance:
        """Start loading model ``mid`` (unloading the least recently used idle instance first when
        ``models_max`` are loaded); returns its instance, loading.

        Raises:
            HTTPError: 400 unknown model or already running; 503 every loaded instance busy.
        """
        from .app import create_app
        async with self._lock:
            inst = self.instances.get(mid)
            if inst is None:
                raise P.HTTPError(400, "model is not found", "invalid_request_error")
            if inst.app is not None and inst.status != "unloaded":
                raise P.HTTPError(400, "model is already running", "invalid_request_error")
            if inst.app is not None:  # a failed load: its app goes before a new try
                await self._unload(inst)
            running = [i for i in self.instances.values() if i.app is not None]
            if self.models_max > 0 and len(running) >= self.models_max:
                idle = sorted((i for i in running if i.in_flight == 0), key=lambda i: i.last_used)
                if not idle:
                    raise P.HTTPError(503, f"all {len(running)} model instances are busy (--models-max "
                                           f"{self.models_max}); retry later", "unavailable_error")
                log.info("router: unloading %s (least recently used) to load %s", idle[0].model.id, mid)
                await self._unload(idle[0])
            inst.app = create_app(self._config(inst.model))
            inst.lifespan = Lifespan(inst.app)
            inst.error = None
            inst.last_used = time.monotonic()
            await inst.lifespan.start()  # the model loads on the instance's own thread from here
            return inst

    async def _unload(self, inst: Instance) -> None:
        if inst.lifespan is not None:
            await inst.lifespan.stop()
        inst.app, inst.lifespan = None, None

    async def unload(self, mid: str) -> None:
        """Unload model ``mid`` (its requests in flight end with an error, as when a server stops).

        Raises:
            HTTPError: 400 unknown model or not running.
        """
        async with self._lock:
            inst = self.instances.get(mid)
            if inst is None:
                raise P.HTTPError(400, "model is not found", "invalid_request_error")
            if inst.app is None or inst.status == "unloaded":
                raise P.HTTPError(400, "model is not running", "invalid_request_error")
            await self._unload(inst)

    async def close(self) -> None:
        """Unload every instance (the router is shutting down)."""
        for inst in self.instances.values():
            await self._unload(inst)

    async def ready(self, mid: str, autoload: bool) -> Instance:
        """The loaded instance of ``mid``, loading it first (``autoload``) and waiting for it.

        Raises:
            HTTPError: 400 unknown / not loaded without autoload; 500 its load failed.
        """
        inst = self.instances.get(mid)
        if inst is None:
            raise P.HTTPError(400, f"model '{mid}' not found", "invalid_request_error")
        if inst.status == "unloaded":
            if not autoload:
                raise P.HTTPError(400, "model is not loaded", "invalid_request_error")
            try:
                inst = await self.load(mid)
            except P.HTTPError as e:
                if "already running" not in str(e):  # another request started it meanwhile
                    raise
        while inst.state is not None and inst.state.loading:
            await asyncio.sleep(LOAD_POLL_S)
        st = inst.state
        if st is None:
            raise P.HTTPError(503, f"model '{mid}' was unloaded; retry", "unavailable_error")
        if st.load_error is not None:
            raise P.HTTPError(500, f"model '{mid}' failed to load: {st.load_error}", "server_error")
        return inst

    def listing(self) -> dict[str, Any]:
        """``GET /models``: every model and its status (module doc)."""
        data = []
        for inst in self.instances.values():
            status: dict[str, Any] = {"value": inst.status}
            st = inst.state
            if st is not None and st.load_error is not None:
                status.update(failed=True, exit_code=1, error=st.load_error)
            item: dict[str, Any] = {"id": inst.model.id, "aliases": [], "tags": [], "object": "model",
                                    "owned_by": "cooktop", "created": int(self.started), "status": status,
                                    "path": inst.model.path, "source": inst.model.source,
                                    "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]}}
            if inst.status == "loaded":
                from .describe import models_body
                for k, v in models_body(st.config, st.llm, st.started)["data"][0].items():
                    item.setdefault(k, v)
            data.append(item)
        return {"object": "list", "data": data}

    def props(self) -> dict[str, Any]:
        """``GET /props`` of the router itself (llama-server's ``get_router_props``)."""
        return {"role": "router", "max_instances": self.models_max, "models_autoload": self.autoload,
                "model_alias": "cooktop", "model_path": "none",
                "default_generation_settings": {"params": {}, "n_ctx": 0}, "build_info": f"cooktop {__version__}"}


async def _body(receive: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """The whole request body, and the messages read to get it (to hand on unchanged)."""
    chunks, msgs = [], []
    while True:
        msg = await receive()
        msgs.append(msg)
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break
    return b"".join(chunks), msgs


class RouterApp:
    """The router's ASGI app: its own routes (module doc) or the request handed to its model's instance.

    Args:
        router: the :class:`Router`; api_keys: keys accepted (none: open), as ``ServerConfig.api_keys``.
    """

    def __init__(self, router: Router, api_keys: tuple[str, ...] = ()):
        from .tools import tools_app

        self.router, self.api_keys = router, api_keys
        self.tools = tools_app(router.template)  # /tools is the router's own, as llama-server's

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if not self.api_keys:
            return True
        auth = headers.get(b"authorization", b"").decode("latin-1")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else \
            headers.get(b"x-api-key", b"").decode("latin-1")
        return bool(sum(hmac.compare_digest(token.encode(), k.encode()) for k in self.api_keys))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    if getattr(self.tools.state, "mcp", None) is not None:  # the MCP servers' children
                        self.tools.state.mcp.close()
                    await self.router.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            await self._http(scope, receive, send)
        except P.HTTPError as e:
            await JSONResponse(P.error_body(e.status, str(e), e.type), status_code=e.status)(scope, receive, send)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        method, path = scope["method"], scope["path"]
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        headers = dict(scope.get("headers") or [])

        async def answer(body: Any, status: int = 200) -> None:
            await JSONResponse(body, status_code=status)(scope, receive, send)

        if (method, path) in (("GET", "/health"), ("GET", "/v1/health")):
            return await answer({"status": "ok"})
        if not self._authorized(headers):
            raise P.HTTPError(401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error")
        if path == "/tools":
            return await self.tools(scope, receive, send)
        if (method, path) in (("GET", "/models"), ("GET", "/v1/models")):
            if query.get("reload", ["0"])[0] in ("1", "true"):
                self.router.reload()
            return await answer(self.router.listing())
        if method == "GET" and path == "/props" and "model" not in query:
            return await answer(self.router.props())
        body, msgs = b"", []  # type: tuple[bytes, list[dict[str, Any]]]
        if method == "POST":
            body, msgs = await _body(receive)
        if (method, path) in (("POST", "/models/load"), ("POST", "/models/unload")):
            mid = _model_field(body)
            if path == "/models/load":
                await self.router.load(mid)
            else:
                await self.router.unload(mid)
            return await answer({"success": True})
        mid = _model_field(body) if method == "POST" else query.get("model", [""])[0]
        if not mid:
            raise P.HTTPError(400, "model name is missing from the request", "invalid_request_error")
        auto = query.get("autoload", [""])[0]
        inst = await self.router.ready(mid, self.router.autoload if not auto else auto in ("true", "1"))
        pending = list(msgs)

        async def replay() -> dict[str, Any]:  # the body already read, then the client's own messages
            return pending.pop(0) if pending else await receive()

        inst.in_flight += 1
        try:
            await inst.app(scope, replay, send)
        finally:
            inst.in_flight -= 1
            inst.last_used = time.monotonic()


def _model_field(body: bytes) -> str:
    """The ``model`` of a JSON body ("" when absent).

    Raises:
        HTTPError: 400 a body that is not a JSON object.
    """
    try:
        obj = json.loads(body or b"{}")
    except ValueError as e:
        raise P.HTTPError(400, f"bad JSON in the request body: {e}", "invalid_request_error") from None
    if not isinstance(obj, dict):
        raise P.HTTPError(400, "the request body must be a JSON object", "invalid_request_error")
    m = obj.get("model", "")
    return m if isinstance(m, str) else ""


def create_router_app(template: Any, models_dir: str | None = None, cache_dir: Any = None, models_max: int = 4,
                      autoload: bool = True, split_context: bool = False) -> Any:
    """The router-mode server's ASGI app: :class:`RouterApp` behind llama-server's CORS and, when
    ``template.api_prefix`` is set, the prefix (``template``: a ``ServerConfig`` as for :class:`Router`).

    Raises:
        CooktopError: ``models_dir`` is not a folder; ValueError: a bad ``api_prefix``.
    """
    from starlette.middleware.cors import CORSMiddleware

    from .app import cors_options
    from .prefix import ApiPrefix, check_api_prefix
    if why := check_api_prefix(template.api_prefix):
        raise ValueError(why)
    router = Router(template, models_dir, cache_dir, models_max, autoload, split_context)
    inner: Any = RouterApp(router, template.api_keys)
    app: Any = CORSMiddleware(inner, **cors_options(template))
    if template.api_prefix:
        app = ApiPrefix(app, template.api_prefix)
    app.router_state = router
    return app
