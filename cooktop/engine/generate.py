"""The generation loop: load a model, evaluate prompts in n_batch chunks, decode, stream.

:func:`load` opens the GGUF, resolves the devices, plans the placement and
uploads the weights. :class:`Engine` keeps the context (the tokens whose K/V
are in the cache), evaluates new tokens in chunks of ``n_batch`` (reusing the
longest common prefix with what is cached, as llama-cpp-python does), then
decodes one token at a time. Generation stops at an end-of-generation token
(``stop``), after ``n_predict`` tokens or at the end of the context
(``length``), or at a stop string (``stop``); it never raises mid-generation
for a full context. Text is streamed through an incremental UTF-8 decoder,
so a character split across tokens is held back until complete.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
import time
from typing import Callable, Iterator

import numpy as np

from ..backends.base import Device
from ..errors import ContextOverflowError, CooktopError
from ..format.gguf import GGUFFile
from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from ..runtime.loader import LoadedModel, load_model
from ..runtime.placement import Placement
from ..text.tokenizer import InvalidTokenError, Tokenizer
from .sampling import Sampler, SamplingParams

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
        ]


@dataclasses.dataclass
class GenerationResult:
    """What :meth:`Engine.generate` produced: ids, text, why it stopped, timings."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" or "length"
    timings: Timings
    seed: int = -1  # the seed the sampler used (drawn when -1 was asked)


