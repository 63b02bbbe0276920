"""Chat templates: a conversation (OpenAI-shaped messages) to one prompt string.

Three kinds of template, one class (:class:`ChatTemplate`):

* **The model's own template** (GGUF ``tokenizer.chat_template``), rendered
  with the semantics of Hugging Face ``transformers``
  (``utils/chat_template_utils.py``: ``_compile_jinja_template`` and
  ``render_jinja_template``, which ``apply_chat_template`` calls): jinja2's
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
  ``lstrip_blocks``, the ``loopcontrols`` extension and the ``{% generation %}``
  tag, the ``raise_exception(msg)`` and ``strftime_now(fmt)`` globals, a
  ``tojson`` filter that keeps non-ASCII and does not HTML-escape, and the
  variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
  ``bos_token``, ``eos_token`` plus any extra keyword (``date_string``,
  ``enable_thinking``, ...). Messages are passed through untouched, as
  transformers does: a ``content`` that is a list of ``{"type": "text", ...}``
  parts reaches the template as that list.
* **A named format** (``chat_format="chatml"`` in llama-cpp-python,
  ``--chat-template chatml`` in llama-server): a jinja template kept here
  (:data:`CHAT_FORMATS`) that reproduces one reference implementation byte for
  byte, named in each entry's ``reference``. Where llama.cpp has the format
  (``src/llama-chat.cpp``, ``llm_chat_apply_template``) its text is the
  reference, checked against the expected outputs of llama.cpp's
  ``tests/test-chat-template.cpp``; llama-cpp-python's spellings
  (``llama-2``, ``llama-3``, ``mistral-instruct``, ``phi-3``) are aliases of
  the llama.cpp format of the same family. Formats only llama-cpp-python has
  (``alpaca``, ``qwen``) follow its ``llama_chat_format.py``. Named formats see
  each message's content as one string, as llama.cpp's legacy formatter does
  (text parts joined with newlines, other parts dropped, ``None`` as empty).
* **An override** (``--chat-template`` text or name, ``--chat-template-file``):
  jinja text rendered like a model template.

:func:`resolve_template` picks one of them the way llama-server and
llama-cpp-python do, and falls back to ``chatml`` for a model that has no
template, as llama.cpp does (``common/chat.cpp``, ``common_chat_templates_init``),
returning a notice that says so.

Every failure (a template that does not compile, one that calls
``raise_exception``, touches an undefined or unsafe value, or breaks on the
input) is a :class:`~cooktop.errors.ChatTemplateError` whose message names the
template and carries the template's own message.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError
from .chat_formats import CHAT_FORMATS, ChatFormat, chat_format_names, lookup_format
from .chat_messages import normalize, probe_capabilities

__all__ = [
    "CHAT_FORMATS",
    "EOT_MARKERS",
    "FALLBACK_FORMAT",
    "ChatFormat",
    "ChatTemplate",
    "TemplateChoice",
    "chat_format_names",
    "resolve_template",
    "strip_added_specials",
]

# Text of the tokens llama.cpp treats as end of generation when a vocabulary has
# them (src/llama-vocab.cpp, the EOG scan by token text). A template that writes
# one of these ends its turns with it, so generation must stop there.
EOT_MARKERS: tuple[str, ...] = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
    "[EOT]",  # Kimi-K2
    "<turn|>",  # Gemma 4
    "<|tool_response>",  # Gemma 4: ends a turn that called tools
)


# --------------------------------------------------------------------------------------
# The jinja environment (transformers semantics)
# --------------------------------------------------------------------------------------


class _TemplateRaised(jinja2.exceptions.TemplateError):
    """What ``raise_exception(msg)`` raises; transformers raises a plain ``TemplateError``."""


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter: ``json.dumps`` keeping non-ASCII, no HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


_C_SPACE = " \t\n\v\f\r"


def _c_trim(value: Any) -> str:
    """llama.cpp's ``trim`` (src/llama-chat.cpp): strip C ``isspace`` characters only."""
    return str(value).strip(_C_SPACE)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body.

    transformers parses this tag (its ``AssistantTracker`` extension, used for
    assistant-token masks in training); a template that has it must compile
    here too. Only the body's text matters for a prompt.
    """

    tags = {"generation"}  # jinja2.ext.Extension declares it as an instance attribute

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment(**filters: Callable[..., Any]) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters.update(filters)
    env.globals["raise_exception"] = _raise_exception
    return env


# Model and override templates see exactly transformers' environment; the named
# formats (written here) also get llama.cpp's trim.
_ENV = _environment()
_FORMAT_ENV = _environment(ctrim=_c_trim)

# Exceptions a template can raise from its own code or from the values it is
# given (e.g. ``'a' + message.content`` with a list content): the template's
# problem or the caller's input, never cooktop's bug.
_RENDER_ERRORS = (jinja2.exceptions.TemplateError, TypeError, ValueError, LookupError,
                  AttributeError, ArithmeticError, RecursionError)


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception was raised at (jinja rewrites tracebacks to template lines)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _describe(exc: BaseException) -> str:
    """The exception's own message, with its type unless it is a template error."""
    msg = exc.message if isinstance(exc, jinja2.exceptions.TemplateError) else str(exc)
    msg = (msg or "").strip() or type(exc).__name__
    if not isinstance(exc, jinja2.exceptions.TemplateError):
        msg = f"{type(exc).__name__}: {msg}"
    elif isinstance(exc, jinja2.exceptions.SecurityError):
        msg = f"blocked by the sandbox: {msg}"
    return msg


