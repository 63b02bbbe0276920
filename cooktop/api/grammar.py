"""``LlamaGrammar`` and ``response_format``: what the API accepts for constrained decoding.

llama-cpp-python's ``LlamaGrammar.from_string(gbnf)`` / ``from_json_schema`` /
``from_file`` and OpenAI's ``response_format`` (``{"type": "json_object"}``,
optionally with ``"schema"`` as llama-cpp-python takes it, or
``{"type": "json_schema", "json_schema": {"schema": ...}}``) all become an
llguidance grammar (:mod:`cooktop.engine.grammar`), compiled against the
model's vocabulary once per request.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..engine.grammar import KINDS, Grammar, GrammarError, GrammarTokenizer, grammar_text


class LlamaGrammar:
    """A grammar to constrain generation (llama-cpp-python's class of the same name).

    Args:
        kind: ``gbnf``, ``lark``, ``json_schema`` or ``regex``.
        source: the grammar text (a JSON schema: dict or JSON text).
    Raises:
        GrammarError: the source does not compile (checked at once, without a vocabulary).
    """

    def __init__(self, kind: str, source: Any):
        grammar_text(kind, source)
        self.kind, self.source = kind, source

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """A GBNF grammar (llama.cpp ``grammars/README.md``); Lark text is accepted too."""
        return cls("gbnf", grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike, verbose: bool = True) -> LlamaGrammar:
        """A GBNF grammar read from a file.

        Raises:
            GrammarError: the file cannot be read.
        """
        try:
            with open(file, encoding="utf-8") as f:
                return cls.from_string(f.read())
        except OSError as e:
            raise GrammarError(f"cannot read grammar file {file}: {e}") from None

    @classmethod
    def from_json_schema(cls, json_schema: str | dict, verbose: bool = True) -> LlamaGrammar:
        """Output that matches a JSON schema (JSON text or a dict)."""
        return cls("json_schema", json_schema)

    def __repr__(self) -> str:
        return f"LlamaGrammar(kind={self.kind!r})"


def from_response_format(response_format: Any) -> LlamaGrammar | None:
    """The grammar an OpenAI ``response_format`` asks for (None for ``{"type": "text"}``).

    Raises:
        GrammarError: a malformed ``response_format`` or a schema llguidance cannot compile.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise GrammarError(f"response_format must be an object with a 'type', got {response_format!r}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return LlamaGrammar("json_schema", response_format.get("schema") or {"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None and isinstance(response_format.get("schema"), dict):
            schema = response_format["schema"]
        if not isinstance(schema, dict):
            raise GrammarError("response_format {'type': 'json_schema'} needs json_schema.schema (an object)")
        return LlamaGrammar("json_schema", schema)
    raise GrammarError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")


def as_grammar(grammar: Any) -> LlamaGrammar | None:
    """A :class:`LlamaGrammar` from what ``grammar=`` may be: one already, GBNF text, or None.

    Raises:
        GrammarError: anything else, or text that does not compile.
    """
    if grammar is None or isinstance(grammar, LlamaGrammar):
        return grammar
    if isinstance(grammar, str):
        return LlamaGrammar.from_string(grammar)
    if isinstance(grammar, dict) and grammar.get("kind") in KINDS:
        return LlamaGrammar(grammar["kind"], grammar.get("source"))
    raise GrammarError(f"grammar must be a LlamaGrammar or GBNF text, got {type(grammar).__name__}")


def constraint_for(llm: Any, grammar: Any) -> Grammar | None:
    """A fresh grammar state for one completion on ``llm`` (its vocabulary is wrapped once).

    Raises:
        GrammarError: see :func:`as_grammar`; the grammar does not compile for this vocabulary.
    """
    g = as_grammar(grammar)
    if g is None:
        return None
    gtok = getattr(llm, "_grammar_tok", None)
    if gtok is None:
        gtok = llm._grammar_tok = GrammarTokenizer(llm._tokenizer)
    return Grammar(gtok, g.kind, g.source)


def schema_text(schema: Any) -> str:
    """A schema as compact JSON text (for messages)."""
    return json.dumps(schema, separators=(",", ":"))[:200]
