"""What one chat request renders and how its answer is read: tools, tool_choice, reasoning.

:func:`plan_chat` checks ``tools`` / ``tool_choice`` (a 400-class
:class:`~cooktop.text.tool_calls.ToolCallError` on bad ones), picks the template's
tool-call format (:func:`cooktop.text.tool_calls.detect_format`), prepares the
messages the template reads (tool-call arguments as objects; the generic
format's system text), the grammar that enforces ``required`` / a named
function (and the generic JSON shape), and the template variables
(``chat_template_kwargs``; ``enable_thinking=False`` for a reasoning budget of 0).
:class:`ThinkBudget` ends a ``<think>`` block (Gemma 4's thought channel) after ``reasoning_budget`` tokens
by forcing the closing tag (llama.cpp's reasoning-budget sampler).
:func:`assemble_message` joins streamed deltas into one ``message``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ..errors import CooktopError
from ..text import gemma4_calls
from ..text.exact import ExactTokenizer
from ..text.reasoning import THINK_CLOSE, THINK_OPEN, reasoning_format_name
from ..text.tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED
from ..text.tool_calls import MARKERS, ToolCallError, detect_format
from ..text.tool_grammar import (
    call_grammar,
    check_tool_choice,
    check_tools,
    generic_schema,
    generic_system_text,
    template_messages,
)
from .grammar import LlamaGrammar


@dataclasses.dataclass
class ChatPlan:
    """The rendering and parsing of one chat request.

    Attributes:
        messages, tools: what the template gets; template_kwargs: extra template variables.
        grammar: the grammar that constrains the answer (None: free text).
        fmt: the tool-call format; parse_tools: read tool calls from the answer.
        reasoning_format: ``none`` / ``deepseek`` / ``deepseek-legacy``; budget: thinking tokens (-1: any).
        preserved: ids of the control tokens among the format's markers, printed in the answer
            so the parser sees them (llama.cpp ``preserved_tokens``).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]
    grammar: Any
    fmt: str
    parse_tools: bool
    reasoning_format: str
    budget: int
    preserved: frozenset[int] = frozenset()


def _preserved(llm: Any, fmt: str) -> frozenset[int]:
    """The control tokens among ``fmt``'s markers (and ``<think>`` / ``</think>``) in ``llm``'s vocabulary."""
    cache = getattr(llm, "_preserved_ids", None)
    if cache is None:
        cache = llm._preserved_ids = {}
    if fmt not in cache:
        tk = llm._tokenizer
        types = getattr(tk, "_types", None) or tk.vocab.token_types.tolist()
        ids = (_special_id(llm, m) for m in (*MARKERS.get(fmt, ()), THINK_OPEN, THINK_CLOSE))
        cache[fmt] = frozenset(i for i in ids if i is not None and types[i] == TOKEN_TYPE_CONTROL)
    return cache[fmt]


def _special_id(llm: Any, text: str) -> int | None:
    """The id of the one special token spelled ``text`` in ``llm``'s vocabulary, else None."""
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    if len(ids) != 1:
        return None
    tk = llm._tokenizer
    types = getattr(tk, "_types", None) or tk.vocab.token_types.tolist()
    return ids[0] if types[ids[0]] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED) else None


def plan_chat(llm: Any, messages: list[dict[str, Any]], *, tools: Any, tool_choice: Any, grammar: Any,
              parallel_tool_calls: bool | None, reasoning_format: str | None,
              chat_template_kwargs: dict[str, Any] | None, reasoning_budget: int | None) -> ChatPlan:
    """Check a chat request's tools and reasoning options and plan its rendering.

    Args:
        llm: the :class:`~cooktop.api.llama.Llama`.
        messages: the conversation; tools: OpenAI ``tools`` or None; tool_choice: OpenAI's.
        grammar: the caller's grammar (not allowed together with tools unless tool_choice is none,
            as in llama.cpp).
        parallel_tool_calls: allow several calls in one answer (default False, llama-server's).
        reasoning_format: ``none`` | ``deepseek`` | ``deepseek-legacy`` | ``auto`` (None: auto).
        chat_template_kwargs: extra template variables (``enable_thinking``, ...).
        reasoning_budget: -1 unlimited, 0 no thinking, N > 0 at most N thinking tokens.
    Raises:
        ToolCallError: bad tools, tool_choice, tool-call messages, options, or grammar with tools.
        GrammarError: a tool's parameters schema that llguidance cannot compile.
    """
    try:
        rfmt = reasoning_format_name(reasoning_format)
    except ValueError as e:
        raise ToolCallError(str(e)) from None
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise ToolCallError("chat_template_kwargs must be an object of template variables")
    budget = -1 if reasoning_budget is None else reasoning_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
        raise ToolCallError(f"reasoning_budget must be -1 (unlimited), 0 or a number of tokens, got {budget!r}")
    kwargs = dict(chat_template_kwargs or {})
    if budget == 0:
        kwargs.setdefault("enable_thinking", False)
    functions = check_tools(tools) if tools is not None else []
    choice, name = check_tool_choice(tool_choice, functions)
    tmpl = llm.chat_template_choice().for_request(functions or None)
    fmt = detect_format(tmpl.source)
    use_tools = bool(functions) and choice != "none"
    if use_tools and grammar is not None:
        raise ToolCallError("cannot use a grammar (grammar, json_schema, response_format) with tools; "
                            "give tool_choice 'none' or leave the grammar out")
    parallel = bool(parallel_tool_calls)
    system_text = None
    if use_tools:
        for f in functions:
            check_schema(f["name"], f["parameters"])
        if fmt == "generic":
            schema = generic_schema([f for f in functions if name is None or f["name"] == name],
                                    parallel=parallel, allow_response=choice == "auto")
            grammar = LlamaGrammar("json_schema", schema)
            system_text = generic_system_text(functions, schema)
        elif choice == "required":
            kind, source = call_grammar(fmt, functions, name=name, parallel=parallel,
                                        special_id=lambda s: _special_id(llm, s),
                                        thought=bool(kwargs.get("enable_thinking")))
            grammar = LlamaGrammar(kind, source)
    rendered = template_messages(messages, fmt, system_text)
    if fmt == "gemma4" and gemma4_calls.CURRENT_TEMPLATE not in tmpl.source:
        rendered = gemma4_calls.gemma4_tool_responses(rendered)  # the older templates read tool_responses
    return ChatPlan(rendered, ([{"type": "function", "function": f} for f in functions] or None)
                    if fmt != "generic" else None, kwargs, grammar, fmt, use_tools, rfmt, budget,
                    _preserved(llm, fmt))


