"""The generation loop: load a model, evaluate prompts in n_batch chunks, decode, stream.

:func:`load` opens the GGUF, resolves the devices, plans the placement and
uploads the weights. :class:`Engine` holds the loaded model and one default
:class:`~cooktop.engine.sequence.Sequence`; :meth:`Engine.new_sequence` makes
more (a KV cache each), and generations on different sequences interleave.

:meth:`Engine.generate` returns a :class:`Generation`: an iterator of
:class:`Step` values (token id, text piece; the last step has the finish
reason) whose :class:`GenerationResult` is the generator's return value,
kept on :attr:`Generation.result`. It evaluates the prompt in chunks of
``n_batch`` (reusing the longest common prefix with what the sequence holds,
as llama-cpp-python does), then decodes one token at a time. Generation stops
at an end-of-generation token (``stop``), after ``n_predict`` tokens or at the
end of the context (``length``), or at a stop string (``stop``); it never
raises mid-generation for a full context. Text goes through an incremental
UTF-8 decoder, so a character split across tokens is held back until complete.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np

from ..backends.base import Device
from ..errors import ContextOverflowError, CooktopError, RecurrentStateError
from ..format.gguf import GGUFFile
from ..model.config import ModelConfig
from ..model.placed import PlacedModel
from ..runtime.loader import LoadedModel, load_model
from ..runtime.placement import Placement
from ..text.tokenizer import Tokenizer
from .sampling import Sampler, SamplingParams
from .sequence import Sequence
from .speculative import Speculation

log = logging.getLogger("cooktop")


@dataclasses.dataclass
class Timings:
    """llama.cpp-style timings (milliseconds; token counts)."""

    load_ms: float = 0.0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    eval_n: int = 0
    eval_ms: float = 0.0
    sample_ms: float = 0.0
    ttft_ms: float = 0.0
    #: speculative decoding (llama.cpp's ``n_drafted`` / ``n_accept``); None: it was off
    n_drafted: int | None = None
    n_accepted: int = 0
    n_decoded: int = 0  # tokens generated

    def lines(self) -> list[str]:
        """Printable lines in the shape of llama.cpp's ``llama_perf_context_print``."""
        def rate(n: int, ms: float) -> str:
            per = ms / n if n else 0.0
            tps = 1000.0 * n / ms if ms > 0 else 0.0
            return f"({per:8.2f} ms per token, {tps:8.2f} tokens per second)"
        total = self.prompt_ms + self.eval_ms + self.sample_ms
        return [
            f"cooktop:        load time = {self.load_ms:10.2f} ms",
            f"cooktop: prompt eval time = {self.prompt_ms:10.2f} ms / {self.prompt_n:5d} tokens "
            + rate(self.prompt_n, self.prompt_ms),
            f"cooktop:        eval time = {self.eval_ms:10.2f} ms / {self.eval_n:5d} runs   "
            + rate(self.eval_n, self.eval_ms),
            f"cooktop:      sample time = {self.sample_ms:10.2f} ms",
            f"cooktop: time to first token = {self.ttft_ms:7.2f} ms",
            f"cooktop:       total time = {total:10.2f} ms / {self.prompt_n + self.eval_n:5d} tokens",
        ] + self.draft_lines()

    def draft_lines(self) -> list[str]:
        """llama-speculative-simple's summary (``n_drafted``, ``n_accept``, ``accept``); [] without drafts."""
        if self.n_drafted is None:
            return []
        rate = 100.0 * self.n_accepted / self.n_drafted if self.n_drafted else 0.0
        tps = 1000.0 * self.n_decoded / self.eval_ms if self.eval_ms > 0 else 0.0
        return [f"cooktop: decoded {self.n_decoded:4d} tokens in {self.eval_ms / 1e3:8.3f} seconds, "
                f"speed: {tps:8.3f} t/s",
                f"cooktop: n_drafted = {self.n_drafted}",
                f"cooktop: n_accept  = {self.n_accepted}",
                f"cooktop: accept    = {rate:.3f}%"]


