"""OpenAI / llama-server request bodies to ``Llama`` arguments, and errors to OpenAI-shaped JSON.

Requests are plain JSON objects checked here field by field, so every bad
value becomes an HTTP 400 naming the field (not a validation dump). Sampling
defaults are llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p
0.05, no token limit). llama-server's own fields (``top_k``, ``min_p``,
``typical_p``, ``repeat_penalty``, ``repeat_last_n``, ``n_predict``,
``grammar``, ``json_schema``) are accepted beside OpenAI's.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from ..engine.grammar import GrammarError
from ..errors import ChatTemplateError, ClusterError, ContextOverflowError, CooktopError, DeviceError
from ..text.tokenizer import InvalidTokenError
from ..text.tool_calls import ToolCallError
from .slots import OverloadedError

MAX_N = 16  #: most choices per request


class HTTPError(CooktopError):
    """An error with its HTTP status and OpenAI error type."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param = status, type_, param


def error_body(status: int, message: str, type_: str, param: str | None = None,
               exc: BaseException | None = None) -> dict[str, Any]:
    """OpenAI's error object (``code`` is the HTTP status, as llama-server sends it); for a
    :class:`ContextOverflowError` ``exc`` also llama-server's ``n_prompt_tokens`` and ``n_ctx`` (the
    slot's context, tokens: tools/server/server-task.cpp ``server_task_result_error::to_json``)."""
    err: dict[str, Any] = {"code": status, "message": message, "type": type_, "param": param}
    if isinstance(exc, ContextOverflowError) and exc.n_ctx:
        err.update(n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    return {"error": err}


def classify(exc: BaseException) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) for an exception raised while serving a request."""
    if isinstance(exc, HTTPError):
        return exc.status, exc.type
    if isinstance(exc, (OverloadedError, ClusterError)):  # a cluster node lost: the replica is restarted
        return 503, "unavailable_error"
    if isinstance(exc, ContextOverflowError):
        return 400, "exceed_context_size_error"
    if isinstance(exc, DeviceError):  # a device's failure, not the request's
        return 500, "server_error"
    if isinstance(exc, (ChatTemplateError, GrammarError, InvalidTokenError, ToolCallError, CooktopError, TypeError)):
        return 400, "invalid_request_error"
    return 500, "server_error"


def bad(param: str, message: str) -> HTTPError:
    return HTTPError(400, f"{param}: {message}", param=param)


def field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None, *,
          minimum: float | None = None, maximum: float | None = None) -> Any:
    """``body[name]`` checked against ``kinds`` (None -> ``default``).

    Raises:
        HTTPError: 400 naming the field, for a wrong type or a value out of range.
    """
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in (
        kinds if isinstance(kinds, tuple) else (kinds,)))
    if not ok:
        names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise bad(name, f"expected {names}, got {type(value).__name__} {value!r:.60}")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(name, f"must be a finite number, got {value}")
    if minimum is not None and isinstance(value, (int, float)) and value < minimum:
        raise bad(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and isinstance(value, (int, float)) and value > maximum:
        raise bad(name, f"must be <= {maximum}, got {value}")
    return value


_NUM = (int, float)


#: llama-server's request defaults (``cooktop serve``'s command line overrides them).
DEFAULTS: dict[str, Any] = dict(max_tokens=-1, temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, typical_p=1.0,
                                repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, ignore_eos=False)


def sampling_args(body: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sampling keyword arguments shared by chat and completions.

    Args:
        defaults: values for fields the body leaves out (the server's command line), over
            :data:`DEFAULTS`; ``stop``, ``grammar`` and ``json_schema`` may be among them.
    Raises:
        HTTPError: a field of the wrong type or out of range.
    """
    d = {**DEFAULTS, **(defaults or {})}
    # OpenAI refuses a negative limit; 0 is llama-server's "generate nothing", n_predict -1 its "no limit"
    max_tokens = field(body, "max_completion_tokens", int, None, minimum=0)
    if max_tokens is None:
        max_tokens = field(body, "max_tokens", int, None, minimum=0)
    if max_tokens is None:
        max_tokens = field(body, "n_predict", int, d["max_tokens"], minimum=-1)  # llama-server's limits: -1..
    stop = body.get("stop", d.get("stop"))
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(
            isinstance(s, str) for s in stop))):
        raise bad("stop", "expected a string or a list of strings")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, (dict, list)):
        raise bad("logit_bias", "expected an object mapping token ids to numbers")
    for name in ("mirostat", "mirostat_mode"):  # llama-server's name, llama-cpp-python's
        if field(body, name, int, 0) != 0:
            raise bad(name, "mirostat sampling is not implemented in cooktop; use 0 (off)")
    if isinstance(bias, list):  # llama-server also takes [[id or text, bias], ...]
        bias = {str(p[0]) if not isinstance(p[0], str) else "text:" + p[0]: (-math.inf if p[1] is False else p[1])
                for p in bias if isinstance(p, list) and len(p) == 2}
    return dict(
        max_tokens=max_tokens,
        temperature=field(body, "temperature", _NUM, d["temperature"], minimum=0.0),
        top_p=field(body, "top_p", _NUM, d["top_p"], minimum=0.0, maximum=1.0),
        top_k=field(body, "top_k", int, d["top_k"]),
        min_p=field(body, "min_p", _NUM, d["min_p"], minimum=0.0, maximum=1.0),
        typical_p=field(body, "typical_p", _NUM, d["typical_p"], minimum=0.0, maximum=1.0),
        repeat_penalty=field(body, "repeat_penalty", _NUM, d["repeat_penalty"], minimum=0.0),
        presence_penalty=field(body, "presence_penalty", _NUM, d["presence_penalty"], minimum=-2.0, maximum=2.0),
        frequency_penalty=field(body, "frequency_penalty", _NUM, d["frequency_penalty"], minimum=-2.0, maximum=2.0),
        seed=field(body, "seed", int, None),
        ignore_eos=field(body, "ignore_eos", bool, d["ignore_eos"]),
        stop=stop,
        logit_bias=bias,
    )


