"""Named chat formats for ``chat_format=`` / ``--chat-template NAME``: llama.cpp's built-in
templates (src/llama-chat.cpp ``llm_chat_apply_template``) written as jinja, with
llama-cpp-python's spellings as aliases and each format's end-of-turn stop strings.

:mod:`cooktop.text.chat_template` renders them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ChatTemplateError


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


def lookup_format(name: str) -> ChatFormat:
    """The named format ``name`` (canonical name or alias).

    Raises:
        ChatTemplateError: no format has that name (the message lists the known ones).
    """
    if isinstance(name, str) and name in _BY_NAME:
        return _BY_NAME[name]
    aliases = ", ".join(f"{a}={f.name}" for f in _FORMATS for a in f.aliases)
    raise ChatTemplateError(
        f"unknown chat format {name!r}; known formats: {', '.join(sorted(CHAT_FORMATS))} "
        f"(aliases: {aliases})")