@dataclasses.dataclass
class GenerationResult:
    """What one generation produced: ids, text, why it stopped, timings."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" or "length"
    timings: Timings
    seed: int = -1  # the seed the sampler used (drawn when -1 was asked)
    prompt: list[int] = dataclasses.field(default_factory=list)  # the prompt's ids (llama-server's __verbose)


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a generation.

    Attributes:
        token: the sampled id, or None on the last step (which only ends the generation).
        text: the text this step releases; may be "" while a UTF-8 character or a
            possible stop string is incomplete. The steps' texts joined are the result's text.
        finish_reason: None, except on the last step: "stop" or "length".
        stop_word: on the last step, the ``stop`` string that ended the generation (None otherwise;
            llama-server's ``stopping_word``).
        logits: float32 [n_vocab], the raw logits ``token`` was sampled from (for
            ``logprobs``); None on the last step. Read-only: do not modify.
        candidates: the distribution ``token`` was drawn from after the sampler chain
            (:attr:`~cooktop.engine.sampling.Sampler.last_candidates`: ids int64 [m], probabilities
            float64 [m], best first; llama-server's ``post_sampling_probs``); None on the last step.
    """

    token: int | None
    text: str
    finish_reason: str | None = None
    logits: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)
    stop_word: str | None = None
    candidates: tuple[np.ndarray, np.ndarray] | None = dataclasses.field(default=None, repr=False, compare=False)


#: A stopping criterion (llama-cpp-python's): ``(input_ids int [n], logits float32 [n_vocab]) -> bool``;
#: True ends the generation (finish "stop") after the token just sampled.
StoppingCriterion = Callable[[np.ndarray, np.ndarray], bool]


class Generation(Iterator[Step]):
    """The steps of one generation, as an iterator; the outcome is a value on it.

    Iterate to run it (each ``next`` samples one token and evaluates it on the
    sequence). When exhausted, :attr:`result` holds the :class:`GenerationResult`
    (also the ``StopIteration.value``, so ``yield from`` gets it).

    Attributes:
        sequence: the sequence it runs on.
        result: None until the last step has been taken.
    """

    def __init__(self, steps: Generator[Step, None, GenerationResult], sequence: Sequence, n_cached: int = 0):
        self._steps = steps
        self.sequence = sequence
        self.result: GenerationResult | None = None
        #: prompt tokens whose K/V the sequence already held (reused, not evaluated again)
        self.n_cached = n_cached
        self._scored: tuple[int, float] | None = None

    def count_prompt_scoring(self, n: int, ms: float) -> None:
        """Count an evaluation of the whole ``n``-token prompt (``ms`` milliseconds) made on an
        emptied sequence just before this generation, as ``echo`` with ``logprobs`` does to score
        it: the prompt is then reported as read, not cached (:attr:`n_cached` 0; the result's
        ``timings.prompt_n`` ``n``, ``prompt_ms`` and ``ttft_ms`` plus ``ms``), as llama-server
        evaluates it once. Call it before the first step."""
        self.n_cached = 0
        self._scored = (n, ms)

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Step:
        try:
            return next(self._steps)
        except StopIteration as end:
            if end.value is not None:
                self.result = end.value
                if self._scored is not None:
                    t = self.result.timings
                    t.prompt_n, t.prompt_ms = self._scored[0], t.prompt_ms + self._scored[1]
                    if t.ttft_ms:
                        t.ttft_ms += self._scored[1]
                    self._scored = None
            raise

    def drain(self) -> GenerationResult:
        """Run the remaining steps and return :attr:`result`.

        Raises:
            CooktopError: the generation was closed before its end.
        """
        for _ in self:
            pass
        if self.result is None:
            raise CooktopError("this generation was closed before it finished: it has no result")
        return self.result

    def close(self) -> None:
        """Stop early (no result); the sequence keeps what was evaluated so far."""
        self._steps.close()


