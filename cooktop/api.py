"""The Python API: a ``Llama`` facade with llama-cpp-python's names and semantics.

Code written for ``llama_cpp.Llama`` runs with only its import changed::

    from cooktop import Llama
    llm = Llama(model_path="stories260K.gguf", n_ctx=512)
    out = llm.create_completion("Once upon a time", max_tokens=32, temperature=0)
    print(out["choices"][0]["text"])

Response dicts follow llama-cpp-python's ``llama_types`` (OpenAI's
``text_completion`` schema).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import numpy as np

from .engine import generate as _generate
from .engine.sampling import SamplingParams
from .errors import CooktopError


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: None
    finish_reason: str | None


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(TypedDict, total=False):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


class Llama:
    """A loaded model and its context, llama-cpp-python style.

    Args:
        model_path: path of a llama-family GGUF file.
        n_ctx: context length in tokens (0: from the model, capped at 4096).
        n_batch: prompt tokens per forward pass.
        n_gpu_layers: units to offload to the device(s) (llama.cpp semantics;
            0 = none, -1 = all); see ``cooktop.runtime.placement``.
        seed: RNG seed for sampling; -1 = random.
        logits_all: keep logits for every evaluated position in :attr:`scores`.
        verbose: print load information to stderr.
        device: ``--device`` selector(s) (default: ``COOKTOP_DEVICE`` or ``auto``).
        split: proportions of offloaded layers per device (``--split``).
    Raises:
        GGUFError, UnsupportedModelError, DeviceError (all ``CooktopError``).
    """

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_batch: int = 512, n_gpu_layers: int = 0,
                 seed: int = -1, logits_all: bool = False, verbose: bool = True, device: str | None = None,
                 split: str | list[float] | None = None):
        self.model_path = str(model_path)
        self.verbose = verbose
        self.seed = seed
        self._logits_all = logits_all
        self._last: _generate.GenerationResult | None = None
        self._engine_or_none: _generate.Engine | None = None
        self._engine_or_none = _generate.load(self.model_path, n_ctx=n_ctx, n_batch=n_batch, device=device,
                                            n_gpu_layers=n_gpu_layers, split=split, logits_all=logits_all,
                                            keep_scores=True)
        if verbose:
            import sys
            print(f"cooktop: loaded {self.model_path} in {self._engine.load_ms:.1f} ms; "
                  f"{self._engine.placement.summary()}", file=sys.stderr)

    @property
    def _engine(self) -> _generate.Engine:
        """The engine, or CooktopError once :meth:`close` was called."""
        eng = self._engine_or_none
        if eng is None:
            raise CooktopError(f"this Llama ({self.model_path}) is closed: close() was called or its "
                               "with-block ended; create a new Llama to use the model again")
        return eng

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, **kwargs: Any) -> Llama:
        """Load ``filename`` from a Hugging Face repo (cached download), like llama-cpp-python."""
        from .tools.hub import resolve
        return cls(model_path=resolve(repo_id, filename), **kwargs)

    # -- tokens ------------------------------------------------------------
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text`` (BOS prepended when ``add_bos`` and the vocab wants it)."""
        return self._engine.tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens`` (control tokens omitted unless ``special``)."""
        return self._engine.tokenizer.detokenize(list(tokens), special=special)

    def n_vocab(self) -> int:
        """Vocabulary size (tokens)."""
        return self._engine.cfg.n_vocab

    def n_ctx(self) -> int:
        """Context length (tokens)."""
        return self._engine.n_ctx

    def token_bos(self) -> int:
        """Beginning-of-sequence token id."""
        return self._engine.tokenizer.bos_id

    def token_eos(self) -> int:
        """End-of-sequence token id."""
        return self._engine.tokenizer.eos_id

    @property
    def n_tokens(self) -> int:
        """Tokens in the context."""
        return len(self._engine.tokens)

    @property
    def input_ids(self) -> np.ndarray:
        """int [n_tokens] ids in the context."""
        return np.array(self._engine.tokens, dtype=np.intc)

    @property
    def scores(self) -> np.ndarray:
        """float32 [n_tokens, n_vocab]: row i holds the logits after context position i.

        Every row when ``logits_all``; otherwise only the rows of the last token
        of each evaluation (prompt chunks, generated tokens) are filled and the
        others are zero, as in llama-cpp-python.
        """
        return self._scores[: self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        """The default sequence's whole logits buffer (rows past ``n_tokens`` are zero)."""
        scores = self._engine.seq.scores
        assert scores is not None  # the default sequence keeps scores (load(keep_scores=True))
        return scores

    # -- evaluation --------------------------------------------------------
    def reset(self) -> None:
        """Empty the context."""
        self._engine.reset()

    def eval(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the context and evaluate them (fills :attr:`scores`).

        Raises:
            ContextOverflowError: more than ``n_ctx`` tokens in total.
            InvalidTokenError: an empty list or an id outside ``0 .. n_vocab - 1``.
        """
        self._engine.eval(list(tokens), logits_all=self._logits_all)

    # -- completion --------------------------------------------------------
    def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                          repeat_penalty: float = 1.0, seed: int | None = None, stop: str | list[str] | None = None,
                          stream: bool = False, echo: bool = False) -> Completion | Iterator[Completion]:
        """Complete ``prompt`` (text, or token ids).

        Args:
            max_tokens: tokens to generate; None or <= 0 means until the context is full.
            temperature <= 0: greedy. top_k, top_p, min_p, repeat_penalty: llama.cpp sampling.
            seed: overrides the instance seed for this call.
            stop: string(s) ending generation (not included).
            stream: yield partial completions (``finish_reason`` set on the last).
            echo: prepend the prompt text.
        Returns:
            a ``text_completion`` dict (``choices[0].text``, ``finish_reason``,
            ``usage``), or an iterator of chunks when ``stream``.
        Raises:
            ContextOverflowError: the prompt does not fit in ``n_ctx``.
        """
        eng = self._engine
        tokens = (self.tokenize(prompt.encode("utf-8"), add_bos=True) if isinstance(prompt, str)
                  else [int(t) for t in prompt])
        n_predict = -1 if max_tokens is None or max_tokens <= 0 else int(max_tokens)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, seed=self.seed if seed is None else seed)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        gen = eng.generate(tokens, n_predict, params, stops)  # raises ContextOverflowError before running
        cid = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        prefix = prompt if (echo and isinstance(prompt, str)) else ""

        def chunk(text: str, finish: str | None) -> Completion:
            out: Completion = {"id": cid, "object": "text_completion", "created": created,
                               "model": self.model_path,
                               "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
            return out

        def usage(res: _generate.GenerationResult) -> CompletionUsage:
            n = len(res.tokens)
            return {"prompt_tokens": len(tokens), "completion_tokens": n, "total_tokens": len(tokens) + n}

        if stream:
            def it() -> Iterator[Completion]:
                if prefix:
                    yield chunk(prefix, None)
                for step in gen:
                    if step.text:
                        yield chunk(step.text, None)
                res = self._last = gen.drain()  # exhausted: its result
                last = chunk("", res.finish_reason)
                last["usage"] = usage(res)
                yield last
            return it()
        res = self._last = gen.drain()
        out = chunk(prefix + res.text, res.finish_reason)
        out["usage"] = usage(res)
        return out

    __call__ = create_completion

    @property
    def last_timings(self) -> _generate.Timings:
        """Timings of the last finished completion (milliseconds).

        Raises:
            CooktopError: no completion has finished yet, or the Llama is closed.
        """
        self._engine  # noqa: B018 - raises when closed
        if self._last is None:
            raise CooktopError("no completion has finished yet: last_timings has nothing to report")
        return self._last.timings

    def close(self) -> None:
        """Release the device buffers (model and context) now. Idempotent; afterwards every
        other method raises ``CooktopError("... is closed ...")``. Dropping the last
        reference (``del llm``) frees them too, at once."""
        eng, self._engine_or_none = self._engine_or_none, None
        if eng is not None:
            eng.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
