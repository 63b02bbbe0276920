"""``Llama.create_completion`` / ``Llama.__call__``: text completion, llama-cpp-python's semantics.

Prompts: a ``str`` is tokenized with BOS (when the vocabulary adds it) and
special tokens parsed, as llama-cpp-python does; a list of ids is used as is.
With ``suffix`` and a model that has fill-in-the-middle tokens, the prompt is
``[BOS] <PRE> prompt <SUF> suffix <MID>`` (``spm_infill``: suffix first), as
llama-cpp-python builds it; without FIM tokens the suffix is appended to the
output text. Options: llama.cpp sampling (temperature, top_k, top_p, min_p,
typical_p, repeat/presence/frequency penalties), ``logit_bias``, ``seed``,
``stop``, ``logprobs`` (OpenAI legacy shape), ``grammar``,
``logits_processor`` and ``stopping_criteria`` (llama-cpp-python callables).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ..engine.generate import Generation, Step
from ..engine.sampling import Sampler, SamplingParams, bias_pairs
from ..engine.sequence import Sequence as Sequence_
from ..errors import CooktopError
from ..text.base import InvalidTokenError
from ..text.exact import ExactTokenizer
from .base import LlamaBase
from .grammar import LlamaGrammar, constraint_for
from .logprobs import log_softmax, top_k
from .types import Completion, CompletionLogprobs, CompletionUsage

#: Most top-logprob alternatives per token (OpenAI allows 20 for chat; llama-server 'n_probs' has no cap).
MAX_TOP_LOGPROBS = 20


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """``stop`` as a list of strings.

    Raises:
        CooktopError: not a string or a list of strings.
    """
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise CooktopError(f"stop must be a string or a list of strings, got {stop!r}")


def n_predict_of(max_tokens: int | None) -> int:
    """``max_tokens`` -> n_predict: None or <= 0 means until the context is full (-1).

    Raises:
        CooktopError: not an integer.
    """
    if max_tokens is None:
        return -1
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise CooktopError(f"max_tokens must be an integer, got {max_tokens!r}")
    return -1 if max_tokens <= 0 else max_tokens


class CompletionMixin(LlamaBase):
    """Text completion for :class:`cooktop.api.llama.Llama`."""

    def _exact(self) -> ExactTokenizer:
        ex = getattr(self, "_exact_tok", None)
        if ex is None:
            ex = self._exact_tok = ExactTokenizer(self._tokenizer)
        return ex

    def _prompt_tokens(self, prompt: str | list[int], suffix: str | None) -> tuple[list[int], bool]:
        """(prompt ids, whether fill-in-the-middle was used).

        Raises:
            CooktopError: a prompt that is neither text nor a list of token ids.
        """
        pre, suf, mid = self.token_prefix(), self.token_suffix(), self.token_middle()
        fim = suffix is not None and pre >= 0 and suf >= 0 and mid >= 0
        if isinstance(prompt, (bytes, bytearray)):
            prompt = bytes(prompt).decode("utf-8", errors="replace")
        if isinstance(prompt, str):
            if not fim:
                return self.tokenize(prompt, add_bos=True, special=True), False
            bos = [self.token_bos()] if self._tokenizer.vocab.add_bos and self.token_bos() >= 0 else []
            p_ids = [pre] + self.tokenize(prompt, add_bos=False, special=False)
            s_ids = [suf] + (self._exact().tokenize(suffix) if suffix else [])
            body = (s_ids + p_ids) if self.spm_infill else (p_ids + s_ids)
            return bos + body + [mid], True
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                     for t in prompt):
            return [int(t) for t in prompt], False
        raise CooktopError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _sampler(self, *, temperature: float, top_k: int, top_p: float, min_p: float, typical_p: float,
                 repeat_penalty: float, presence_penalty: float, frequency_penalty: float,
                 logit_bias: dict | None, seed: int | None, logits_processor: Any,
                 grammar: Any) -> Sampler:
        """A :class:`Sampler` for one completion (a fresh grammar state each time).

        Raises:
            InvalidTokenError: a ``logit_bias`` token id outside ``[0, n_vocab)`` (llama-cpp-python
                fails on one too, with numpy's IndexError; the server drops them as llama-server does).
        """
        seed = self.seed if seed is None else seed
        pairs = bias_pairs(logit_bias)
        outside = [t for t, _ in pairs if not 0 <= t < self.n_vocab()]
        if outside:
            raise InvalidTokenError(f"logit_bias: token id {outside[0]} is not in the vocabulary "
                                    f"(0..{self.n_vocab() - 1})")
        params = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                                min_p=float(min_p), typical_p=float(typical_p),
                                repeat_penalty=float(repeat_penalty), repeat_last_n=self.last_n_tokens_size,
                                presence_penalty=float(presence_penalty),
                                frequency_penalty=float(frequency_penalty), logit_bias=pairs,
                                seed=-1 if seed in (None, -1, 0xFFFFFFFF) else int(seed))
        procs = list(logits_processor) if logits_processor is not None else []
        if any(not callable(p) for p in procs):
            raise CooktopError("logits_processor must be a list of callables (input_ids, scores) -> scores")
        return Sampler(params, procs, constraint_for(self, grammar))

    def _token_text(self, tid: int) -> str:
        return self._tokenizer.token_to_piece(tid).decode("utf-8", errors="replace")

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: Any = None, logits_processor: Any = None,
                          grammar: LlamaGrammar | str | None = None, logit_bias: dict | None = None,
                          n_predict: int | None = None,
                          ) -> Completion | Iterator[Completion]:
        """Complete ``prompt`` (text, or token ids).

        Args:
            suffix: fill-in-the-middle suffix (see the module docstring).
            max_tokens: tokens to generate; None or <= 0: until the context is full.
            temperature <= 0: greedy. top_k, top_p, min_p, typical_p, repeat_penalty,
                presence_penalty, frequency_penalty: llama.cpp sampling.
            logprobs: how many alternatives per token to report (0: only the chosen
                token's logprob), OpenAI's legacy ``logprobs`` object; None: none.
            echo: prepend the prompt text.
            stop: string(s) ending generation (not included).
            stream: yield ``text_completion`` chunks (``finish_reason`` and ``usage`` on the last).
            seed: overrides the instance seed for this call.
            tfs_z, mirostat_*: accepted; mirostat_mode != 0 is refused (not implemented).
            model: the name reported in the response (default: the model path).
            stopping_criteria: callables ``(input_ids, logits) -> bool``.
            logits_processor: callables ``(input_ids, scores) -> scores``.
            grammar: a :class:`LlamaGrammar` or GBNF text (constrained decoding with llguidance).
            logit_bias: ``{token_id: bias}``.
            n_predict: llama.cpp's count instead of ``max_tokens`` (llama-server's field): -1 until
                the context is full, 0 nothing (the prompt is still evaluated: with ``echo`` and
                ``logprobs`` that scores it), N at most N.
        Returns:
            a ``text_completion`` dict, or an iterator of chunks when ``stream``. With ``echo``
            and ``logprobs`` the prompt's tokens come first in ``logprobs`` (the first one's
            logprob and alternatives ``None``), as llama-cpp-python gives them.
        Raises:
            ContextOverflowError: the prompt does not fit in ``n_ctx``.
            GrammarError: the grammar does not compile. CooktopError: a bad option.
        """
        run = self.start_completion(
            prompt, suffix, max_tokens, temperature=temperature, top_p=top_p, min_p=min_p, typical_p=typical_p,
            logprobs=logprobs, echo=echo, stop=stop, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, seed=seed,
            mirostat_mode=mirostat_mode, model=model, stopping_criteria=stopping_criteria,
            logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias, n_predict=n_predict)
        return run.chunks() if stream else run.whole()

    def start_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                         temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                         typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                         stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                         presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                         seed: int | None = None, mirostat_mode: int = 0, model: str | None = None,
                         stopping_criteria: Any = None, logits_processor: Any = None,
                         grammar: LlamaGrammar | str | None = None, logit_bias: dict | None = None,
                         n_predict: int | None = None) -> CompletionRun:
        """The generation :meth:`create_completion` would run, started and not yet read: its
        steps (token ids, stop word) and prompt, for callers that need more than the OpenAI
        chunks (the server's native ``/completion``). Arguments, errors: as ``create_completion``.
        """
        eng = self._engine
        if mirostat_mode:
            raise CooktopError("mirostat sampling is not implemented in cooktop; use mirostat_mode=0")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise CooktopError(f"logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {logprobs!r}")
        tokens, fim = self._prompt_tokens(prompt, suffix)
        if n_predict is None:
            n_predict = n_predict_of(max_tokens)
        elif isinstance(n_predict, bool) or not isinstance(n_predict, int) or n_predict < -1:
            raise CooktopError(f"n_predict must be an integer >= -1, got {n_predict!r}")
        sampler = self._sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                typical_p=typical_p, repeat_penalty=repeat_penalty,
                                presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                logit_bias=logit_bias, seed=seed, logits_processor=logits_processor,
                                grammar=grammar)
        criteria = list(stopping_criteria) if stopping_criteria is not None else []
        eng.check_prompt(tokens)
        seq = self._active_seq
        if seq is not None and not isinstance(seq, Sequence_):  # the server's slot chooser
            seq = seq(list(tokens))
        seq = seq if seq is not None else eng.seq
        prompt_lp = None
        if echo and logprobs is not None:
            seq.reset()
            t0 = time.perf_counter()
            prompt_lp = self._prompt_logprobs(seq, tokens, logprobs)
            score_ms = (time.perf_counter() - t0) * 1e3
        steps = eng.generate(tokens, n_predict, sampler, stop_list(stop), stopping_criteria=criteria, seq=seq,
                             draft=self._speculation(), n_keep=self._n_keep)
        if prompt_lp is not None:  # the scoring read the prompt: nothing of it was cached
            steps.count_prompt_scoring(len(tokens), score_ms)
        prefix = ""
        if echo:
            prefix = prompt if isinstance(prompt, str) else self.detokenize(tokens).decode("utf-8", "replace")
        tail = suffix if (suffix is not None and not fim) else ""
        return CompletionRun(self, steps, len(tokens), model or self.model_path, prefix, tail, logprobs, prompt_lp,
                             seq, tokens)

    def _prompt_logprobs(self, seq: Sequence_, tokens: list[int], k: int) -> CompletionLogprobs:
        """The prompt's own logprobs (``echo`` with ``logprobs``): token i under the logits after
        tokens 0..i-1; the first token has none. Leaves ``tokens`` in ``seq``'s context."""
        logits = seq.eval(tokens, logits_all=True)
        pieces = [self._token_text(t) for t in tokens]
        out: CompletionLogprobs = {"tokens": pieces, "text_offset": [], "token_logprobs": [None],
                                   "top_logprobs": [None]}
        offset = 0
        for p in pieces:
            out["text_offset"].append(offset)
            offset += len(p)
        for i in range(1, len(tokens)):
            lps = log_softmax(logits[i - 1])
            out["token_logprobs"].append(float(lps[tokens[i]]))
            out["top_logprobs"].append({self._token_text(j): lp for j, lp in top_k(lps, k)} if k else None)
        return out

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Completion | Iterator[Completion]:
        """Same as :meth:`create_completion`."""
        return self.create_completion(prompt, *args, **kwargs)


class CompletionRun:
    """One started completion: turns the steps of its generation into ``text_completion`` chunks
    (:meth:`chunks`) or one response (:meth:`whole`).

    Attributes:
        steps: the :class:`~cooktop.engine.generate.Generation` (read once, by one of the two
            methods or by the caller); n_prompt: prompt tokens; seq: the
            :class:`~cooktop.engine.sequence.Sequence` it runs on; prompt_tokens: int [n_prompt].
    """

    def __init__(self, llm: Any, steps: Generation, n_prompt: int, model: str, prefix: str, tail: str,
                 logprobs: int | None, prompt_lp: CompletionLogprobs | None = None, seq: Any = None,
                 prompt_tokens: list[int] | None = None):
        self.llm, self.steps, self.n_prompt, self.model = llm, steps, n_prompt, model
        self.seq, self.prompt_tokens = seq, list(prompt_tokens or [])
        self.prefix, self.tail, self.logprobs, self.prompt_lp = prefix, tail, logprobs, prompt_lp
        self.id = f"cmpl-{uuid.uuid4()}"
        self.created = int(time.time())
        self.n_generated = 0
        self.offset = len(prefix)

    def usage(self) -> CompletionUsage:
        """Token counts; ``prompt_tokens_details.cached_tokens``: prompt tokens reused from the cache (OpenAI's)."""
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.n_generated,
                "total_tokens": self.n_prompt + self.n_generated,
                "prompt_tokens_details": {"cached_tokens": self.steps.n_cached}}

    def _chunk(self, text: str, finish: str | None, lp: CompletionLogprobs | None) -> Completion:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    def _logprobs(self, step: Step) -> CompletionLogprobs | None:
        if self.logprobs is None or step.token is None or step.logits is None:  # None only on the last step
            return None
        lps = log_softmax(step.logits)
        piece = self.llm._token_text(step.token)
        entry: CompletionLogprobs = {
            "tokens": [piece], "text_offset": [self.offset], "token_logprobs": [float(lps[step.token])],
            "top_logprobs": [{self.llm._token_text(i): lp for i, lp in top_k(lps, self.logprobs)}
                             if self.logprobs else None]}
        self.offset += len(piece)
        return entry

    def chunks(self) -> Iterator[Completion]:
        """The streamed chunks; the last one has ``finish_reason`` and ``usage``."""
        try:
            if self.prefix or self.prompt_lp is not None:
                yield self._chunk(self.prefix, None, self.prompt_lp)
            for step in self.steps:
                if step.token is not None:
                    self.n_generated += 1
                lp = self._logprobs(step)
                if step.finish_reason is not None:
                    text = step.text + self.tail
                    if text:
                        yield self._chunk(text, None, lp)
                    last = self._chunk("", step.finish_reason, None)
                    last["usage"] = self.usage()
                    yield last
                elif step.text or lp is not None:
                    yield self._chunk(step.text, None, lp)
        finally:
            self.steps.close()
            if self.steps.result is not None:
                self.llm._last = self.steps.result

    def whole(self) -> Completion:
        """The non-streamed response."""
        texts: list[str] = [self.prefix]
        lp_all: CompletionLogprobs | None = None
        if self.logprobs is not None:
            lp_all = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
            if self.prompt_lp is not None:
                lp_all = copy.deepcopy(self.prompt_lp)
        finish = "length"
        for step in self.steps:
            if step.token is not None:
                self.n_generated += 1
            texts.append(step.text)
            lp = self._logprobs(step)
            if lp is not None and lp_all is not None:
                for k in lp_all:
                    lp_all[k] += lp[k]  # type: ignore[literal-required]
            if step.finish_reason is not None:
                finish = step.finish_reason
        self.llm._last = self.steps.result
        texts.append(self.tail)
        out = self._chunk("".join(texts), finish, lp_all)
        out["usage"] = self.usage()
        return out