class Engine:
    """A loaded model plus tokenizer, with a default sequence.

    Attributes:
        gf, cfg, tokenizer, model, placement, devices.
        seq: the default :class:`Sequence` (what :meth:`eval`, :meth:`reset`,
            :attr:`tokens` and :meth:`generate` without ``seq`` use).
        n_ctx, n_batch: context length and prompt chunk size (tokens).
    Args:
        keep_scores: the default sequence records every logits row (``Llama.scores``).
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, tokenizer: Tokenizer, model: PlacedModel,
                 placement: Placement, devices: dict[str, Device], load_ms: float, keep_scores: bool = False):
        self.gf, self.cfg, self.tokenizer, self.model = gf, cfg, tokenizer, model
        self.placement = placement
        self.devices = devices
        self.n_ctx, self.n_batch = model.n_ctx, model.n_batch
        self.load_ms = load_ms
        self.seq = Sequence(model, keep_scores)

    def new_sequence(self, keep_scores: bool = False) -> Sequence:
        """Another sequence on this model: a KV cache of its own (``n_layer x n_ctx x`` the bytes of a
        K and a V row of ``n_head_kv x head_dim`` values in the model's cache types (f16 by default:
        2 bytes a value) on the devices, not counted by the load-time budget).
        Owned by the caller; freed by its ``close()`` or when dropped.

        Raises:
            CooktopError: the engine is closed. DeviceOutOfMemoryError: the cache does not fit.
        """
        return Sequence(self.model, keep_scores)

    def new_sequences(self, n: int) -> list[Sequence]:
        """``n`` sequences sharing one KV cache of ``n`` sequences (llama.cpp's unified cache):
        what :class:`~cooktop.engine.batch.BatchDriver` batches. The cache goes when the
        last of them is dropped (``close()`` of one forgets its context only).

        Raises:
            CooktopError: the engine is closed, ``n`` < 1. DeviceOutOfMemoryError: the cache does not fit.
        """
        cache = self.model.new_cache(n)
        return [Sequence(self.model, cache=cache, seq_id=i) for i in range(n)]

    # -- evaluation on the default sequence ---------------------------------
    @property
    def tokens(self) -> list[int]:
        """The default sequence's context (token ids whose K/V are cached)."""
        return self.seq.tokens

    def reset(self) -> None:
        """Forget the default sequence's context."""
        self.seq.reset()

    def eval(self, tokens: list[int], logits_all: bool = False) -> np.ndarray:
        """:meth:`Sequence.eval` on the default sequence."""
        return self.seq.eval(tokens, logits_all)

    # -- generation ---------------------------------------------------------
    def check_prompt(self, prompt_tokens: list[int]) -> None:
        """Raise before any work when a prompt cannot be generated from.

        Raises:
            CooktopError: the prompt is empty.
            ContextOverflowError: it has more than ``n_ctx`` tokens.
        """
        if not prompt_tokens:
            raise CooktopError("the prompt is empty: give at least one token (or let BOS be added)")
        if len(prompt_tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_tokens)} tokens but the context holds n_ctx = {self.n_ctx}; "
                f"raise -c / n_ctx (the model was trained with {self.cfg.n_ctx_train}) or shorten the prompt",
                len(prompt_tokens), self.n_ctx)

    def generate(self, prompt_tokens: list[int], n_predict: int, params: SamplingParams | Sampler,
                 stop: list[str] | None = None, seq: Sequence | Callable[[list[int]], Sequence] | None = None,
                 stopping_criteria: list[StoppingCriterion] | None = None,
                 preserved: frozenset[int] = frozenset(), n_keep: int | None = None,
                 draft: Speculation | None = None) -> Generation:
        """The continuation of ``prompt_tokens`` on ``seq``, as a :class:`Generation` of steps.

        Nothing runs until the first ``next``. The sequence's context becomes the
        prompt (its cached common prefix is reused) plus every generated token but
        the last. Two generations on different sequences may be advanced in any
        order; a generation whose sequence was evaluated or truncated by someone
        else meanwhile raises ``CooktopError`` ("interrupted") at its next step.

        Args:
            prompt_tokens: ids (BOS included if wanted); 1..n_ctx tokens.
            n_predict: max tokens to generate; < 0 means until the context is full.
            params: sampling settings, or a :class:`Sampler` (with logits processors or a
                grammar; one per generation, it keeps state).
            stop: strings that end generation (not included in the output).
            seq: the sequence to run on (default: :attr:`seq`), or a function
                ``seq(prompt_tokens) -> Sequence`` choosing one (the server's slots).
            stopping_criteria: callables ``(input_ids, logits) -> bool`` checked after each
                token (llama-cpp-python's ``stopping_criteria``); True ends with "stop".
            preserved: control tokens whose text the output keeps (a chat format's markers such as
                ``<|python_tag|>``, llama.cpp's ``preserved_tokens``); others print nothing.
            n_keep: None: a full context ends the generation (finish "length"). Else llama.cpp's
                context shift (``--context-shift --keep N``, tools/completion): keep the first
                ``n_keep`` tokens (-1: the whole prompt), drop the older half of the rest and go
                on; cooktop evaluates what is left again instead of rotating the cached keys.
            draft: speculative decoding (:mod:`cooktop.engine.speculative`): each step evaluates the
                sampled token and a draft in one forward and keeps the draft tokens the target's
                sampler agrees with; the output is that of decoding without it. The drafted and
                accepted counts land in the result's timings.
        Raises:
            CooktopError: an empty prompt; ContextOverflowError: the prompt alone does not
            fit in ``n_ctx``; RecurrentStateError: ``n_keep`` on a model with recurrent layers, whose
            state cannot be cut back (all now, before anything runs).

        With recurrent layers and ``draft``, each verification keeps a checkpoint of the state before
        it, and a rejected draft rolls the state back to it and evaluates the accepted tokens again
        (``Sequence.rollback``).
        """
        self.check_prompt(prompt_tokens)
        if any(getattr(self.cfg, "recurrent_layers", ())) and n_keep is not None:
            raise RecurrentStateError(f"a context shift (--context-shift) is not supported on {self.cfg.arch}, a "
                                      "model with recurrent layers: their state cannot be cut back to an earlier "
                                      "position (llama.cpp refuses the context shift for these models too)")
        if seq is None:
            seq = self.seq
        elif not isinstance(seq, Sequence):  # a chooser (the server's slots: prompt-prefix reuse)
            seq = seq(list(prompt_tokens))
        stops = [s for s in (stop or []) if s]
        sampler = params if isinstance(params, Sampler) else Sampler(params)
        steps = self._steps(seq, list(prompt_tokens), n_predict, sampler, stops, list(stopping_criteria or []),
                            preserved, n_keep, draft)
        return Generation(steps, seq, seq.common_prefix(list(prompt_tokens)))

    def _steps(self, seq: Sequence, prompt: list[int], n_predict: int, sampler: Sampler,
               stop: list[str], criteria: list[StoppingCriterion],
               preserved: frozenset[int] = frozenset(), n_keep: int | None = None,
               draft: Speculation | None = None) -> Generator[Step, None, GenerationResult]:
        """The generation loop of :meth:`generate` (a generator returning its result).

        With ``draft``, ``ahead`` holds the verified draft tokens the cache has past the last
        sampled token, each with the target's logits after it: the context is then
        ``seq.n_past - len(ahead)`` tokens, and ``logits`` those after it."""
        timings = Timings(load_ms=self.load_ms)
        if draft is not None:
            timings.n_drafted = 0
        ahead: list[tuple[int, np.ndarray]] = []
        recurrent = seq.cache.keeps_checkpoints  # a verification keeps a checkpoint to roll back to
        spec_cp = -1  # the position of the checkpoint of the draft being verified (-1: none)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated: list[int] = []
        text_out: list[str] = []
        pending = ""
        hit: str | None = None
        finish = "length"

        t0 = time.perf_counter()
        logits, timings.prompt_n = seq.prefill(prompt)
        version = seq.version
        timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        history = list(prompt)
        first = True
        try:
            while n_predict < 0 or len(generated) < n_predict:
                if seq.n_past - len(ahead) >= self.n_ctx:  # context full (finish "length")
                    ctx = list(seq.tokens)
                    keep = len(prompt) if n_keep is not None and n_keep < 0 else min(n_keep or 0, len(ctx))
                    n_discard = (len(ctx) - keep) // 2
                    if n_keep is None or n_discard <= 0:
                        break
                    te = time.perf_counter()
                    seq.rollback(keep)  # the kept tokens evaluated again where a sliding window lost them
                    logits = seq.eval(ctx[keep + n_discard:])[-1]
                    version = seq.version
                    timings.eval_ms += (time.perf_counter() - te) * 1e3
                ts = time.perf_counter()
                tok = sampler.sample(logits, history)
                timings.sample_ms += (time.perf_counter() - ts) * 1e3
                if first:
                    timings.ttft_ms = (time.perf_counter() - t0) * 1e3
                    first = False
                if self.tokenizer.is_eog(tok):
                    finish = "stop"
                    break
                generated.append(tok)
                history.append(tok)
                pending += decoder.decode(self.tokenizer.token_to_piece(tok, special=tok in preserved))
                emit, hit = _split_stop(pending, stop)
                pending = pending[len(emit):]
                if emit:
                    text_out.append(emit)
                yield Step(tok, emit, None, logits, candidates=sampler.last_candidates)
                if hit:
                    finish = "stop"
                    pending = ""
                    break
                if criteria and any(bool(c(np.asarray(history, dtype=np.intc), logits)) for c in criteria):
                    finish = "stop"
                    break
                if n_predict >= 0 and len(generated) >= n_predict:
                    break
                if seq.version != version:
                    raise CooktopError("this generation was interrupted: its sequence was changed by another "
                                       "eval or completion meanwhile; finish a stream before starting the next "
                                       "on the same sequence, or give each stream its own sequence (one Llama, "
                                       "or Engine.new_sequence(), per stream)")
                if ahead and ahead[0][0] == tok:  # the target sampled the draft's token: its logits are here
                    logits = ahead.pop(0)[1]
                    timings.n_accepted += 1
                    continue
                te = time.perf_counter()
                if ahead:  # rejected: drop the K/V (roll back the state) of the draft tokens past the sampled one
                    seq.rollback(seq.n_past - len(ahead))
                    ahead = []
                if spec_cp >= 0:  # the draft is settled
                    seq.cache.drop_checkpoint(spec_cp, seq.seq_id)
                    spec_cp = -1
                proposal: list[int] = []
                if draft is not None:
                    room = min(self.n_ctx - seq.n_past - 1, seq.model.n_batch - 1)
                    if n_predict >= 0:
                        room = min(room, n_predict - len(generated) - 1)
                    proposal = draft.propose(history, room, self.cfg.n_vocab, seq)
                if proposal:
                    if recurrent:
                        spec_cp = seq.cache.checkpoint(seq.seq_id)
                    rows = seq.eval([tok] + proposal, logits_all=True)
                    logits = rows[0]
                    ahead = list(zip(proposal, rows[1:]))
                    timings.n_drafted = (timings.n_drafted or 0) + len(proposal)
                else:
                    logits = seq.eval([tok])[-1]
                version = seq.version
                timings.eval_ms += (time.perf_counter() - te) * 1e3
                timings.eval_n += 1
        except GeneratorExit:  # closed early: forget the unchecked draft, as at the end
            if ahead and seq.version == version and not seq.cache.closed:
                seq.rollback(seq.n_past - len(ahead))
            raise
        if ahead:  # the context is the prompt and the generated tokens but the last
            seq.rollback(seq.n_past - len(ahead))
        if spec_cp >= 0:
            seq.cache.drop_checkpoint(spec_cp, seq.seq_id)
        timings.n_decoded = len(generated)
        tail = "" if hit else pending + decoder.decode(b"", final=True)
        if tail:
            text_out.append(tail)
        yield Step(None, tail, finish, stop_word=hit)
        return GenerationResult(generated, "".join(text_out), finish, timings, sampler.seed, list(prompt))

    def close(self) -> None:
        """Release the default sequence's cache and the model's device buffers (idempotent)."""
        self.seq.close()
        self.model.close()


def _split_stop(text: str, stop: list[str]) -> tuple[str, str | None]:
    """Return (the prefix of ``text`` safe to emit, the stop string found first in it, or None)."""
    if not stop:
        return text, None
    hits = [(text.find(s), s) for s in stop if s in text]
    if hits:
        at, word = min(hits, key=lambda h: h[0])
        return text[:at], word
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return text[:len(text) - hold], None


def load(model_path: str | os.PathLike, *, keep_scores: bool = False, **kwargs) -> Engine:
    """:func:`cooktop.runtime.loader.load_model` wrapped in an :class:`Engine` (same arguments),
    with its default sequence (whose KV cache is allocated now).

    Args:
        keep_scores: the default sequence records every logits row (see :class:`Engine`).
    Raises:
        GGUFError, UnsupportedModelError, DeviceError, DeviceOutOfMemoryError.
    """
    m: LoadedModel = load_model(model_path, **kwargs)
    try:
        return Engine(m.gf, m.cfg, m.tokenizer, m.model, m.placement, m.devices, m.load_ms, keep_scores)
    except BaseException:
        m.model.close()
        raise
