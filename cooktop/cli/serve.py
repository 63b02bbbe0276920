"""``cooktop serve``: the OpenAI-compatible HTTP server (llama-server's flags)."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from typing import Any

import click

from ..errors import CooktopError
from .common import (
    device_options,
    kv_kwargs,
    kv_options,
    model_options,
    moe_kwargs,
    parse_ngl,
    ray_option,
    resolve_model,
    threads_option,
)
from .group import cli
from .llama_flags import llama_options
from .lora_options import lora_options
from .sampling_options import SAMPLING_DESTS, generation_options, grammar_source
from .spec_options import speculative_options


@cli.command("serve")
@llama_options("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface); several separated by commas.")
@click.option("--port", default=8080, show_default=True, help="Port to listen on.")
@click.option("-c", "--ctx-size", "n_ctx", default=0, show_default=True,
              help="Context size in tokens, split across the -np slots as llama-server does unless --kv-unified "
                   "(0 = from the model, at most 4096).")
@click.option("-b", "--batch-size", "n_batch", default=512, show_default=True, help="Prompt tokens per forward pass.")
@click.option("-np", "--parallel", "n_parallel", default=1, show_default=True,
              help="Slots: requests processed together, each with its own KV cache; more wait in a queue "
                   "(-1: auto, 4 slots with --kv-unified, as llama-server).")
@click.option("-kvu/-no-kvu", "--kv-unified/--no-kv-unified", "kv_unified", default=False,
              envvar="LLAMA_ARG_KV_UNIFIED",
              help="Every slot gets the whole -c context instead of -c / -np (cooktop then allocates -np times it).")
@click.option("--max-queue", default=256, show_default=True, help="Waiting requests before answering 503.")
@click.option("-a", "--alias", default=None, envvar="LLAMA_ARG_ALIAS",
              help="Model name in the API (default: the file name); several separated by commas.")
@click.option("--tags", default=None, envvar="LLAMA_ARG_TAGS", help="Tags of the model in /v1/models, comma-separated.")
@click.option("--api-key", default=None, envvar="LLAMA_API_KEY",
              help="Require 'Authorization: Bearer KEY' on every endpoint but /health (env LLAMA_API_KEY); "
                   "several keys separated by commas.")
@click.option("--api-key-file", "api_key_file", default=None, metavar="FNAME", envvar="LLAMA_ARG_API_KEY_FILE",
              help="API keys, one per line (lines starting with # are comments), besides --api-key's.")
@click.option("--chat-template", default=None, help="Chat format name (chatml, llama3, ...) or jinja text.")
@click.option("--chat-template-file", default=None, type=click.Path(), help="Jinja chat template file.")
@click.option("-s", "--seed", default=-1, show_default=True, help="Default RNG seed (-1 = random).")
@click.option("-n", "--n-predict", "n_predict", default=-1, show_default=True,
              help="Default max tokens per request (-1 = until the context is full).")
@generation_options
@click.option("--reasoning-format", default="auto", show_default=True,
              type=click.Choice(["none", "deepseek", "deepseek-legacy", "auto"]),
              help="Thinking (<think>, gpt-oss analysis): none = left in content, deepseek/auto = "
                   "message.reasoning_content, deepseek-legacy = both.")
@click.option("--reasoning-budget", default=-1, show_default=True, type=click.IntRange(min=-1),
              help="Thinking tokens: -1 unlimited, 0 no thinking, N > 0 at most N (then </think> is forced).")
@click.option("-rea", "--reasoning", "reasoning", default="auto", show_default=True, envvar="LLAMA_ARG_REASONING",
              metavar="[on|off|auto]",
              help="Thinking in chats: the templates' enable_thinking, false with off, true with on and auto "
                   "(llama-server's).")
@click.option("--chat-template-kwargs", "chat_template_kwargs", default=None, metavar="JSON",
              envvar="LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
              help='Default template variables of every chat, a JSON object (e.g. \'{"enable_thinking": false}\').')
@click.option("--no-webui", "--no-ui", "no_webui", is_flag=True, help="Do not serve the web chat page at /.")
@click.option("--rerank", "--reranking", "rerank", is_flag=True,
              help="Pooling rank for /v1/rerank (a reranker GGUF with a classification head).")
@click.option("--pooling", "pooling", default=None, type=click.Choice(["none", "mean", "cls", "last", "rank"]),
              help="Pooling of /embedding(s) and /v1/embeddings (default: the model's; none: a vector per token, "
                   "native endpoints only).")
@click.option("--embedding", "--embeddings", "embeddings", is_flag=True,
              help="(Accepted: /v1/embeddings is always on in cooktop.)")
@click.option("--slots/--no-slots", "endpoint_slots", default=True, show_default=True,
              envvar="LLAMA_ARG_ENDPOINT_SLOTS", help="Serve GET /slots (each slot's state), as llama-server.")
@click.option("--cors-origins", "cors_origins", default=None, envvar="LLAMA_ARG_CORS_ORIGINS",
              help="Allowed CORS origins, comma-separated; 'localhost': only local origins "
                   "(default: '*', 'localhost' with --tools, as llama-server).")
@click.option("--cors-methods", "cors_methods", default="GET, POST, DELETE, OPTIONS", show_default=True,
              envvar="LLAMA_ARG_CORS_METHODS", help="Allowed CORS methods, comma-separated.")
@click.option("--cors-headers", "cors_headers", default="*", show_default=True, envvar="LLAMA_ARG_CORS_HEADERS",
              help="Allowed CORS headers, comma-separated.")
@click.option("--cors-credentials/--no-cors-credentials", "cors_credentials", default=True, show_default=True,
              envvar="LLAMA_ARG_CORS_CREDENTIALS", help="Allow credentials in CORS requests.")
@click.option("--api-prefix", "api_prefix", default="", envvar="LLAMA_ARG_API_PREFIX", metavar="PREFIX",
              help="Path prefix of every route, without the trailing slash (e.g. /llm: /llm/v1/chat/completions).")
@click.option("--context-shift/--no-context-shift", "context_shift", default=False, show_default=True,
              envvar="LLAMA_ARG_CONTEXT_SHIFT",
              help="A generation that fills a slot's context drops the older half of it (after --keep) and goes on.")
@click.option("--keep", "n_keep", default=0, show_default=True,
              help="With --context-shift: prompt tokens kept at the start (-1: the whole prompt).")
@click.option("--props", "endpoint_props", is_flag=True, envvar="LLAMA_ARG_ENDPOINT_PROPS",
              help="Allow POST /props (llama-server's; off: 501).")
@click.option("--metrics", "metrics", is_flag=True, default=False, envvar="LLAMA_ARG_ENDPOINT_METRICS",
              help="Serve GET /metrics (Prometheus text, llama-server's names; off: 501, as llama-server).")
@click.option("--slot-save-path", "slot_save_path", default=None, metavar="PATH",
              help="Folder of the slot files POST /slots/ID?action=save|restore write and read (llama-server's).")
@click.option("--models-dir", "models_dir", default=None, metavar="PATH", envvar="LLAMA_ARG_MODELS_DIR",
              help="Router mode (no -m / -hf): the folder of the models to serve, besides the Hugging Face cache's.")
@click.option("--models-max", "models_max", type=click.IntRange(min=0), default=4, show_default=True,
              envvar="LLAMA_ARG_MODELS_MAX",
              help="Router mode: models loaded at once; one more unloads the least recently used (0: no limit).")
@click.option("--models-autoload/--no-models-autoload", "models_autoload", default=True, show_default=True,
              envvar="LLAMA_ARG_MODELS_AUTOLOAD", help="Router mode: load a requested model that is not loaded.")
@click.option("--ui-mcp-proxy/--no-ui-mcp-proxy", "--webui-mcp-proxy/--no-webui-mcp-proxy", "ui_mcp_proxy",
              default=False, envvar="LLAMA_ARG_UI_MCP_PROXY",
              help="Serve /cors-proxy?url=... for the web page's MCP servers (llama-server's, experimental; off: 403).")
@click.option("--tools", "tools", default="", metavar="TOOL1,TOOL2,...", envvar="LLAMA_ARG_TOOLS",
              help="Experimental: built-in agent tools at GET/POST /tools ('all' or names: read_file, "
                   "file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info; default "
                   "none). File tools are confined to the working folder (or x-tool-cwd); the shell tool is not. "
                   "Do not enable in untrusted environments.")
@click.option("--tools-runtime", "tools_runtime", default="", metavar="OPTION", envvar="LLAMA_ARG_TOOLS_RUNTIME",
              help="llama-server's tools isolate (docker:<image>, docker-container:<id>, podman..., ssh:<target>): "
                   "validated, then refused (cooktop runs the tools on the host only).")
@click.option("--mcp-servers-config", "mcp_servers_config", default="", metavar="PATH",
              envvar="LLAMA_ARG_MCP_SERVERS_CONFIG",
              help="Experimental: JSON file of MCP servers ({\"mcpServers\": {NAME: {\"command\": ..., \"args\": "
                   "[...], \"env\": {...}}}}) spawned over stdio; their tools join GET/POST /tools as "
                   "NAME_TOOL. Do not enable in untrusted environments.")
@click.option("--mcp-servers-json", "mcp_servers_json", default="", metavar="JSON", envvar="LLAMA_ARG_MCP_SERVERS_JSON",
              help="Experimental: the same MCP server definitions inline.")
@click.option("--sleep-idle-seconds", "sleep_idle_seconds", type=int, default=-1, show_default=True,
              metavar="SECONDS",
              help="Free the model after SECONDS without a request; the next request loads it again (-1: never).")
@click.option("--prefill-assistant/--no-prefill-assistant", "prefill_assistant", default=True, show_default=True,
              envvar="LLAMA_ARG_PREFILL_ASSISTANT",
              help="Continue an assistant message that ends a chat (off: render it as a finished turn).")
@click.option("-v", "--verbose", "verbose", is_flag=True,
              help="Log at INFO, and add llama-server's __verbose debug object to every completion answer.")
@speculative_options
@threads_option
@kv_options
@lora_options
@device_options
@ray_option
@click.option("--replicas", "n_replicas", type=int, default=None,
              help="With --ray: replicas of the model behind Ray Serve (default 1), requests balanced across them.")
def serve_cmd(model, hf_repo, hf_file, host, port, n_ctx, n_batch, n_parallel, kv_unified, max_queue, alias, tags,
              api_key,
              api_key_file,
              chat_template, chat_template_file, seed, n_predict, reasoning_format, reasoning_budget, reasoning,
              chat_template_kwargs, no_webui, rerank,
              pooling, embeddings, endpoint_slots, cors_origins, cors_methods, cors_headers, cors_credentials,
              api_prefix, context_shift, n_keep, endpoint_props, metrics, slot_save_path, models_dir, models_max,
              models_autoload, ui_mcp_proxy, tools, tools_runtime, mcp_servers_config, mcp_servers_json,
              sleep_idle_seconds, prefill_assistant, verbose,
              threads, threads_batch, device, n_gpu_layers, split, ray_address, n_replicas, tensors, speculative, kv,
              lora, **gen_opts):
    """Serve a model over HTTP with an OpenAI-compatible API (like llama-server).

    The sampling options (--temp, --top-k, -n, --ignore-eos, --grammar, -r ...) are the defaults of
    requests that do not set them, as in llama-server; the LLAMA_ARG_* variables of the options
    cooktop implements are read as there. Every other llama-server option is accepted; those
    cooktop does not act on say so in one line.

    With --ray ADDRESS, Ray Serve runs --replicas copies of the server on the cluster (each
    possibly split across nodes by --device NODE/DEVICE,...) behind one address.

    -md DRAFT.gguf, --spec-type ngram-simple or --spec-type draft-mtp (the file's own
    multi-token-prediction block) decode speculatively in every slot (each slot drafts for itself;
    the drafts are verified in the shared batched steps).
    """
    if n_predict < -1:
        raise CooktopError(f"-n must be >= -1 (-1 = until the context is full), got {n_predict}")
    defaults = request_defaults(n_predict, gen_opts)
    if n_replicas is not None and not ray_address:
        raise CooktopError("--replicas needs --ray ADDRESS (or COOKTOP_RAY): replicas run on a Ray cluster")
    if n_replicas is not None and n_replicas < 1:
        raise CooktopError(f"--replicas must be >= 1, got {n_replicas}")
    try:
        import uvicorn

        from ..server.app import ServerConfig, create_app
        from ..server.slots import default_context, slot_context
    except ImportError as e:
        raise CooktopError(f"cooktop serve needs the server extra: pip install 'cooktop[server]' ({e})") from None
    if not 1 <= port <= 65535:
        raise CooktopError(f"--port must be in 1..65535, got {port}")
    if n_parallel == -1:  # llama-server's auto: 4 slots sharing the context (tools/server/server.cpp)
        n_parallel, kv_unified = 4, True
    if n_parallel < 1:
        raise CooktopError(f"-np must be >= 1 (or -1: auto), got {n_parallel}")
    if sleep_idle_seconds == 0 or sleep_idle_seconds < -1:  # llama.cpp common/arg.cpp's rule
        raise click.BadParameter(f"{sleep_idle_seconds}: cannot be 0 or less than -1 (-1: never sleep)",
                                 param_hint="--sleep-idle-seconds")
    from ..server.prefix import check_api_prefix
    if why := check_api_prefix(api_prefix):
        raise CooktopError(why)
    from ..server.mcp_config import load_servers
    from ..server.tools import check_tools_runtime, enabled_tools
    try:  # llama-server's startup checks, before anything loads
        enabled_tools(tools)
        check_tools_runtime(tools_runtime)
        load_servers(mcp_servers_config, mcp_servers_json)  # "MCP starting failed": exit 1
    except ValueError as e:
        raise CooktopError(str(e)) from None
    if cors_origins is None:  # llama-server: --tools or MCP servers limit the default origins to localhost
        cors_origins = "localhost" if tools or mcp_servers_config or mcp_servers_json else "*"
    if n_ctx < 0:  # the loader's own check, before anything listens
        raise CooktopError(f"n_ctx (-c) must be >= 0 (0 = from the model), got {n_ctx}")
    if slot_save_path is not None:  # made now (as llama-server does), so a bad path ends before anything listens
        try:
            os.makedirs(slot_save_path, exist_ok=True)
        except OSError as e:
            raise CooktopError(f"--slot-save-path {slot_save_path}: cannot create the folder ({e.strerror})") from None
    api_key = _api_keys(api_key, api_key_file)
    template_kwargs = _template_kwargs(reasoning, chat_template_kwargs)
    router_mode = not model and not hf_repo  # llama-server without a model: the router of several
    split_context = n_parallel > 1 and not kv_unified  # -c is the total, each slot gets its share
    if ray_address and "," in host:
        raise CooktopError(f"--host {host}: with --ray, Ray Serve listens on one address")
    if router_mode:
        if ray_address:
            raise CooktopError("router mode (no -m / -hf) does not run on a Ray cluster (--ray): give a model")
        path = ""
    else:
        if models_dir is not None:
            raise CooktopError("--models-dir is router mode's (cooktop serve without -m / -hf): give one or the other")
        path = resolve_model(model, hf_repo, hf_file)
        if not os.path.exists(path):
            raise CooktopError(f"{path}: no such file")
        from ..format.gguf import read_raw_metadata
        read_raw_metadata(path, keys=())  # GGUFError (one line) for a file that is not a GGUF, before listening
        if split_context:
            n_ctx = slot_context(n_ctx or default_context(path), n_parallel)
    speculative.check()  # the draft options, before any model loads
    if notice := speculative.notice():
        click.echo(f"cooktop: {notice}", err=True)
    kwargs = dict(n_ctx=n_ctx, n_batch=n_batch, device=device, n_gpu_layers=parse_ngl(n_gpu_layers), split=split,
                  seed=seed, n_threads=threads, n_threads_batch=threads_batch, chat_template=chat_template,
                  chat_template_file=chat_template_file, last_n_tokens_size=gen_opts["repeat_last_n"],
                  **moe_kwargs(tensors), **kv_kwargs(kv))
    if lora:  # --lora / --lora-scaled: GET/POST /lora-adapters and a request's lora field set their scales
        kwargs["lora_adapters"] = lora
    if n_parallel > 1:  # the slots share one cache: -ngl auto and the memory check count every slot's K/V
        kwargs["n_seq_max"] = n_parallel
    if context_shift:
        kwargs.update(context_shift=True, n_keep=n_keep)
    if pooling is not None:  # llama.cpp's LLAMA_POOLING_TYPE_* ids
        kwargs["pooling_type"] = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}[pooling]
    if rerank:
        kwargs["pooling_type"] = 4  # llama.cpp LLAMA_POOLING_TYPE_RANK
    config = ServerConfig(path, alias=alias, tags=tags, llama_kwargs=kwargs, n_parallel=n_parallel, max_queue=max_queue,
                          api_key=api_key, reasoning_format=reasoning_format, reasoning_budget=reasoning_budget,
                          template_kwargs=template_kwargs,
                          webui=not no_webui, defaults=defaults, endpoint_slots=endpoint_slots,
                          slot_save_path=slot_save_path, endpoint_props=endpoint_props, cors_origins=cors_origins,
                          cors_methods=cors_methods, cors_headers=cors_headers, cors_credentials=cors_credentials,
                          api_prefix=api_prefix, sleep_idle_seconds=sleep_idle_seconds,
                          ui_mcp_proxy=ui_mcp_proxy, endpoint_metrics=metrics, tools=tools,
                          tools_runtime=tools_runtime, mcp_servers_config=mcp_servers_config,
                          mcp_servers_json=mcp_servers_json, prefill_assistant=prefill_assistant, verbose=verbose,
                          speculative=speculative if speculative.types() else None)
    logging.getLogger("cooktop.server").setLevel(logging.INFO)
    if verbose:  # llama-server's -v: everything at INFO (cooktop has no lower level of its own)
        logging.getLogger().setLevel(logging.INFO)
    if router_mode:
        _serve_router(config, models_dir, models_max, models_autoload, split_context, host, port)
        return
    if ray_address:
        from ..server.replicas import serve_forever

        n_replicas = n_replicas or 1
        click.echo(f"cooktop: starting {n_replicas} replica(s) of {path} on the Ray cluster at {ray_address}",
                   err=True)
        serve_forever(config, ray_address, n_replicas, host, port, on_ready=lambda: click.echo(
            f"cooktop: serving {path} as {config.model_id!r} on {urls(host, port, api_prefix)} "
            f"({n_replicas} replica(s) behind Ray Serve, {n_parallel} slot(s) each"
            f"{', API key required' if api_key else ''})", err=True))
        return
    from ..server.gcp import GcpParams
    gcp = GcpParams.from_env()
    if gcp.enabled and gcp.port != port:  # Vertex AI's port wins, as in llama-server
        click.echo(f"cooktop: AIP_MODE=PREDICTION: serving on AIP_HTTP_PORT {gcp.port} instead of port {port}",
                   err=True)
        port = gcp.port
    socks = listen_sockets(host, port)  # a port in use is one error line, exit 1
    failed: list[str] = []

    def loaded() -> None:  # once the model has loaded, as llama-server prints "listening on"
        click.echo(f"cooktop: serving {path} as {config.model_id!r} on {urls(host, port, api_prefix)} "
                   f"({n_parallel} slot(s){', API key required' if api_key else ''})", err=True)

    def load_failed(message: str) -> None:  # llama-server: "failed to load model", exit 1
        failed.append(message)
        server.should_exit = True

    app = create_app(config, on_load_error=load_failed, on_loaded=loaded)
    server = _server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run(sockets=socks)
    if failed:
        if failed[0].startswith("cannot load the draft model"):  # the draft's own message, named
            raise CooktopError(failed[0])
        where = "" if path in failed[0] else f" {path}"
        raise CooktopError(f"cannot load the model{where}: {failed[0]}")


def _serve_router(config, models_dir: str | None, models_max: int, autoload: bool, split_context: bool,
                  host: str, port: int) -> None:
    """Serve in router mode (``server.router``): every model of ``models_dir`` and the cache, each
    loaded on demand with ``config``'s options.

    Raises:
        CooktopError: ``models_dir`` not a folder, the address not free.
    """
    import uvicorn

    from ..server.router import create_router_app
    app = create_router_app(config, models_dir, None, models_max, autoload, split_context)
    socks = listen_sockets(host, port)
    n = len(app.router_state.instances)
    click.echo(f"cooktop: router mode: {n} model(s) from {models_dir or 'the Hugging Face cache'}"
               f"{' and the cache' if models_dir else ''}, loaded on demand (at most "
               f"{models_max or 'any number'} at once) on {urls(host, port, config.api_prefix)}", err=True)
    _server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run(sockets=socks)


def _server(config: Any) -> Any:
    """A ``uvicorn.Server`` of ``config`` whose SIGTERM / SIGINT first cancels the MCP tool calls in flight
    (``mcp_servers.shutdown_all``: a slow one must not hold the graceful shutdown up, as llama-server)."""
    import uvicorn

    from ..server.mcp_servers import shutdown_all

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            shutdown_all()
            super().handle_exit(sig, frame)

    return Server(config)


def _template_kwargs(reasoning: str, raw: str | None) -> dict:
    """The server's default template variables: ``--chat-template-kwargs`` (a JSON object), then
    ``--reasoning`` as ``enable_thinking``: false for ``off``, else true (llama-server passes
    ``enable_thinking`` to every template, true unless ``--reasoning off``: tools/server/server-context.cpp,
    common/arg.cpp's truthy / falsey / auto); a ``--chat-template-kwargs`` ``enable_thinking`` wins over ``auto``.

    Raises:
        CooktopError: JSON that is not an object, or a ``--reasoning`` value other than those.
    """
    out: dict = {}
    if raw:
        try:
            out = json.loads(raw)
        except ValueError as e:
            raise CooktopError(f"--chat-template-kwargs: not JSON ({e})") from None
        if not isinstance(out, dict):
            raise CooktopError(f"--chat-template-kwargs: expected a JSON object, got {raw!r}")
    value = reasoning.strip().lower()
    if value in ("on", "true", "1", "enabled"):
        out["enable_thinking"] = True
    elif value in ("off", "false", "0", "disabled"):
        out["enable_thinking"] = False
    elif value == "auto":
        out.setdefault("enable_thinking", True)
    else:
        raise CooktopError(f"unknown value for --reasoning: {reasoning!r} (on, off or auto)")
    return out


def listen_sockets(hosts: str, port: int) -> list[socket.socket]:
    """One :func:`listen_socket` per address of ``hosts`` (comma-separated, llama-server's ``--host a,b``).

    Raises:
        CooktopError: no address, or one that cannot be listened on (those opened before are closed).
    """
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise CooktopError(f"--host {hosts!r}: no address")
    out: list[socket.socket] = []
    try:
        for h in names:
            out.append(listen_socket(h, port))
    except CooktopError:
        for s in out:
            if s is not None:
                s.close()
        raise
    return out


def urls(hosts: str, port: int, prefix: str = "") -> str:
    """``http://HOST:PORT{prefix}`` of each address of ``hosts`` (IPv6 in brackets), comma-separated."""
    return ", ".join(f"http://[{h}]:{port}{prefix}" if ":" in h else f"http://{h}:{port}{prefix}"
                     for h in (x.strip() for x in hosts.split(",")) if h)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds one (IPv6 when ``host`` has a colon,
    SO_REUSEADDR), for uvicorn to serve on.

    Raises:
        CooktopError: the address is in use, not this machine's, or not resolvable (named with host:port).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = "the address is already in use (another server on that port?)" if e.errno == errno.EADDRINUSE \
            else (e.strerror or str(e))
        raise CooktopError(f"cannot listen on {host}:{port}: {why}; choose another --port or --host") from None
    sock.set_inheritable(True)
    return sock


def request_defaults(n_predict: int, opts: dict) -> dict:
    """The server's defaults for request fields (``ServerConfig.defaults``) from the command line.

    Raises:
        CooktopError: more than one grammar option, or a file that cannot be read.
    """
    out = {d: opts[d] for d in SAMPLING_DESTS if d != "repeat_last_n"}
    out["max_tokens"] = n_predict
    out["ignore_eos"] = bool(opts["ignore_eos"])
    if opts["reverse_prompt"]:
        out["stop"] = list(opts["reverse_prompt"])
    src = grammar_source(opts)
    if src is not None and src[0] == "gbnf":
        out["grammar"] = src[1]
    elif src is not None:
        try:
            out["json_schema"] = json.loads(src[1])
        except json.JSONDecodeError as e:
            raise CooktopError(f"--json-schema is not valid JSON: {e}") from None
    return out


def _api_keys(api_key: str | None, api_key_file: str | None) -> str | None:
    """``--api-key`` (comma-separated) and ``--api-key-file``'s lines (not ``#`` comments, not empty)
    joined with commas (``ServerConfig.api_key``), or None when neither gives a key (llama.cpp
    common/arg.cpp: ``--api-key``, ``--api-key-file``).

    Raises:
        CooktopError: an unreadable key file, or a key in it containing a comma.
    """
    keys = [k for k in (api_key or "").split(",") if k]
    if api_key_file is not None:
        try:
            with open(api_key_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CooktopError(f"--api-key-file {api_key_file}: cannot read it ({e})") from None
        for line in lines:
            if line and not line.startswith("#"):
                if "," in line:
                    raise CooktopError(f"--api-key-file {api_key_file}: a key contains a comma, which cooktop "
                                       "uses to separate keys")
                keys.append(line)
    return ",".join(keys) or None
