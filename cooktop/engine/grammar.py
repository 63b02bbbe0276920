"""Constrained decoding with llguidance: GBNF/Lark grammars, JSON schemas and regexes as token masks.

llguidance (https://github.com/guidance-ai/llguidance, the library llama.cpp
itself links for ``--grammar`` with ``LLAMA_LLGUIDANCE``) compiles a grammar
against the model's vocabulary and, at each step, says which tokens keep the
output inside the grammar. cooktop gives it the vocabulary the way llama.cpp's
binding does (``common/llguidance.cpp``, and ``llguidance/llamacpp.py``): each
token's bytes, with control tokens marked by a leading ``0xff`` byte so that
their text never matches ordinary output, and a tokenize callback.

One :class:`GrammarTokenizer` per vocabulary (building it walks every token),
one :class:`Grammar` per request: :meth:`Grammar.allowed` gives the mask of the
next token (end-of-sequence allowed only where the grammar may end) and
:meth:`Grammar.accept` advances it. Grammar sources:

* ``gbnf``: llama.cpp's GBNF (``root ::= ...``), converted to Lark by
  llguidance's ``gbnf_to_lark`` (llama-cpp-python's ``LlamaGrammar.from_string``);
* ``lark``: llguidance's Lark dialect;
* ``json_schema``: a JSON schema (``response_format``; ``{"type": "object"}``
  for any JSON object), with llama.cpp's reading of objects that list ``properties``: no other
  keys unless ``additionalProperties`` allows them (:func:`closed_objects`);
* ``regex``.

Errors (a grammar that does not parse, a schema llguidance cannot compile) are
:class:`GrammarError` with llguidance's message.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import CooktopError
from ..text.exact import ExactTokenizer
from ..text.tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, Tokenizer

KINDS = ("gbnf", "lark", "json_schema", "regex")


class GrammarError(CooktopError, ValueError):
    """A grammar, JSON schema or regex that llguidance cannot compile, or llguidance missing."""


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401  (bitmask helpers)
    except ImportError as e:
        raise GrammarError(f"constrained decoding (grammar, response_format) needs llguidance: "
                           f"pip install 'cooktop[server]' or pip install llguidance ({e})") from None
    return llguidance


class GrammarTokenizer:
    """A vocabulary as llguidance sees it (``llguidance.LLTokenizer``).

    Args:
        tokenizer: the model's tokenizer.
    Attributes:
        lltok: the ``LLTokenizer``; n_vocab: tokens.
    Raises:
        GrammarError: llguidance is not installed or refuses the vocabulary.
    """

    def __init__(self, tokenizer: Tokenizer):
        llg = _llguidance()
        self.tokenizer = tokenizer
        n = tokenizer.n_vocab
        types = list(getattr(tokenizer, "_types", None) or tokenizer.vocab.token_types.tolist())
        pieces: list[bytes] = []
        for i in range(n):
            p = tokenizer.token_to_piece(i, special=True)
            if types[i] == TOKEN_TYPE_CONTROL or (types[i] == TOKEN_TYPE_USER_DEFINED and p.startswith(b"<")
                                                  and p.endswith(b">")):
                p = b"\xff" + p  # llguidance/llamacpp.py: special tokens never match text
            pieces.append(p)
        self._pieces = pieces
        self._exact = ExactTokenizer(tokenizer)

        exact = self._exact  # not self: no reference cycle through llguidance

        class _Wrapped:
            eos_token_id = tokenizer.eos_id
            bos_token_id = tokenizer.bos_id if tokenizer.bos_id >= 0 else None
            tokens = pieces
            special_token_ids = [i for i in range(n) if pieces[i].startswith(b"\xff")]

            def __call__(self, text: bytes) -> list[int]:
                return exact.tokenize(text)

        try:
            self.lltok = llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped()), n_vocab=n)
        except (ValueError, RuntimeError, TypeError) as e:
            raise GrammarError(f"llguidance refused the model's vocabulary: {e}") from None
        self.n_vocab = n

    def tokenize(self, text: bytes) -> list[int]:
        """Token ids whose bytes are exactly ``text`` (no BOS, no special tokens, no SentencePiece space)."""
        return self._exact.tokenize(text)


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedProperties", "additionalItems")


def closed_objects(schema: Any) -> Any:
    """``schema`` (a copy) with ``"additionalProperties": false`` on every object schema that lists
    ``properties`` and says nothing of others: llama.cpp's json-schema-to-grammar allows no other
    keys there (common/json-schema.cpp: additional properties only when ``additionalProperties``
    says so, or when there are no ``properties``), where JSON Schema (and llguidance) would allow any."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _SCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: closed_objects(sub) for name, sub in out[k].items()}
    for k in _SCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [closed_objects(sub) for sub in out[k]]
    for k in _SCHEMA_ONE:
        if isinstance(out.get(k), (dict, list)):
            out[k] = closed_objects(out[k])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(kind: str, source: Any) -> str:
    """An llguidance grammar definition from a source of ``kind`` (see :data:`KINDS`).

    Args:
        kind: ``gbnf``, ``lark``, ``json_schema`` or ``regex``.
        source: the grammar text; for ``json_schema`` a dict or its JSON text.
    Raises:
        GrammarError: an unknown kind or a source that does not convert.
    """
    llg = _llguidance()
    if kind not in KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(KINDS)}")
    try:
        if kind == "json_schema":
            schema = json.loads(source) if isinstance(source, (str, bytes)) else source
            if not isinstance(schema, dict):
                raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
            text = llg.LLMatcher.grammar_from_json_schema(closed_objects(schema),
                                                          defaults={"whitespace_flexible": False})
            # the schema itself is compiled lazily: check it now (llama.cpp refuses an unknown
            # "type" in json-schema-to-grammar too), without a vocabulary
            err = llg.LLMatcher.validate_grammar(text)
            if isinstance(err, tuple):  # newer llguidance: (is_error, messages)
                err = "; ".join(err[1]) if err[0] else ""
            if err:
                raise GrammarError(f"the JSON schema is not valid: {str(err).strip().splitlines()[0]}")
            return text
        if not isinstance(source, str) or not source.strip():
            raise GrammarError(f"the {kind} grammar is empty")
        return llg.grammar_from(kind, source)
    except GrammarError:
        raise
    except (ValueError, TypeError, RuntimeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GrammarError(f"the {kind} grammar does not compile: {msg}") from None


class Grammar:
    """One request's grammar state (a :class:`~cooktop.engine.sampling.Constraint`).

    Args:
        gtok: the vocabulary (:class:`GrammarTokenizer`).
        kind, source: as for :func:`grammar_text`.
    Raises:
        GrammarError: the grammar does not compile against the vocabulary.
    """

    def __init__(self, gtok: GrammarTokenizer, kind: str, source: Any):
        llg = _llguidance()
        self._np = llg.numpy
        self.gtok = gtok
        self.kind = kind
        text = grammar_text(kind, source)
        err = llg.LLMatcher.validate_grammar(text, gtok.lltok)
        if err and not err.startswith("WARNING"):
            raise GrammarError(f"the {kind} grammar does not compile: {err.strip().splitlines()[0]}")
        self.matcher = llg.LLMatcher(gtok.lltok, text, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the {kind} grammar does not compile: "
                               f"{self.matcher.get_error().strip().splitlines()[0]}")
        self._mask = self._np.allocate_token_bitmask(1, gtok.n_vocab)
        self._bits = np.arange(32, dtype=np.uint32)

    def allowed(self, n_vocab: int) -> np.ndarray:
        """bool [n_vocab]: the tokens that keep the output in the grammar (EOS where it may end).

        Raises:
            GrammarError: the matcher is in an error state (it accepted a token it should not have).
        """
        if self.matcher.is_error():
            raise GrammarError(f"the grammar matcher failed: {self.matcher.get_error().splitlines()[0]}")
        self._np.fill_next_token_bitmask(self.matcher, self._mask)
        words = self._mask[0].view(np.uint32)
        bits = ((words[:, None] >> self._bits[None, :]) & 1).astype(bool).reshape(-1)
        out = np.zeros(n_vocab, dtype=bool)
        m = min(n_vocab, len(bits))
        out[:m] = bits[:m]
        return out

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one that :meth:`allowed` allowed)."""
        self.matcher.consume_token(int(token))

    @property
    def done(self) -> bool:
        """Whether the grammar has ended (only end-of-sequence can follow)."""
        return self.matcher.is_stopped()