def vocab_logit_bias(bias: Any, n_vocab: int, tokenize: Any) -> Any:
    """``logit_bias`` as the sampler takes it (``{id: bias}``), read as llama-server reads it
    (tools/server/server-task.cpp ``params_from_json_cmpl``): token ids outside the vocabulary
    dropped; a key that is not a token id (an object's key, or a text from the list form) biases
    each token of its text (``tokenize(text) -> ids``, no BOS); ``false`` is -inf. Not a dict:
    returned as is (the API's check names it).
    """
    if not isinstance(bias, dict):
        return bias
    out: dict[str, Any] = {}
    for k, v in bias.items():
        v = -math.inf if v is False else v
        text = k[5:] if isinstance(k, str) and k.startswith("text:") else None
        if text is None:
            try:
                tid = int(k)
            except (TypeError, ValueError):
                text = str(k)
            else:
                if 0 <= tid < n_vocab:
                    out[str(tid)] = v
                continue
        for t in tokenize(text):
            out[str(t)] = v
    return out


def grammar_arg(body: dict[str, Any], defaults: dict[str, Any] | None = None) -> Any:
    """llama-server's ``grammar`` (GBNF) or ``json_schema`` as a ``LlamaGrammar`` (None if neither);
    without either (and without ``response_format``), the server's default grammar, if any."""
    from ..api.grammar import LlamaGrammar
    grammar, schema = body.get("grammar"), body.get("json_schema")
    if grammar is None and schema is None and body.get("response_format") is None and defaults:
        grammar, schema = defaults.get("grammar"), defaults.get("json_schema")
    if grammar is not None and schema is not None:
        raise bad("grammar", "give either grammar or json_schema, not both")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise bad("grammar", "expected GBNF text")
        return LlamaGrammar.from_string(grammar)
    if schema is not None:
        if not isinstance(schema, dict):
            raise bad("json_schema", "expected a JSON schema object")
        # llama-server: an empty schema means any object (tools/server/server-schema.cpp)
        return LlamaGrammar.from_json_schema(schema or {"type": "object"})
    return None


def id_slot(body: dict[str, Any]) -> int:
    """llama-server's ``id_slot`` field: the slot to run on (modulo the slots), -1 (default) any.

    Raises:
        HTTPError: 400 when it is not an integer of at least -1.
    """
    v = field(body, "id_slot", int, -1)
    if v < -1:
        raise bad("id_slot", f"expected -1 (any slot) or a slot id, got {v}")
    return v


def n_choices(body: dict[str, Any]) -> int:
    """``n``: 1..MAX_N choices.

    Raises:
        HTTPError: out of range.
    """
    return field(body, "n", int, 1, minimum=1, maximum=MAX_N)


def template_context(now: _dt.datetime | None = None) -> dict[str, str]:
    """The variables llama-server gives every chat template (common/chat.cpp ``common_chat_extra_context``):
    ``date_string`` (``"07 Dec 2026"``) and ``datetime`` (``"Dec 07 2026"``) of today (``now``)."""
    now = now or _dt.datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


