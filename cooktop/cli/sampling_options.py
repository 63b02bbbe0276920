"""Sampling and constraint options shared by ``run``, ``chat`` and ``serve`` (llama.cpp's names and defaults).

``--temp``, ``--top-k``, ``--top-p``, ``--min-p``, ``--typical``, ``--repeat-penalty``,
``--repeat-last-n``, ``--presence-penalty``, ``--frequency-penalty``, ``--ignore-eos``
(end-of-generation tokens get a -inf bias, as llama.cpp's ``--ignore-eos``),
``--grammar`` / ``--grammar-file`` (GBNF), ``-j/--json-schema`` / ``-jf/--json-schema-file``
(through llguidance, ``cooktop.engine.grammar``) and ``-r/--reverse-prompt`` (repeatable).
"""

from __future__ import annotations

import math
from typing import Any

import click
import numpy as np

from ..engine.grammar import Grammar, GrammarTokenizer
from ..engine.sampling import Sampler, SamplingParams, bias_pairs
from ..errors import CooktopError

#: (decls, dest, default, help) of the plain sampling options.
_SAMPLING = (
    (("--temp",), "temperature", 0.8, "Temperature (<= 0: greedy)."),
    (("--top-k",), "top_k", 40, "Top-k (<= 0: off)."),
    (("--top-p",), "top_p", 0.95, "Top-p (1: off)."),
    (("--min-p",), "min_p", 0.05, "Min-p (0: off)."),
    (("--typical",), "typical_p", 1.0, "Locally typical sampling p (1: off)."),
    (("--repeat-penalty",), "repeat_penalty", 1.0, "Repetition penalty (1: off)."),
    (("--repeat-last-n",), "repeat_last_n", 64, "Tokens the penalties look back over (0: off, -1: all)."),
    (("--presence-penalty",), "presence_penalty", 0.0, "Presence penalty (0: off)."),
    (("--frequency-penalty",), "frequency_penalty", 0.0, "Frequency penalty (0: off)."),
)
SAMPLING_DESTS = tuple(d for _f, d, _v, _h in _SAMPLING)


def generation_options(f):
    """The sampling, ``--ignore-eos``, grammar and reverse-prompt options (module doc)."""
    f = click.option("-r", "--reverse-prompt", "reverse_prompt", multiple=True,
                     help="Stop when this text is generated (repeatable; it is kept in the output).")(f)
    f = click.option("-jf", "--json-schema-file", "json_schema_file", type=click.Path(), default=None,
                     help="File of a JSON schema the output must follow.")(f)
    f = click.option("-j", "--json-schema", "json_schema", default=None,
                     help="JSON schema the output must follow, e.g. '{\"type\": \"object\"}'.")(f)
    f = click.option("--grammar-file", "grammar_file", type=click.Path(), default=None,
                     help="File of a GBNF grammar the output must follow.")(f)
    f = click.option("--grammar", "grammar", default=None, help="GBNF grammar the output must follow.")(f)
    f = click.option("--ignore-eos", is_flag=True, help="Never end at end-of-generation tokens.")(f)
    for decls, dest, default, text in reversed(_SAMPLING):
        f = click.option(*decls, dest, default=default, show_default=True, help=text,
                         type=type(default))(f)
    return f


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise CooktopError(f"cannot read the {what} file {path}: {e}") from None


def grammar_source(opts: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, text) of the one grammar option given (``gbnf`` or ``json_schema``), else None.

    Raises:
        CooktopError: more than one given, or a file that cannot be read.
    """
    given = [(k, v) for k, v in (("gbnf", opts.get("grammar")), ("gbnf-file", opts.get("grammar_file")),
                                 ("json_schema", opts.get("json_schema")),
                                 ("json_schema-file", opts.get("json_schema_file"))) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise CooktopError("give one of --grammar, --grammar-file, --json-schema, --json-schema-file")
    kind, value = given[0]
    if kind.endswith("-file"):
        kind = kind[:-len("-file")]
        value = _read(value, "grammar" if kind == "gbnf" else "JSON schema")
    return kind, value


def sampling_params(seed: int, opts: dict[str, Any], eog_ids: frozenset[int] = frozenset()) -> SamplingParams:
    """:class:`SamplingParams` from the options; ``--ignore-eos`` biases ``eog_ids`` to -inf."""
    bias = {t: -math.inf for t in eog_ids} if opts.get("ignore_eos") else {}
    return SamplingParams(seed=seed, logit_bias=bias_pairs(bias), **{d: opts[d] for d in SAMPLING_DESTS})


def run_sampler(tokenizer: Any, seed: int, opts: dict[str, Any]) -> Sampler:
    """The :class:`Sampler` of ``cooktop run``: the options plus the grammar, if one is given.

    Raises:
        CooktopError / GrammarError: a bad value or a grammar that does not compile.
    """
    src = grammar_source(opts)
    constraint = Grammar(GrammarTokenizer(tokenizer), *src) if src else None
    return Sampler(sampling_params(seed, opts, tokenizer.eog_ids), (), constraint)


def stop_criterion(tokenizer: Any, n_prompt: int, reverse: tuple[str, ...] | list[str]) -> list | None:
    """A ``stopping_criteria`` list ending generation once a reverse prompt appears in the
    generated text (llama-cli without ``-i``: the reverse prompt is printed, then it stops)."""
    rev = [r for r in reverse if r]
    if not rev:
        return None
    longest = max(len(r.encode()) for r in rev)

    def hit(input_ids: np.ndarray, _logits: np.ndarray) -> bool:
        gen = [int(t) for t in input_ids[n_prompt:]]
        tail = b"".join(tokenizer.token_to_piece(t) for t in gen[-(longest + 8):])
        text = tail.decode("utf-8", errors="ignore")
        return any(r in text for r in rev)

    return [hit]


def chat_generation(llm: Any, n_predict: int, opts: dict[str, Any]) -> dict[str, Any]:
    """``create_chat_completion`` keyword arguments for ``chat`` / ``run -cnv`` from the options
    (reverse prompts become stop strings, ending the answer).

    Raises:
        CooktopError / GrammarError: a bad grammar option.
    """
    from ..api.grammar import LlamaGrammar
    gen: dict[str, Any] = {d: opts[d] for d in SAMPLING_DESTS if d != "repeat_last_n"}
    gen["max_tokens"] = n_predict
    src = grammar_source(opts)
    if src is not None:
        kind, text = src
        gen["grammar"] = LlamaGrammar.from_string(text) if kind == "gbnf" else LlamaGrammar.from_json_schema(text)
    if opts.get("ignore_eos"):
        gen["logit_bias"] = {t: -math.inf for t in llm._tokenizer.eog_ids}
    if opts.get("reverse_prompt"):
        gen["stop"] = list(opts["reverse_prompt"])
    return gen
