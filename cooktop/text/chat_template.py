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
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError

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

    tags: ClassVar[set[str]] = {"generation"}

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


def _flatten_content(content: Any, index: int) -> str:
    """One message's content as one string, as llama.cpp's legacy formatter sees it.

    llama.cpp ``common/chat.cpp`` (``common_chat_templates_apply_legacy``): a
    string as is; text parts joined with a newline; other parts dropped; no
    content is empty.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        text = ""
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                if text:
                    text += "\n"
                text += str(part.get("text", ""))
        return text
    raise ChatTemplateError(
        f"messages[{index}]['content'] must be a string, a list of content parts or null, "
        f"got {type(content).__name__}")


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
        fmt = _lookup_format(chat_format)
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
                Passed to a model template untouched.
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
        if self._flatten:
            messages = [{**m, "content": _flatten_content(m.get("content"), i)}
                        for i, m in enumerate(messages)]
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
# Named formats
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatFormat:
    """A named chat format.

    Attributes:
        name: canonical name (llama.cpp's where it has one).
        source: jinja text; sees ``messages`` with string contents,
            ``add_generation_prompt``, ``bos_token``, ``eos_token``, and
            llama.cpp's ``trim`` as the ``ctrim`` filter.
        stop: end-of-turn strings of the format.
        reference: the implementation whose text it reproduces.
        aliases: other names it answers to (llama-cpp-python's spellings).
    """

    name: str
    source: str
    stop: tuple[str, ...]
    reference: str
    aliases: tuple[str, ...] = ()


_LLAMA_CPP = "llama.cpp src/llama-chat.cpp"
_LCP = "llama-cpp-python llama_chat_format.py"


def _each(body: str, generation_prompt: str | None = None, before: str = "") -> str:
    """A template writing ``body`` (a jinja block using ``m``) for every message."""
    out = before + "{%- for m in messages -%}" + body + "{%- endfor -%}"
    if generation_prompt is not None:
        out += "{%- if add_generation_prompt -%}{{- " + generation_prompt + " -}}{%- endif -%}"
    return out


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    """llama.cpp's llama2 family: no assistant header; ``[INST]`` reopened after each answer."""
    content = "(m.content | ctrim)" if strip else "m.content"
    sys_text = "'<<SYS>>\\n' + c + '\\n<</SYS>>\\n\\n'" if system else "c + '\\n'"
    reopen = "'<s>[INST] '" if bos_inside else "'[INST] '"
    return _each(
        "{%- set c = " + content + " -%}"
        "{%- if not ns.inside -%}{%- set ns.inside = true -%}{{- " + reopen + " -}}{%- endif -%}"
        "{%- if m.role == 'system' -%}{{- " + sys_text + " -}}"
        "{%- elif m.role == 'user' -%}{{- c + ' [/INST]' -}}"
        "{%- else -%}{{- c + '</s>' -}}{%- set ns.inside = false -%}{%- endif -%}",
        before="{%- set ns = namespace(inside=true) -%}{{- '[INST] ' -}}")


def _mistral(leading: str, trailing: str, trim_answer: bool) -> str:
    """llama.cpp's mistral v1 / v3 / v3-tekken."""
    answer = "(m.content | ctrim)" if trim_answer else "m.content"
    return _each(
        "{%- if not ns.inside -%}{{- '" + leading + "[INST]" + trailing + "' -}}"
        "{%- set ns.inside = true -%}{%- endif -%}"
        "{%- if m.role == 'system' -%}{{- m.content + '\\n\\n' -}}"
        "{%- elif m.role == 'user' -%}{{- m.content + '" + leading + "[/INST]' -}}"
        "{%- else -%}{{- '" + trailing + "' + " + answer + " + '</s>' -}}"
        "{%- set ns.inside = false -%}{%- endif -%}",
        before="{%- set ns = namespace(inside=false) -%}")


def _mistral_v7(space: str) -> str:
    """llama.cpp's mistral v7 / v7-tekken."""
    return _each(
        "{%- if m.role == 'system' -%}{{- '[SYSTEM_PROMPT]" + space + "' + m.content + '[/SYSTEM_PROMPT]' -}}"
        "{%- elif m.role == 'user' -%}{{- '[INST]" + space + "' + m.content + '[/INST]' -}}"
        "{%- else -%}{{- '" + space + "' + m.content + '</s>' -}}{%- endif -%}")


def _vicuna(orca: bool) -> str:
    system = "'SYSTEM: ' + m.content + '\\n'" if orca else "m.content + '\\n\\n'"
    return _each(
        "{%- if m.role == 'system' -%}{{- " + system + " -}}"
        "{%- elif m.role == 'user' -%}{{- 'USER: ' + m.content + '\\n' -}}"
        "{%- elif m.role == 'assistant' -%}{{- 'ASSISTANT: ' + m.content + '</s>\\n' -}}{%- endif -%}",
        "'ASSISTANT:'")


def _by_role(system: str, user: str, assistant: str, generation_prompt: str | None) -> str:
    """One expression per role (``m.content`` is the message text); other roles are skipped."""
    return _each(
        "{%- if m.role == 'system' -%}{{- " + system + " -}}"
        "{%- elif m.role == 'user' -%}{{- " + user + " -}}"
        "{%- elif m.role == 'assistant' -%}{{- " + assistant + " -}}{%- endif -%}",
        generation_prompt)


_EOS_DEEPSEEK = "<\uff5cend\u2581of\u2581sentence\uff5c>"
_GLM_STOP = ("<|user|>", "<|observation|>")

_GEMMA = _each(
    "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + (m.content | ctrim) -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m.role == 'assistant' else m.role -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- (m.content | ctrim) + '<end_of_turn>\\n' -}}"
    "{%- endif -%}",
    "'<start_of_turn>model\\n'",
    before="{%- set ns = namespace(system='') -%}")

_ORION = _each(
    "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + m.content -%}"
    "{%- elif m.role == 'user' -%}{{- 'Human: ' -}}"
    "{%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- m.content + '\\n\\nAssistant: </s>' -}}"
    "{%- else -%}{{- m.content + '</s>' -}}{%- endif -%}",
    before="{%- set ns = namespace(system='') -%}")

# llama-cpp-python's "qwen": the first system message (or Qwen's default one),
# then user and assistant turns in chatml; other roles are left out.
_QWEN = (
    "{%- set ns = namespace(system='', found=false) -%}"
    "{%- for m in messages -%}{%- if m.role == 'system' and not ns.found -%}"
    "{%- set ns.system = m.content -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + (ns.system or 'You are a helpful assistant.') + '<|im_end|>\\n' -}}"
    + _each("{%- if m.role in ('user', 'assistant') -%}"
            "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}",
            "'<|im_start|>assistant\\n'"))

# llama-cpp-python's "alpaca": the first system message, a blank line, then
# "### Instruction: ..." / "### Response: ...</s>" turns. llama-cpp-python never
# writes the final "### Response:" header; here add_generation_prompt does.
_ALPACA = (
    "{%- set ns = namespace(system='', found=false) -%}"
    "{%- for m in messages -%}{%- if m.role == 'system' and not ns.found -%}"
    "{%- set ns.system = m.content -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}"
    "{{- ns.system + '\\n\\n' -}}"
    + _each("{%- if m.role == 'user' -%}{{- '### Instruction: ' + m.content + '\\n\\n' -}}"
            "{%- elif m.role == 'assistant' -%}{{- '### Response: ' + m.content + '</s>' -}}{%- endif -%}",
            "'### Response:'"))

_FORMATS: tuple[ChatFormat, ...] = (
    ChatFormat("chatml", _each("{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}",
                               "'<|im_start|>assistant\\n'"),
               ("<|im_end|>",), _LLAMA_CPP),
    ChatFormat("llama2", _llama2(system=False, bos_inside=False, strip=False), ("</s>",), _LLAMA_CPP,
               aliases=("mistral-instruct",)),
    ChatFormat("llama2-sys", _llama2(system=True, bos_inside=False, strip=False), ("</s>",), _LLAMA_CPP),
    ChatFormat("llama2-sys-bos", _llama2(system=True, bos_inside=True, strip=False), ("</s>",), _LLAMA_CPP,
               aliases=("llama-2",)),
    ChatFormat("llama2-sys-strip", _llama2(system=True, bos_inside=False, strip=True), ("</s>",), _LLAMA_CPP),
    ChatFormat("mistral-v1", _mistral(" ", " ", False), ("</s>",), _LLAMA_CPP),
    ChatFormat("mistral-v3", _mistral("", " ", True), ("</s>",), _LLAMA_CPP),
    ChatFormat("mistral-v3-tekken", _mistral("", "", False), ("</s>",), _LLAMA_CPP),
    ChatFormat("mistral-v7", _mistral_v7(" "), ("</s>",), _LLAMA_CPP),
    ChatFormat("mistral-v7-tekken", _mistral_v7(""), ("</s>",), _LLAMA_CPP),
    ChatFormat("phi3", _each("{{- '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' -}}", "'<|assistant|>\\n'"),
               ("<|end|>",), _LLAMA_CPP, aliases=("phi-3",)),
    ChatFormat("phi4", _each("{{- '<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>' -}}",
                             "'<|im_start|>assistant<|im_sep|>'"),
               ("<|im_end|>",), _LLAMA_CPP),
    ChatFormat("falcon3", _each("{{- '<|' + m.role + '|>\\n' + m.content + '\\n' -}}", "'<|assistant|>\\n'"),
               ("<|endoftext|>",), _LLAMA_CPP),
    ChatFormat("zephyr", _each("{{- '<|' + m.role + '|>\\n' + m.content + '<|endoftext|>\\n' -}}",
                               "'<|assistant|>\\n'"),
               ("<|endoftext|>",), _LLAMA_CPP),
    ChatFormat("monarch", _each("{{- ('' if loop.first else '<s>') + m.role + '\\n' + m.content + '</s>\\n' -}}",
                                "'<s>assistant\\n'"),
               ("</s>",), _LLAMA_CPP),
    ChatFormat("gemma", _GEMMA, ("<end_of_turn>",), _LLAMA_CPP),
    ChatFormat("orion", _ORION, ("</s>",), _LLAMA_CPP),
    ChatFormat("openchat", _each(
        "{%- if m.role == 'system' -%}{{- m.content + '<|end_of_turn|>' -}}"
        "{%- else -%}{{- 'GPT4 Correct ' + (m.role[:1] | upper) + m.role[1:] + ': ' + m.content"
        " + '<|end_of_turn|>' -}}{%- endif -%}",
        "'GPT4 Correct Assistant:'"), ("<|end_of_turn|>",), _LLAMA_CPP),
    ChatFormat("vicuna", _vicuna(orca=False), ("</s>",), _LLAMA_CPP),
    ChatFormat("vicuna-orca", _vicuna(orca=True), ("</s>",), _LLAMA_CPP),
    ChatFormat("deepseek", _by_role("m.content", "'### Instruction:\\n' + m.content + '\\n'",
                                    "'### Response:\\n' + m.content + '\\n<|EOT|>\\n'", "'### Response:\\n'"),
               ("<|EOT|>",), _LLAMA_CPP),
    ChatFormat("deepseek2", _by_role("m.content + '\\n\\n'", "'User: ' + m.content + '\\n\\n'",
                                     "'Assistant: ' + m.content + '" + _EOS_DEEPSEEK + "'", "'Assistant:'"),
               (_EOS_DEEPSEEK,), _LLAMA_CPP),
    ChatFormat("deepseek3", _by_role("m.content + '\\n\\n'", "'<\uff5cUser\uff5c>' + m.content",
                                     "'<\uff5cAssistant\uff5c>' + m.content + '" + _EOS_DEEPSEEK + "'",
                                     "'<\uff5cAssistant\uff5c>'"),
               (_EOS_DEEPSEEK,), _LLAMA_CPP),
    ChatFormat("command-r", _by_role(
        "'<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + (m.content | ctrim) + '<|END_OF_TURN_TOKEN|>'",
        "'<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + (m.content | ctrim) + '<|END_OF_TURN_TOKEN|>'",
        "'<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + (m.content | ctrim) + '<|END_OF_TURN_TOKEN|>'",
        "'<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'"), ("<|END_OF_TURN_TOKEN|>",), _LLAMA_CPP),
    ChatFormat("llama3", _each(
        "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (m.content | ctrim) + '<|eot_id|>' -}}",
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n'"), ("<|eot_id|>",), _LLAMA_CPP,
        aliases=("llama-3",)),
    ChatFormat("llama4", _each(
        "{{- '<|header_start|>' + m.role + '<|header_end|>\\n\\n' + (m.content | ctrim) + '<|eot|>' -}}",
        "'<|header_start|>assistant<|header_end|>\\n\\n'"), ("<|eot|>",), _LLAMA_CPP),
    ChatFormat("chatglm3", _each("{{- '<|' + m.role + '|>\\n ' + m.content -}}", "'<|assistant|>'",
                                 before="{{- '[gMASK]sop' -}}"), _GLM_STOP, _LLAMA_CPP),
    ChatFormat("chatglm4", _each("{{- '<|' + m.role + '|>\\n' + m.content -}}", "'<|assistant|>\\n'",
                                 before="{{- '[gMASK]<sop>' -}}"), _GLM_STOP + ("<|endoftext|>",), _LLAMA_CPP),
    ChatFormat("exaone3", _by_role("'[|system|]' + (m.content | ctrim) + '[|endofturn|]\\n'",
                                   "'[|user|]' + (m.content | ctrim) + '\\n'",
                                   "'[|assistant|]' + (m.content | ctrim) + '[|endofturn|]\\n'",
                                   "'[|assistant|]'"), ("[|endofturn|]",), _LLAMA_CPP),
    ChatFormat("granite", _each(
        "{{- '<|start_of_role|>' + m.role + '<|end_of_role|>' -}}"
        "{%- if m.role == 'assistant_tool_call' -%}{{- '<|tool_call|>' -}}{%- endif -%}"
        "{{- m.content + '<|end_of_text|>\\n' -}}",
        "'<|start_of_role|>assistant<|end_of_role|>'"), ("<|end_of_text|>",), _LLAMA_CPP),
    ChatFormat("megrez", _each("{{- '<|role_start|>' + m.role + '<|role_end|>' + m.content + '<|turn_end|>' -}}",
                               "'<|role_start|>assistant<|role_end|>'"), ("<|turn_end|>",), _LLAMA_CPP),
    ChatFormat("qwen", _QWEN, ("<|im_end|>", "<|endoftext|>"), _LCP),
    ChatFormat("alpaca", _ALPACA, ("### Instruction:",), _LCP),
)

#: Named formats by canonical name.
CHAT_FORMATS: Mapping[str, ChatFormat] = {f.name: f for f in _FORMATS}
_BY_NAME: dict[str, ChatFormat] = {**CHAT_FORMATS, **{a: f for f in _FORMATS for a in f.aliases}}


def chat_format_names() -> list[str]:
    """Every name ``chat_format=`` / ``--chat-template`` accepts (canonical names and aliases), sorted.

    Returns:
        The sorted names.

    Semantics: llama.cpp ``llama_chat_builtin_templates`` plus llama-cpp-python's
    spellings of the same formats.
    """
    return sorted(_BY_NAME)


def _lookup_format(name: str) -> ChatFormat:
    if isinstance(name, str) and name in _BY_NAME:
        return _BY_NAME[name]
    aliases = ", ".join(f"{a}={f.name}" for f in _FORMATS for a in f.aliases)
    raise ChatTemplateError(
        f"unknown chat format {name!r}; known formats: {', '.join(sorted(CHAT_FORMATS))} "
        f"(aliases: {aliases})")


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
        if name in _BY_NAME or _NAME_LIKE.fullmatch(name):
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