def agent_args(body: dict[str, Any], config: Any = None) -> dict[str, Any]:
    """Tool and reasoning arguments of a chat body: ``tool_choice``, ``parallel_tool_calls``,
    ``chat_template_kwargs`` (over :func:`template_context` and the server's ``template_kwargs``),
    ``reasoning_format`` / ``reasoning_budget`` (defaults: the server's flags).

    Raises:
        HTTPError: a field of the wrong type.
    """
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs", "expected an object of template variables")
    kwargs = {**template_context(), **(getattr(config, "template_kwargs", None) or {}), **(kwargs or {})}
    return dict(tool_choice=body.get("tool_choice"),
                parallel_tool_calls=field(body, "parallel_tool_calls", bool, None),
                chat_template_kwargs=kwargs,
                reasoning_format=field(body, "reasoning_format", str, getattr(config, "reasoning_format", None)),
                reasoning_budget=field(body, "reasoning_budget", int, getattr(config, "reasoning_budget", None)))


def chat_args(body: dict[str, Any], config: Any = None) -> dict[str, Any]:
    """``create_chat_completion`` keyword arguments from a ``/v1/chat/completions`` body
    (``config``: the server's defaults for :func:`agent_args`, and its ``defaults`` for
    :func:`sampling_args`).

    Raises:
        HTTPError: 400 for a missing or malformed field.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}]", "expected an object with a 'role' string")
    defaults = getattr(config, "defaults", None)
    args = sampling_args(body, defaults)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", "expected a list")
    logprobs = field(body, "logprobs", bool, False)
    top = field(body, "top_logprobs", int, None, minimum=0, maximum=20)
    grammar = grammar_arg(body, defaults)
    rf = body.get("response_format")
    if rf is not None and grammar is not None:
        raise bad("response_format", "give either response_format or grammar/json_schema, not both")
    from ..api.grammar import from_response_format
    from_response_format(rf)  # checked now, also for an answer of no tokens (GrammarError: a 400)
    args.update(messages=messages, tools=tools, logprobs=logprobs, top_logprobs=top,
                post_sampling_probs=field(body, "post_sampling_probs", bool, False), response_format=rf,
                grammar=grammar, **agent_args(body, config), **continuation(body, messages, config))
    return args


def continuation(body: dict[str, Any], messages: list[dict[str, Any]], config: Any = None) -> dict[str, bool]:
    """``add_generation_prompt`` and ``continue_final_message`` of a chat body, as llama-server reads them
    (tools/server/server-common.cpp ``oaicompat_chat_params_parse``): ``continue_final_message`` true (or
    ``"content"``) continues the last (assistant) message; without it, an assistant message last is
    continued anyway unless the server runs with ``--no-prefill-assistant`` (``config.prefill_assistant``).

    Raises:
        HTTPError: 400 for two assistant messages last (prefill), or both fields true.
    """
    gen = field(body, "add_generation_prompt", bool, True)
    raw = body.get("continue_final_message")
    if raw == "reasoning_content":
        raise bad("continue_final_message", "continuing the reasoning is not supported; use true or \"content\"")
    cont = raw is True or raw == "content"
    if not cont and getattr(config, "prefill_assistant", True) and messages[-1].get("role") == "assistant":
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise bad("messages", "Cannot have 2 or more assistant messages at the end of the list.")
        cont, gen = True, False
    if cont and gen:
        raise bad("continue_final_message", "Cannot set both add_generation_prompt and continue_final_message to true.")
    return {"add_generation_prompt": gen, "continue_final_message": cont}


def completion_args(body: dict[str, Any], defaults: dict[str, Any] | None = None) -> tuple[list[Any], dict[str, Any]]:
    """(prompts, ``create_completion`` keyword arguments) from a ``/v1/completions`` body.

    ``prompt`` may be a string, token ids, or a list of either (one choice each).

    Raises:
        HTTPError: 400 for a missing or malformed field, or ``post_sampling_probs: true`` (served on
            ``/completion`` and ``/v1/chat/completions``, not here).
    """
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p)) for p in prompt):
        prompts = list(prompt)
    else:
        raise bad("prompt", "expected a string, a list of token ids, or a list of those")
    args = sampling_args(body, defaults)
    lp = body.get("logprobs")
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20):
        raise bad("logprobs", f"expected an integer 0..20, got {lp!r}")
    if field(body, "post_sampling_probs", bool, False):
        raise bad("post_sampling_probs", "not on /v1/completions (OpenAI's logprobs are logs of the raw "
                                         "distribution); use /completion with n_probs, or /v1/chat/completions")
    n_predict = args.pop("max_tokens")  # llama-server's count: 0 generates nothing, < 0 until the context is full
    args.update(logprobs=lp, echo=field(body, "echo", bool, False), suffix=field(body, "suffix", str, None),
                grammar=grammar_arg(body, defaults), n_predict=max(n_predict, -1))
    return prompts, args
