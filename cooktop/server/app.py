"""The OpenAI-compatible HTTP server (FastAPI): llama-server's endpoints and shapes.

Endpoints: ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/tokenize``, ``/detokenize``, ``/apply-template``;
``GET /v1/models``, ``/health`` (503 while the model loads), ``/metrics``
(Prometheus text), ``/props``, ``/slots`` (llama-server's slot monitor; ``--no-slots``: 501);
and in their own modules llama-server's native ``POST /completion`` = ``/completions``, ``/infill``,
``/embedding`` = ``/embeddings`` (:mod:`.native`; native there too), the
Responses API (:mod:`.responses_api`), Anthropic's ``/v1/messages`` (:mod:`.anthropic`),
``/v1/rerank`` (:mod:`.rerank`) and the web chat page at ``/`` (:mod:`.webui`).
Any ``model`` name is accepted (one model is served) and echoed back. Generations run on the :class:`Scheduler`'s
worker thread; handlers wait for their job's events. Streams are Server-Sent
Events ending with ``data: [DONE]``; with ``stream_options.include_usage`` one
usage chunk (``choices: []``) comes right before it. A non-streamed answer is
assembled from the same chunks, so it always equals the joined stream. A
client that disconnects cancels its job. Errors are OpenAI-shaped JSON
(:func:`protocol.error_body`): 400 bad JSON or field, prompt over the context,
template refusal, bad tools; 401 missing/wrong ``--api-key``; 404 unknown route;
503 loading or overloaded; 500 a bug. Cross-origin requests (CORS, preflight included) follow
llama-server's ``--cors-origins`` / ``--cors-methods`` / ``--cors-headers`` / ``--cors-credentials``
(:func:`cors_options`; by default any origin, so browser front ends can call it).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..version import __version__
from . import (
    anthropic,
    cors_proxy,
    describe,
    gcp,
    lora_api,
    native,
    rerank,
    responses_api,
    slots_api,
    token_count,
    tools,
    webui,
)
from . import protocol as P
from .bridge import DISCONNECT_CHECK_S, Bridge, ClientGone
from .gcp import GcpParams
from .prefix import ApiPrefix, check_api_prefix
from .responses import (
    add_usage,
    assemble_chat,
    assemble_completion,
    choices_job,
    empty_chat,
    prometheus,
    prompt_choices_job,
)
from .sleep import IdleSleep, bypasses
from .slots import END, ERROR, Job, Metrics, Scheduler

log = logging.getLogger("cooktop.server")

OPEN_PATHS = ("/health", "/v1/health")


@dataclasses.dataclass
class ServerConfig:
    """What ``cooktop serve`` was asked for.

    Attributes:
        model_path: the GGUF; alias: the model name clients use (default: the file name; ``a,b,c``:
            several, the first in sorted order reported as the ``id``); tags: ``--tags`` (comma-separated,
            listed in ``/v1/models``).
        llama_kwargs: arguments for :class:`cooktop.api.Llama`.
        n_parallel: slots (``-np``); max_queue: waiting requests before 503.
        api_key: Bearer key required on every endpoint but ``/health`` (None: open); several keys
            separated by commas, any of them accepted (llama-server's ``--api-key a,b``, and the lines of
            ``--api-key-file`` joined so by ``cooktop serve``).
        reasoning_format, reasoning_budget: defaults for chat requests (``--reasoning-format``,
            ``--reasoning-budget``); template_kwargs: default template variables of every chat
            (``--chat-template-kwargs``, ``--reasoning on|off`` as ``enable_thinking``), under a request's own
            ``chat_template_kwargs``; webui: serve the chat page at ``/`` (``--no-webui``: False).
        defaults: request fields' defaults from the command line (``protocol.sampling_args``).
        speculative: a :class:`~cooktop.engine.spec_config.SpecOptions` (``-md``, ``--spec-type``)
            or None: every slot decodes speculatively with its own drafter.
        endpoint_slots: serve ``GET /slots`` (llama-server's ``--slots``, default on; ``--no-slots``: 501).
        cors_origins, cors_methods, cors_headers, cors_credentials: llama-server's CORS options
            (``--cors-origins``: comma-separated origins, ``*`` any (echoed back with credentials),
            ``localhost`` only local origins; ``--cors-methods``, ``--cors-headers``,
            ``--[no-]cors-credentials``), defaults as there.
        endpoint_props: allow ``POST /props`` (``--props``; off: 501, as llama-server).
        slot_save_path: the folder of ``POST /slots/ID?action=save|restore``'s files
            (``--slot-save-path``; None: those actions answer 501, as llama-server).
        api_prefix: llama-server's ``--api-prefix``: every route under this path (``/llm`` ->
            ``/llm/health``); ``""`` none. A ValueError from :func:`create_app` if it has no leading
            ``/`` or a trailing one (``prefix.check_api_prefix``).
        endpoint_metrics: serve ``GET /metrics`` (llama-server's ``--metrics``; off: 501).
        ui_mcp_proxy: serve ``/cors-proxy`` (llama-server's ``--ui-mcp-proxy``, :mod:`.cors_proxy`; off: 403).
        tools: llama-server's ``--tools``: ``all`` or comma-separated built-in agent tools served at
            ``GET`` / ``POST /tools`` (:mod:`.tools`; "" off: 403); a ValueError from :func:`create_app` for
            an unknown name. tools_runtime: ``--tools-runtime`` (validated as llama-server, then refused:
            the tools run on the host only).
        mcp_servers_config, mcp_servers_json: llama-server's ``--mcp-servers-config FILE`` /
            ``--mcp-servers-json JSON``: MCP servers whose tools ``/tools`` serves as ``<server>_<tool>``
            (:mod:`.mcp_servers`; "" none); a McpConfigError (a ValueError) from :func:`create_app` for a
            config that cannot be read.
        sleep_idle_seconds: free the model after this many seconds without a request and load it again
            on the next one (llama-server's ``--sleep-idle-seconds``, :mod:`.sleep`); -1 never.
        prefill_assistant: an assistant message last is continued (llama-server's default;
            ``--no-prefill-assistant``: False, it is rendered as a finished turn).
        verbose: every completion answer carries llama-server's ``__verbose`` debug object (``-v`` /
            ``--verbose``; a request's ``verbose`` field overrides it).
    """

    model_path: str
    alias: str | None = None
    tags: str | None = None
    llama_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    n_parallel: int = 1
    max_queue: int = 256
    api_key: str | None = None
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    webui: bool = True
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    speculative: Any = None
    endpoint_slots: bool = True
    slot_save_path: str | None = None
    endpoint_props: bool = False
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    api_prefix: str = ""
    sleep_idle_seconds: float = -1
    ui_mcp_proxy: bool = False
    endpoint_metrics: bool = False
    tools: str = ""
    tools_runtime: str = ""
    mcp_servers_config: str = ""
    mcp_servers_json: str = ""
    prefill_assistant: bool = True
    verbose: bool = False

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The accepted keys (``api_key`` split at commas, empty parts dropped); () when open."""
        return tuple(k for k in (self.api_key or "").split(",") if k)

    @property
    def aliases(self) -> list[str]:
        """The model's names: ``--alias a,b,c`` sorted (llama-server keeps a ``std::set``), else the file name."""
        names = sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})
        return names or [os.path.basename(self.model_path)]

    @property
    def model_id(self) -> str:
        """The name the API reports: the first of :attr:`aliases` (llama-server's ``id``)."""
        return self.aliases[0]


class ServerState:
    """The loaded model and its scheduler; ``loading`` until :meth:`load` finishes.

    Asleep (:meth:`sleep`, ``--sleep-idle-seconds``): ``sleeping`` True, no model nor scheduler,
    ``cached`` the ``/props`` and ``/v1/models`` bodies and ``metrics`` the counters of before;
    :meth:`wake` loads the model again (``wake_error``: why it could not, None otherwise).
    """

    def __init__(self, config: ServerConfig, llm: Any = None, on_load_error: Any = None, on_loaded: Any = None):
        self.config = config
        self.on_load_error, self.on_loaded = on_load_error, on_loaded
        self.llm = llm
        self.scheduler: Scheduler | None = None
        self.load_error: str | None = None
        self.started = time.time()
        self.draft_engine: Any = None
        self.sleeping = False
        self.wake_error: str | None = None
        self.cached: dict[str, Any] = {}
        self.metrics: Metrics | None = None
        if llm is not None:
            self.scheduler = Scheduler(llm, config.n_parallel, config.max_queue)

    @property
    def loading(self) -> bool:
        return self.scheduler is None and self.load_error is None and not self.sleeping

    @property
    def ready(self) -> Scheduler:
        """The scheduler of the loaded model.

        Raises:
            HTTPError: 503 while loading (the ``gate`` middleware answers before any endpoint runs then).
        """
        if self.scheduler is None:
            raise P.HTTPError(503, "Loading model", "unavailable_error")
        return self.scheduler

    def _open(self) -> None:
        """Load the model, its drafter and the scheduler (raises whatever loading raises)."""
        from ..api import Llama
        llm = Llama(model_path=self.config.model_path, verbose=False, embedding=True, **self.config.llama_kwargs)
        try:
            llm.chat_template_choice()
            if self.config.speculative is not None:
                kw = self.config.llama_kwargs
                llm.draft_model, self.draft_engine = self.config.speculative.build(
                    llm._engine, kw.get("device"), kw.get("n_gpu_layers", -1))
            self.scheduler = Scheduler(llm, self.config.n_parallel, self.config.max_queue)
        except BaseException:
            llm.close()
            raise
        self.llm = llm
        log.info("model loaded: %s", self.config.model_path)

    def load(self) -> None:
        """Load the model (on a thread at startup).

        A failure is kept for ``/health`` and passed to ``on_load_error`` (``cooktop serve``
        then stops and exits 1, as llama-server does); without that callback it is logged.
        Success calls ``on_loaded()`` (``cooktop serve`` then announces its address).
        """
        try:
            self._open()
            if self.on_loaded is not None:
                self.on_loaded()
        except Exception as e:  # noqa: BLE001 - reported by /health and every endpoint
            self.load_error = f"{type(e).__name__}: {e}" if not isinstance(e, P.CooktopError) else str(e)
            if self.on_load_error is not None:
                self.on_load_error(self.load_error)
            else:
                log.error("cannot load the model: %s", self.load_error)

    def sleep(self) -> None:
        """Free the model, its caches and slots, keeping the ``/props`` and ``/v1/models`` bodies and the
        counters (:mod:`.sleep`; called with no request in flight)."""
        assert self.scheduler is not None
        self.cached = {"props": describe.props_body(self.config, self.llm, len(self.scheduler.slots), True),
                       "models": describe.models_body(self.config, self.llm, self.started)}
        self.metrics = self.scheduler.metrics
        self.sleeping = True
        self._free()

    def wake(self) -> None:
        """Load the model again after :meth:`sleep`, the counters carried over; a failure leaves the
        server asleep with ``wake_error`` set (tried again on the next request)."""
        try:
            self._open()
        except Exception as e:  # noqa: BLE001 - answered to the request that woke it
            self.wake_error = str(e) if isinstance(e, P.CooktopError) else f"{type(e).__name__}: {e}"
            log.error("cannot load the model again after sleeping: %s", self.wake_error)
            return
        assert self.scheduler is not None and self.metrics is not None
        self.scheduler.metrics = self.metrics
        self.sleeping, self.wake_error = False, None

    def _free(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        if self.llm is not None:
            self.llm.close()
        if self.draft_engine is not None:
            self.draft_engine.close()
        self.scheduler, self.llm, self.draft_engine = None, None, None

    def close(self) -> None:
        """Stop the scheduler and free the model (the server is shutting down)."""
        self._free()


#: ``--cors-origins localhost``: the origins llama-server reflects then (server-http.cpp ``origin_is_localhost``)
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?"


def cors_options(config: ServerConfig) -> dict[str, Any]:
    """Starlette ``CORSMiddleware`` arguments for llama-server's CORS options (tools/server/server-http.cpp:
    ``*`` any origin, ``localhost`` only local ones, else the listed origins; the listed methods
    and headers; credentials allowed or not)."""
    def split(v: str) -> list[str]:
        return [x.strip() for x in v.split(",") if x.strip()]

    origins = config.cors_origins.strip()
    headers = ["*"] if config.cors_headers.strip() == "*" else split(config.cors_headers)
    out: dict[str, Any] = dict(allow_credentials=config.cors_credentials, allow_methods=split(config.cors_methods),
                               allow_headers=headers)
    if origins == "localhost":
        out.update(allow_origins=[], allow_origin_regex=LOCAL_ORIGINS)
    else:
        out["allow_origins"] = ["*"] if origins == "*" else split(origins)
    return out


def _error(exc: BaseException) -> JSONResponse:
    status, kind = P.classify(exc)
    if status == 500:
        log.exception("internal error", exc_info=exc)
        msg = f"internal error ({type(exc).__name__}: {exc}); this is a cooktop bug"
    else:
        msg = str(exc)
    return JSONResponse(P.error_body(status, msg, kind, getattr(exc, "param", None), exc), status_code=status)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(config: ServerConfig, llm: Any = None, on_load_error: Any = None, on_loaded: Any = None) -> FastAPI:
    """The FastAPI application for ``config`` (``llm``: an already loaded model, else loaded at startup).

    The model loads on a background thread when the app starts, so ``/health``
    answers 503 meanwhile; the state is ``app.state.cooktop``. ``on_load_error(message)``
    is called (on the loading thread) if the model cannot load, ``on_loaded()`` once it has.
    """
    if why := check_api_prefix(config.api_prefix):
        raise ValueError(why)
    state = ServerState(config, llm, on_load_error, on_loaded)
    gcp_params = GcpParams.from_env()
    open_paths = OPEN_PATHS + ((gcp_params.health_route,) if gcp_params.enabled and gcp_params.health_route else ())
    idle = IdleSleep(state, config.sleep_idle_seconds) if config.sleep_idle_seconds != -1 else None

    async def lifespan(app: FastAPI):
        if state.loading:
            threading.Thread(target=state.load, name="cooktop-load", daemon=True).start()
        if idle is not None:
            idle.start()
        yield
        if idle is not None:
            idle.stop()
        if getattr(app.state, "mcp", None) is not None:  # the MCP servers' children (tools.register)
            app.state.mcp.close()
        state.close()

    app = FastAPI(title="cooktop", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.cooktop = state

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(P.error_body(exc.status_code, msg, kind), status_code=exc.status_code)

    def refusal(request: Request, awake: bool = False) -> JSONResponse | None:
        """The answer the gate gives instead of the app (bad API key, model failed or loading; with
        ``awake``, after :meth:`IdleSleep.enter`: the model could not be loaded again), else None."""
        path = request.url.path
        if path in open_paths or (config.webui and path in webui.PATHS):
            return None

        def refuse(status: int, msg: str, kind: str) -> JSONResponse:
            if path.startswith("/v1/messages"):  # Anthropic's clients read Anthropic's error shape
                return anthropic.error_response(P.HTTPError(status, msg, kind))
            return JSONResponse(P.error_body(status, msg, kind), status_code=status)

        if config.api_keys:
            auth = request.headers.get("authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            # every key compared (no early exit), so the time does not tell which one came close
            if not sum(hmac.compare_digest(token.encode(), k.encode()) for k in config.api_keys):
                return refuse(401, "invalid or missing API key (Authorization: Bearer KEY)", "authentication_error")
        if state.load_error is not None:
            return refuse(500, f"the model failed to load: {state.load_error}", "server_error")
        if state.loading:
            return refuse(503, "Loading model", "unavailable_error")
        if awake and state.sleeping:  # the reload on waking failed
            return refuse(500, f"the model could not be loaded again after sleeping: {state.wake_error}",
                          "server_error")
        return None

    class Gate:
        """The ``gate`` middleware, pure ASGI: it answers :func:`refusal` 's errors before any endpoint
        runs and otherwise hands the request on with its own ``receive`` channel, so that an endpoint's
        ``request.is_disconnected()`` sees the client go away (Starlette's ``BaseHTTPMiddleware``
        wraps that channel and hides the disconnect)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await self.inner(scope, receive, send)
                return
            request = Request(scope)
            answer = refusal(request)
            path = request.url.path
            clock = idle if (answer is None and not bypasses(request.method, path) and path not in open_paths
                             and not (config.webui and path in webui.PATHS)) else None  # the page's files need none
            if clock is not None:  # counted in flight (the idle clock), and the model loaded again if asleep
                await asyncio.to_thread(clock.enter)
                answer = refusal(request, awake=True)
            try:
                if answer is not None:
                    await answer(scope, receive, send)
                    return
                await self.inner(scope, receive, send)
            finally:
                if clock is not None:
                    clock.leave()

    app.add_middleware(Gate)

    # added after the gate, so outside it: a browser's preflight (OPTIONS, no API key) is answered here
    app.add_middleware(CORSMiddleware, **cors_options(config))
    if config.api_prefix:  # outermost: the routes, the gate and CORS see the path without the prefix
        app.add_middleware(ApiPrefix, prefix=config.api_prefix)

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise P.HTTPError(400, f"the request body is not valid JSON: {e}") from None
        except RecursionError:  # Python's parser: nesting deeper than the interpreter's recursion limit
            raise P.HTTPError(400, "the request body is not valid JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise P.HTTPError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    def check_model(body: dict[str, Any]) -> str:
        """The model name to echo: any name is accepted, as llama-server does with one model."""
        name = body.get("model")
        if name is None:
            return config.model_id
        if not isinstance(name, str):
            raise P.bad("model", "expected a string")
        return name

    def vocab_bias(args: dict[str, Any]) -> dict[str, Any]:
        """``args`` with ``logit_bias`` read as llama-server reads it (:func:`protocol.vocab_logit_bias`)."""
        llm = state.ready.llm
        args["logit_bias"] = P.vocab_logit_bias(args.get("logit_bias"), llm.n_vocab(),
                                                lambda text: llm.tokenize(text, add_bos=False, special=False))
        return args

    async def next_event(request: Request, job: Job, watch: list[float]) -> tuple[str, Any]:
        """The next ``(kind, payload)`` of ``job``. The client's connection is checked whenever
        ``watch[0]`` (a ``time.monotonic()`` instant, moved ``DISCONNECT_CHECK_S`` on at each check) has
        passed, whether or not events arrive (a job posts one per token); if the client went away the
        job is cancelled and :class:`ClientGone` raised, as llama-server stops a task whose client left."""
        while True:
            now = time.monotonic()
            if now >= watch[0]:
                watch[0] = now + DISCONNECT_CHECK_S
                if await request.is_disconnected():
                    job.cancel()
                    raise ClientGone
            try:
                return await asyncio.wait_for(job.queue.get(), timeout=watch[0] - now)
            except asyncio.TimeoutError:
                continue

    async def first_event(request: Request, job: Job) -> tuple[str, Any]:
        """``job`` 's first event (its exception raised), waited for while it is queued or reads its
        prompt; a client that leaves meanwhile cancels it (:func:`next_event`)."""
        kind, payload = await next_event(request, job, [time.monotonic() + DISCONNECT_CHECK_S])
        if kind == ERROR:
            raise payload
        return kind, payload

    async def collect(request: Request, job: Job, first: tuple[str, Any]) -> list[Any]:
        """Every item of ``job``, cancelling it if the client goes away (:func:`next_event`)."""
        items = []
        kind, payload = first
        watch = [time.monotonic() + DISCONNECT_CHECK_S]
        while kind != END:
            items.append(payload)
            kind, payload = await next_event(request, job, watch)
            if kind == ERROR:
                raise payload
        return items

    def stream(job: Job, first: tuple[str, Any], include_usage: bool, obj: str) -> StreamingResponse:
        cid = f"{'chatcmpl' if obj.startswith('chat') else 'cmpl'}-{uuid.uuid4()}"

        async def events() -> AsyncIterator[str]:
            total: dict[str, int] | None = None
            timings = None
            try:
                kind, chunk = first
                while kind != END:
                    usage = chunk.pop("usage", None)
                    if include_usage and "timings" in chunk:  # they go on the last chunk sent
                        timings = chunk.pop("timings")
                    if usage:
                        total = add_usage(total, usage)
                    delta = chunk["choices"][0].get("delta") if chunk.get("choices") else None
                    if delta is not None and delta.get("role") == "assistant" and delta.get("content") == "":
                        delta["content"] = None  # llama-server's first chunk: the role, content null
                    chunk["id"] = cid
                    yield _sse(chunk)
                    kind, chunk = await job.queue.get()
                    if kind == ERROR:
                        status, type_ = P.classify(chunk)
                        yield _sse(P.error_body(status, str(chunk), type_, exc=chunk))
                        return
                if include_usage:
                    yield _sse({"id": cid, "object": obj, "created": int(time.time()), "model": config.model_id,
                                "choices": [], "usage": total, **({"timings": timings} if timings else {})})
                yield "data: [DONE]\n\n"
            finally:
                job.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def run(request: Request, endpoint: str, make, obj: str, body: dict[str, Any], assemble):
        state.ready.metrics.requests_total[endpoint] += 1
        want_stream = P.field(body, "stream", bool, False)
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise P.bad("stream_options", "expected an object")
        job = state.ready.submit(make, asyncio.get_running_loop(), P.field(body, "cache_prompt", bool, True),
                                 P.id_slot(body), lora_api.request_scales(body, state.ready.llm))
        try:
            first = await first_event(request, job)
        except BaseException:
            job.cancel()
            raise
        if want_stream:
            return stream(job, first, bool(opts.get("include_usage")), obj)
        try:
            chunks = await collect(request, job, first)
        finally:
            job.cancel()
        return JSONResponse(assemble(chunks))

    def endpoint(fn):
        async def wrapped(request: Request):
            try:
                return await fn(request)
            except asyncio.CancelledError:
                raise
            except ClientGone:  # nobody reads it: answered quietly (nginx's 499), not logged as a failure
                return Response(status_code=499)
            except Exception as e:  # noqa: BLE001 - mapped to an OpenAI-shaped error
                return _error(e)
        wrapped.__name__ = fn.__name__
        return wrapped

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    @endpoint
    async def chat_completions(request: Request):
        body = await body_of(request)
        model = check_model(body)
        args, n = vocab_bias(P.chat_args(body, config)), P.n_choices(body)
        verbose = P.field(body, "verbose", bool, config.verbose)
        if args["max_tokens"] == 0:  # llama-server: nothing is generated (the prompt is still read)
            make = choices_job(n, args, lambda llm, kw: empty_chat(llm, kw), model)
        else:
            make = choices_job(n, args, lambda llm, kw: llm.create_chat_completion(**kw), model, verbose)
        return await run(request, "chat", make, "chat.completion.chunk", body, assemble_chat)

    @app.post("/v1/completions")
    @endpoint
    async def completions(request: Request):
        body = await body_of(request)
        model = check_model(body)
        prompts, args = P.completion_args(body, config.defaults)
        args = vocab_bias(args)
        n = P.n_choices(body)
        if len(prompts) * n > P.MAX_N:
            raise P.bad("n", f"{len(prompts)} prompts x n = {n} is more than {P.MAX_N} choices")
        make = prompt_choices_job(prompts, n, args, model, P.field(body, "verbose", bool, config.verbose))
        return await run(request, "completions", make, "text_completion", body, assemble_completion)

    @app.post("/v1/embeddings")
    @endpoint
    async def embeddings(request: Request):
        body = await body_of(request)
        model = check_model(body)
        if state.ready.llm.pooling() == "none":  # llama-server's refusal: OpenAI's shape has one vector per input
            raise P.HTTPError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                                   "(or the native /embedding, which returns a vector per token)")
        if "input" not in body and "content" in body:  # llama-server's own field
            body["input"] = body["content"]
        inp = body.get("input")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise P.bad("encoding_format", f"expected 'float' or 'base64', got {fmt!r}")
        state.ready.metrics.requests_total["embeddings"] += 1
        job = state.ready.submit(lambda llm: iter([llm.create_embedding(inp, model=model, truncate=False)]),
                                     asyncio.get_running_loop())
        first = await first_event(request, job)
        (result,) = await collect(request, job, first)
        state.ready.metrics.prompt_tokens_total += result["usage"]["prompt_tokens"]
        if fmt == "base64":  # OpenAI's: little-endian float32 bytes, base64 (what the openai client asks for)
            for d in result["data"]:
                d["embedding"] = base64.b64encode(np.asarray(d["embedding"], dtype="<f4").tobytes()).decode()
        return JSONResponse(result)

    @app.get("/v1/models")
    @app.get("/models")
    @endpoint
    async def models(request: Request):
        llm = state.llm  # once: the server may fall asleep meanwhile (then the copy kept is the answer)
        return describe.models_body(config, llm, state.started) if llm is not None else state.cached["models"]

    @app.get("/v1/models/{model_id:path}")
    @app.get("/models/{model_id:path}")
    @endpoint
    async def model_info(request: Request):
        check_model({"model": request.path_params["model_id"]})
        return (await models(request))["data"][0]

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if state.load_error is not None:
            return JSONResponse(P.error_body(500, f"the model failed to load: {state.load_error}", "server_error"),
                                status_code=500)
        if state.loading:
            return JSONResponse(P.error_body(503, "Loading model", "unavailable_error"), status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    @endpoint
    async def metrics(request: Request):
        if not config.endpoint_metrics:  # llama-server's answer without --metrics
            raise P.HTTPError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                              "not_supported_error")
        return PlainTextResponse(prometheus(state), media_type="text/plain; version=0.0.4",
                                 headers={"Process-Start-Time-Unix": str(int(state.started))})

    @app.get("/props")
    @endpoint
    async def props(request: Request):
        llm, sched = state.llm, state.scheduler  # once: the server may fall asleep meanwhile
        if llm is None or sched is None:
            return state.cached["props"]
        return describe.props_body(config, llm, len(sched.slots))

    @app.post("/props")
    @endpoint
    async def set_props(request: Request):
        """llama-server's ``POST /props``: 501 without ``--props``; with it, ``{"success": true}`` (llama-server
        changes no property there either: tools/server/server-context.cpp ``post_props``)."""
        if not config.endpoint_props:
            raise P.HTTPError(501, "This server does not support changing global properties. Start it with `--props`",
                              "not_supported_error")
        await body_of(request)
        return {"success": True}

    @app.post("/tokenize")
    @endpoint
    async def tokenize(request: Request):
        body = await body_of(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise P.bad("content", "expected a string")
        llm = state.llm
        ids = llm.tokenize(content, add_bos=P.field(body, "add_special", bool, False),
                           special=P.field(body, "parse_special", bool, True))
        if P.field(body, "with_pieces", bool, False):
            tk = llm._tokenizer
            out = []
            for i in ids:
                raw = tk.token_to_piece(i, special=True)
                try:
                    piece: Any = raw.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(raw)
                out.append({"id": i, "piece": piece})
            return {"tokens": out}
        return {"tokens": ids}

    @app.post("/detokenize")
    @endpoint
    async def detokenize(request: Request):
        body = await body_of(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise P.bad("tokens", "expected a list of token ids")
        text = state.llm.detokenize(ids, special=True) if ids else b""
        return {"content": text.decode("utf-8", errors="replace")}

    @app.post("/apply-template")
    @endpoint
    async def apply_template(request: Request):
        body = await body_of(request)
        args = P.chat_args(body, config)
        prompt = state.llm.apply_chat_template(args["messages"], tools=args["tools"],
                                               add_generation_prompt=args["add_generation_prompt"],
                                               continue_final_message=args["continue_final_message"],
                                               **(args["chat_template_kwargs"] or {}))
        return {"prompt": prompt}

    ctx = Bridge(state, config, body_of, check_model, _error)
    for module in (native, responses_api, anthropic, rerank, slots_api, lora_api, webui, cors_proxy, tools,
                   token_count):
        module.register(app, ctx)
    if gcp_params.enabled:  # last: its aliases name the routes above
        gcp.register(app, gcp_params, config.api_prefix)
    return app