class Engine:
    """A loaded model plus tokenizer and context state.

    Attributes:
        gf, cfg, tokenizer, model, placement, devices.
        tokens: the context (token ids whose K/V are cached), len <= n_ctx.
        n_ctx, n_batch: context length and prompt chunk size (tokens).
    """

    def __init__(self, gf: GGUFFile, cfg: ModelConfig, tokenizer: Tokenizer, model: LlamaModel,
                 placement: Placement, devices: dict[str, Device], load_ms: float):
        self.gf, self.cfg, self.tokenizer, self.model = gf, cfg, tokenizer, model
        self.placement = placement
        self.devices = devices
        self.n_ctx, self.n_batch = model.n_ctx, model.n_batch
        self.tokens: list[int] = []
        self.load_ms = load_ms
        #: Called as ``on_logits(pos, rows)`` after every forward pass: ``rows`` float32
        #: [m, n_vocab] are the logits of positions ``pos .. pos + m - 1``.
        self.on_logits: Callable[[int, np.ndarray], None] | None = None
        #: Called as ``on_truncate(n)`` when the context shrinks to its first ``n`` tokens.
        self.on_truncate: Callable[[int], None] | None = None
        self._epoch = 0  # bumped by every eval/truncation: a suspended generate() must not resume after one

    # -- evaluation ---------------------------------------------------------
    def reset(self) -> None:
        """Forget the context (the cache is overwritten on the next eval)."""
        self._truncate(0)

    def _truncate(self, n: int) -> None:
        self._epoch += 1
        self.tokens = self.tokens[:n]
        if self.on_truncate is not None:
            self.on_truncate(n)

    def eval(self, tokens: list[int], logits_all: bool = False) -> np.ndarray:
        """Append ``tokens`` to the context, evaluating them in ``n_batch`` chunks.

        Returns:
            float32 [len(tokens), n_vocab] when ``logits_all`` (the model must
            be loaded with logits_all), else float32 [1, n_vocab] of the last token.
        Raises:
            ContextOverflowError: the context would exceed ``n_ctx``.
            InvalidTokenError: no tokens, or a token id out of range.
            CooktopError: ``logits_all`` asked of a model loaded without it.
        """
        tokens = [int(t) for t in tokens]
        self._epoch += 1
        if not tokens:
            raise InvalidTokenError("eval needs at least one token")
        if logits_all and not self.model.logits_all:
            raise CooktopError("logits for every position need the model loaded with logits_all=True")
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(self.tokens) + len(tokens)} tokens do not fit in the context of n_ctx = {self.n_ctx} "
                f"tokens ({len(self.tokens)} already in it); raise n_ctx (-c) or shorten the prompt")
        bad = [t for t in tokens if not 0 <= t < self.cfg.n_vocab]
        if bad:
            raise InvalidTokenError(f"token id {bad[0]} is out of range 0..{self.cfg.n_vocab - 1}")
        outs = []
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            pos = len(self.tokens)
            out = self.model.forward(np.array(chunk), pos, logits_all)
            self.tokens += chunk
            if self.on_logits is not None:
                self.on_logits(pos if logits_all else len(self.tokens) - 1, out)
            outs.append(out)
        return np.concatenate(outs) if logits_all else outs[-1]

    def _prefill(self, prompt: list[int]) -> tuple[np.ndarray, int]:
        """Evaluate ``prompt`` reusing the cached common prefix.

        Returns:
            (float32 [n_vocab] logits of its last token, number of tokens evaluated)
        """
        common = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)  # re-evaluate at least one token for its logits
        self._truncate(common)
        return self.eval(prompt[common:])[-1], len(prompt) - common

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
                f"raise -c / n_ctx (the model was trained with {self.cfg.n_ctx_train}) or shorten the prompt")

    def generate(self, prompt_tokens: list[int], n_predict: int, params: SamplingParams,
                 stop: list[str] | None = None) -> Iterator[str]:
        """Stream the continuation of ``prompt_tokens`` as text pieces.

        After the iterator is exhausted, ``self.result`` holds a :class:`GenerationResult`.

        Args:
            prompt_tokens: ids (BOS included if wanted); 1..n_ctx tokens.
            n_predict: max tokens to generate; < 0 means until the context is full.
            params: sampling settings.
            stop: strings that end generation (not included in the output).
        Raises:
            ContextOverflowError: the prompt alone does not fit in ``n_ctx`` (before anything runs).
        """
        self.check_prompt(prompt_tokens)
        stop = [s for s in (stop or []) if s]
        timings = Timings(load_ms=self.load_ms)
        sampler = Sampler(params)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated: list[int] = []
        text_out: list[str] = []
        pending = ""
        hit = False
        finish = "length"
        self.result = GenerationResult(generated, "", finish, timings)

        t0 = time.perf_counter()
        logits, timings.prompt_n = self._prefill(list(prompt_tokens))
        epoch = self._epoch
        timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        history = list(prompt_tokens)
        first = True
        while n_predict < 0 or len(generated) < n_predict:
            if len(self.tokens) >= self.n_ctx:  # context full: every generated token must fit (finish "length")
                break
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
            pending += decoder.decode(self.tokenizer.token_to_piece(tok))
            emit, hit = _split_stop(pending, stop)
            if emit:
                text_out.append(emit)
                yield emit
            pending = pending[len(emit):]
            if hit:
                finish = "stop"
                pending = ""
                break
            if n_predict >= 0 and len(generated) >= n_predict:
                break
            if self._epoch != epoch:
                raise CooktopError("this generation was interrupted: the context was changed by another "
                                   "eval or completion on the same model; finish a stream before starting "
                                   "the next, or use one Llama per stream")
            te = time.perf_counter()
            logits = self.eval([tok])[-1]
            epoch = self._epoch
            timings.eval_ms += (time.perf_counter() - te) * 1e3
            timings.eval_n += 1
        tail = "" if hit else pending + decoder.decode(b"", final=True)
        if tail:
            text_out.append(tail)
            yield tail
        self.result = GenerationResult(generated, "".join(text_out), finish, timings, sampler.seed)

    def close(self) -> None:
        """Release the model's device buffers."""
        self.model.close()


def _split_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Return (the prefix of ``text`` safe to emit, whether a stop string was found)."""
    if not stop:
        return text, False
    hits = [text.find(s) for s in stop if s in text]
    if hits:
        return text[:min(hits)], True
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return text[:len(text) - hold], False




def load(model_path: str | os.PathLike, **kwargs) -> Engine:
    """:func:`cooktop.runtime.loader.load_model` wrapped in an :class:`Engine` (same arguments).

    Raises:
        GGUFError, UnsupportedModelError, DeviceError, DeviceOutOfMemoryError.
    """
    m: LoadedModel = load_model(model_path, **kwargs)
    return Engine(m.gf, m.cfg, m.tokenizer, m.model, m.placement, m.devices, m.load_ms)