def check_schema(name: str, schema: dict[str, Any]) -> None:
    """Compile a tool's ``parameters`` with llguidance (no vocabulary needed).

    Raises:
        ToolCallError: llguidance refuses the schema (its message, first line).
    """
    import llguidance

    from ..engine.grammar import grammar_text
    err = llguidance.LLMatcher.validate_grammar(grammar_text("json_schema", schema), None)
    if err and not err.startswith("WARNING"):
        raise ToolCallError(f"tool {name!r}: its parameters are not a JSON schema llguidance can compile: "
                            f"{err.strip().splitlines()[0]}")


class ThinkBudget:
    """A logits processor that closes a thinking block after ``budget`` thinking tokens.

    Args:
        llm: the model (its tokenizer); n_prompt: prompt tokens (the ids before are the prompt);
        budget: thinking tokens allowed (> 0); thinking_open: the answer starts inside the block.
        tags: the block's (open, close, forced text): ``<think>`` / ``</think>`` (forcing
            ``"\\n</think>\\n\\n"``), or Gemma 4's ``<|channel>thought`` / ``<channel|>`` (forcing
            ``<channel|>``, llama.cpp common/parsers/gemma4.cpp ``thinking_end_tags``), whose
            forced text is tokenized with special tokens parsed.
    """

    def __init__(self, llm: Any, n_prompt: int, budget: int, thinking_open: bool,
                 tags: tuple[str, str, str] | None = None):
        self.tk, self.n_prompt, self.budget, self.open = llm._tokenizer, n_prompt, budget, thinking_open
        self.open_tag, self.close_tag, text = tags or (THINK_OPEN, THINK_CLOSE, "\n" + THINK_CLOSE + "\n\n")
        forced = ExactTokenizer(llm._tokenizer).tokenize(text.encode(), special=tags is not None)
        same = getattr(llm, "_piece_ids", None)
        if same is None:  # every id of each piece: a grammar may know a piece by another id (byte tokens)
            same = llm._piece_ids = {}
            for i in range(llm.n_vocab()):
                same.setdefault(llm._tokenizer.token_to_piece(i, special=True), []).append(i)
        self.forced = [same.get(llm._tokenizer.token_to_piece(t, special=True), [t]) for t in forced]
        self.text, self.seen, self.n_thinking, self.pos = "", 0, 0, -1

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        gen = input_ids[self.n_prompt:]
        for t in gen[self.seen:]:
            self.text += self.tk.token_to_piece(int(t), special=True).decode("utf-8", "replace")
            if self.open or self.text.lstrip().startswith(self.open_tag):
                if self.close_tag not in self.text:
                    self.n_thinking += 1
        self.seen = len(gen)
        if self.pos < 0 and self.n_thinking >= self.budget and self.close_tag not in self.text and (
                self.open or self.text.lstrip().startswith(self.open_tag)):
            self.pos = len(gen)  # forcing starts here; the same call twice forces the same token
        k = len(gen) - self.pos
        if self.pos >= 0 and 0 <= k < len(self.forced):
            out = np.full_like(scores, -np.inf)
            out[self.forced[k]] = scores[self.forced[k]] - scores[self.forced[k]].max()
            return out
        return scores


def assemble_message(deltas: list[dict[str, Any]]) -> Any:
    """One chat ``message`` from its stream's deltas (content, reasoning_content, tool_calls joined).

    ``content`` is None when the answer is only tool calls (OpenAI's shape).
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        if d.get("content"):
            content.append(d["content"])
        if d.get("reasoning_content"):
            reasoning.append(d["reasoning_content"])
        for c in d.get("tool_calls") or []:
            slot = calls.setdefault(c["index"], {"id": None, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            if c.get("id"):
                slot["id"] = c["id"]
            fn = c.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        if not msg["content"]:
            msg["content"] = None
    return msg


def arguments_object(call: dict[str, Any]) -> dict[str, Any]:
    """A call's ``arguments`` parsed (``{}`` when they are not a JSON object).

    Raises:
        CooktopError: never; bad JSON gives ``{}`` (for APIs that need an object, e.g. Anthropic's ``input``).
    """
    try:
        v = json.loads(call["function"]["arguments"] or "{}")
    except (ValueError, CooktopError):
        return {}
    return v if isinstance(v, dict) else {}