def _at_line(exc: BaseException) -> str:
    line = _template_line(exc)
    return f" (template line {line})" if line else ""


# --------------------------------------------------------------------------------------
# ChatTemplate
# --------------------------------------------------------------------------------------


def _check_list_of_dicts(value: Any, what: str, shape: str) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ChatTemplateError(f"{what} must be a list of {shape}, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ChatTemplateError(f"{what}[{i}] must be a dict ({shape}), got {type(item).__name__}")


class ChatTemplate:
    """A compiled chat template with the tokens and stop strings it goes with.

    Args:
        source: the jinja text (a model's ``tokenizer.chat_template``, a
            ``--chat-template`` override, or a named format's text).
        bos_token: text of the model's BOS token, the template's ``bos_token``
            (``""`` when the vocabulary has none, as llama.cpp passes it).
        eos_token: text of the model's EOS token, the template's ``eos_token``.
        name: how messages name this template, e.g. ``"the model's chat
            template (tokenizer.chat_template)"``.
        stop: end-of-turn strings generation stops at. ``None`` (a model or
            override template): every :data:`EOT_MARKERS` string the source
            writes, as llama.cpp marks those tokens end-of-generation, less
            ``<|end|>`` when ``<|return|>`` and ``<|call|>`` are there too
            (gpt-oss, where ``<|end|>`` only closes a channel;
            llama.cpp src/llama-vocab.cpp does the same). The EOS text is
            always added.
        clock: what ``strftime_now`` reads, ``datetime.now`` by default; tests
            fix it.

    Attributes:
        source, bos_token, eos_token, name: as given.
        stop: tuple of stop strings (see ``stop`` above).
        chat_format: the canonical format name for a named format, else ``None``.

    Raises:
        ChatTemplateError: the source does not compile (the message names the
            template, the line and jinja's message), or is not a string.

    Semantics: transformers ``utils/chat_template_utils.py``
    (``_compile_jinja_template``, ``render_jinja_template``).
    """

    def __init__(self, source: str, bos_token: str | None = "", eos_token: str | None = "", *,
                 name: str = "chat template", stop: Iterable[str] | None = None,
                 clock: Callable[[], _dt.datetime] | None = None) -> None:
        if not isinstance(source, str):
            raise ChatTemplateError(f"{name} must be text, got {type(source).__name__}")
        self._setup(source, bos_token, eos_token, name,
                    tuple(stop) if stop is not None else _markers_in(source), clock, _ENV, None)

    def _setup(self, source: str, bos_token: str | None, eos_token: str | None, name: str,
               stop: tuple[str, ...], clock: Callable[[], _dt.datetime] | None,
               env: ImmutableSandboxedEnvironment, chat_format: str | None) -> None:
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.name = name
        self.chat_format = chat_format
        self._flatten = chat_format is not None  # named formats see string contents only
        self._caps: tuple[bool, bool] | None = (False, False) if self._flatten else None
        self._clock = clock or _dt.datetime.now
        self._template = self._compile(env)
        if self.eos_token and self.eos_token not in stop:
            stop += (self.eos_token,)
        self.stop: tuple[str, ...] = stop

    def _compile(self, env: ImmutableSandboxedEnvironment) -> jinja2.Template:
        try:
            return env.from_string(self.source, globals={"strftime_now": self._strftime_now})
        except jinja2.exceptions.TemplateSyntaxError as e:
            line = f" (template line {e.lineno})" if e.lineno else ""
            raise ChatTemplateError(f"{self.name} does not compile{line}: {e.message}") from None
        except _RENDER_ERRORS as e:  # e.g. an unknown filter or test name
            raise ChatTemplateError(f"{self.name} does not compile{_at_line(e)}: {_describe(e)}") from None

    def _strftime_now(self, fmt: str) -> str:
        return self._clock().strftime(fmt)

    @classmethod
    def from_format(cls, chat_format: str, bos_token: str | None = "", eos_token: str | None = "", *,
                    clock: Callable[[], _dt.datetime] | None = None) -> ChatTemplate:
        """The template of a named format (``chat_format="chatml"``, ``--chat-template chatml``).

        Args:
            chat_format: a canonical name or an alias from :func:`chat_format_names`.
            bos_token, eos_token, clock: as for :class:`ChatTemplate`.

        Returns:
            A :class:`ChatTemplate` whose ``stop`` is the format's end-of-turn
            strings (plus the EOS text) and whose ``chat_format`` is the
            canonical name.

        Raises:
            ChatTemplateError: unknown name; the message lists the known ones.

        Semantics: llama-cpp-python ``Llama(chat_format=...)`` and llama-server
        ``--chat-template NAME``; each format's text is that of its
        ``reference`` (llama.cpp src/llama-chat.cpp or llama-cpp-python
        llama_chat_format.py).
        """
        fmt = lookup_format(chat_format)
        label = fmt.name if fmt.name == chat_format else f"{chat_format} = {fmt.name}"
        self = cls.__new__(cls)
        self._setup(fmt.source, bos_token, eos_token, f"chat format {label!r}", fmt.stop, clock,
                    _FORMAT_ENV, fmt.name)
        return self

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> str:
        """Render a conversation to the prompt text.

        Args:
            messages: OpenAI-shaped message dicts (``role``, ``content`` as a
                string, a list of ``{"type": "text", "text": ...}`` parts, or
                ``None``; ``tool_calls``, ``name``, ... as the template reads them).
                Content is made renderable by this template (``chat_messages.normalize``:
                text parts joined and ``None`` as ``""`` where the template cannot take
                them; image or audio parts refused).
            add_generation_prompt: end with the assistant header so the model
                answers (llama-cpp-python always does; transformers' default is
                ``False``).
            tools: OpenAI ``tools`` (list of JSON-schema dicts) or ``None``.
            documents: retrieval documents (list of dicts) or ``None``.
            **kwargs: further template variables (``date_string``,
                ``enable_thinking``, ...); ``bos_token``/``eos_token`` here
                override the template's.

        Returns:
            The prompt text, BOS text included when the template writes it
            (see :func:`strip_added_specials` before tokenizing with add_bos).

        Raises:
            ChatTemplateError: the template raised (``raise_exception``), read
                an undefined value, was stopped by the sandbox, or failed on the
                input; or ``messages``/``tools``/``documents`` are not lists of
                dicts. The message names the template and gives its own message.

        Semantics: transformers ``render_jinja_template`` (one conversation,
        no assistant mask, no ``continue_final_message``).
        """
        _check_list_of_dicts(messages, "messages", "{'role': ..., 'content': ...} messages")
        if tools is not None:
            _check_list_of_dicts(tools, "tools", "JSON-schema tool dicts")
        if documents is not None:
            _check_list_of_dicts(documents, "documents", "document dicts")
        if self._caps is None:
            self._caps = probe_capabilities(lambda ms: self._template.render(
                messages=ms, tools=None, documents=None, add_generation_prompt=False,
                bos_token=self.bos_token, eos_token=self.eos_token))
        messages = normalize(messages, *self._caps)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        try:
            return self._template.render(messages=messages, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except _TemplateRaised as e:
            raise ChatTemplateError(f"{self.name} refused the conversation: {e.message}") from None
        except _RENDER_ERRORS as e:
            raise ChatTemplateError(f"{self.name} failed{_at_line(e)}: {_describe(e)}") from None

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, stop={self.stop!r})"


def _markers_in(source: str) -> tuple[str, ...]:
    found = tuple(m for m in EOT_MARKERS if m in source)
    if "<|return|>" in found and "<|call|>" in found:
        found = tuple(m for m in found if m != "<|end|>")
    return found


def strip_added_specials(prompt: str, bos_token: str | None, eos_token: str | None, *,
                         add_bos: bool, add_eos: bool = False) -> str:
    """Drop a leading BOS / trailing EOS text the tokenizer is about to add anyway.

    Args:
        prompt: a rendered prompt.
        bos_token, eos_token: their texts (``None``/``""`` when absent).
        add_bos, add_eos: whether tokenization will add them (the vocabulary's
            ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``).

    Returns:
        ``prompt`` without the text that would become a second BOS or EOS.

    Semantics: llama.cpp common/chat.cpp (after applying a jinja template, "to
    avoid double BOS / EOS tokens").
    """
    if add_bos and bos_token and prompt.startswith(bos_token):
        prompt = prompt[len(bos_token):]
    if add_eos and eos_token and prompt.endswith(eos_token):
        prompt = prompt[: -len(eos_token)]
    return prompt


# --------------------------------------------------------------------------------------
# Which template
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateChoice:
    """What :func:`resolve_template` chose.

    Attributes:
        template: the :class:`ChatTemplate` to render with.
        notice: a one-line message for the log when the model's own template
            was not used and the caller did not ask for another (a fallback),
            else ``None``.
        tool_use: the model's ``tokenizer.chat_template.tool_use`` when it has
            one besides its default template and no option overrode them, else
            ``None``; llama.cpp renders with it when a request has tools
            (:meth:`for_request`).
    """

    template: ChatTemplate
    notice: str | None = None
    tool_use: ChatTemplate | None = None

    def for_request(self, tools: Sequence[Any] | None = None) -> ChatTemplate:
        """The template for one request: ``tool_use`` when the request has tools and there is one.

        Args:
            tools: the request's ``tools`` (``None`` or empty: none).

        Returns:
            The :class:`ChatTemplate` to render that request with.

        Semantics: llama.cpp common/chat.cpp (``common_chat_templates_apply_jinja``
        picks ``template_tool_use`` when tools are given).
        """
        return self.tool_use if tools and self.tool_use is not None else self.template


#: What a model without a chat template gets (llama.cpp common/chat.cpp, CHATML_TEMPLATE_SRC).
FALLBACK_FORMAT = "chatml"

_NAME_LIKE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def resolve_template(model_template: str | None = None, *, chat_format: str | None = None,
                     chat_template: str | None = None, chat_template_file: str | os.PathLike[str] | None = None,
                     tool_use_template: str | None = None, bos_token: str | None = "",
                     eos_token: str | None = "",
                     clock: Callable[[], _dt.datetime] | None = None) -> TemplateChoice:
    """Choose the chat template for a model and the caller's options.

    In order: ``chat_template_file`` (``--chat-template-file``: jinja text from
    a file), ``chat_template`` (``--chat-template``: a format name, or jinja
    text), ``chat_format`` (``Llama(chat_format=...)``: a format name), the
    model's ``tokenizer.chat_template`` (with its
    ``tokenizer.chat_template.tool_use`` beside it for requests with tools),
    the model's ``tokenizer.chat_template.tool_use`` alone, and last ``chatml``, which is what
    llama.cpp and llama-server use for a model without a template
    (llama-cpp-python falls back to ``llama-2`` instead); that last case comes
    with a notice.

    Args:
        model_template: the model's ``tokenizer.chat_template`` (``None`` or
            ``""`` when it has none).
        chat_format: a named format (:func:`chat_format_names`).
        chat_template: ``--chat-template`` value: a format name, or jinja text.
            A single word that is not a known name is an error (not rendered as
            literal text).
        chat_template_file: path of a jinja file (``--chat-template-file``).
        tool_use_template: the model's ``tokenizer.chat_template.tool_use``.
        bos_token, eos_token: texts of the model's BOS/EOS tokens.
        clock: for ``strftime_now`` (tests).

    Returns:
        :class:`TemplateChoice`: ``template``, ``notice`` (for the log, on a
        fallback) and ``tool_use`` (the model's tool-use template beside its
        default one; :meth:`TemplateChoice.for_request` picks per request).

    Raises:
        ChatTemplateError: more than one of ``chat_format``, ``chat_template``,
            ``chat_template_file``; an unknown format name; an unreadable or
            empty file; a template that does not compile.

    Semantics: llama.cpp common/chat.cpp ``common_chat_templates_init``
    (override, model template, tool_use template, chatml), llama-cpp-python
    ``Llama.__init__`` (``chat_format``).
    """
    given = [n for n, v in (("chat_format", chat_format), ("chat_template", chat_template),
                            ("chat_template_file", chat_template_file)) if v is not None]
    if len(given) > 1:
        raise ChatTemplateError(f"give only one of chat_format, chat_template, chat_template_file (got "
                                f"{', '.join(given)})")
    tokens: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token, "clock": clock}
    if chat_template_file is not None:
        path = os.fspath(chat_template_file)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read chat template file {path}: {e}") from None
        if not text.strip():
            raise ChatTemplateError(f"chat template file {path} is empty")
        return TemplateChoice(ChatTemplate(text, name=f"chat template file {path}", **tokens), None)
    if chat_template is not None:
        if not isinstance(chat_template, str) or not chat_template.strip():
            raise ChatTemplateError("--chat-template is empty; give a format name or jinja text")
        name = chat_template.strip()
        if name in chat_format_names() or _NAME_LIKE.fullmatch(name):
            return TemplateChoice(ChatTemplate.from_format(name, **tokens), None)
        return TemplateChoice(ChatTemplate(chat_template, name="--chat-template", **tokens), None)
    if chat_format is not None:
        return TemplateChoice(ChatTemplate.from_format(chat_format, **tokens), None)
    tool_use = (ChatTemplate(tool_use_template, name="the model's tool-use chat template "
                             "(tokenizer.chat_template.tool_use)", **tokens) if tool_use_template else None)
    if model_template:
        return TemplateChoice(
            ChatTemplate(model_template, name="the model's chat template (tokenizer.chat_template)", **tokens),
            None, tool_use)
    if tool_use is not None:
        return TemplateChoice(
            tool_use, "the model has no default chat template; using its tool_use template, as llama.cpp does")
    return TemplateChoice(
        ChatTemplate.from_format(FALLBACK_FORMAT, **tokens),
        f"the model has no chat template (tokenizer.chat_template); using {FALLBACK_FORMAT!r}, as llama.cpp "
        "does (llama-cpp-python would use 'llama-2'); choose another with chat_format= or --chat-template")
