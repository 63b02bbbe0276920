"""``Llama.create_embedding`` / ``Llama.embed``: pooled, L2-normalised hidden states.

Each input is evaluated from position 0 on a sequence of its own (the chat
context is left alone), and the output-normed hidden states of its tokens
(llama.cpp's ``result_norm``) are pooled by the model's ``pooling_type``
(``{arch}.pooling_type``; mean when absent) or the ``pooling_type`` given to
``Llama``: mean, cls (first token), last, or none (one vector per token).
Vectors are L2-normalised as llama-server returns them (``embd_normalize`` 2);
``embed(normalize=False)`` gives them raw (llama-cpp-python's default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CooktopError
from . import options
from .base import LlamaBase
from .types import CreateEmbeddingResponse


def _normalize(v: np.ndarray) -> np.ndarray:
    """L2 normalisation of the last axis (llama.cpp ``common_embd_normalize``, norm 2); zeros stay zeros."""
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.where(n > 0, v / np.where(n > 0, n, 1), 0.0)


class EmbeddingMixin(LlamaBase):
    """Embeddings for :class:`cooktop.api.llama.Llama`."""

    def pooling(self) -> str:
        """The pooling used: ``Llama(pooling_type=...)``, else the model's, else ``mean``."""
        if self.pooling_type != -1:
            return options.pooling_name(self.pooling_type)
        md = self._gf.metadata
        value = md.get(f"{md.get('general.architecture', 'llama')}.pooling_type")
        if isinstance(value, int) and value in options.POOLING and value != -1:
            return options.POOLING[value]
        return "mean"

    def _inputs(self, input: Any) -> list[list[int]]:
        """Token ids of each input: text(s) tokenized with BOS, or token ids given as is.

        Raises:
            CooktopError: an empty input list, or an item that is neither text nor a list of ids.
        """
        if isinstance(input, str) or (isinstance(input, list) and input and all(
                isinstance(t, int) and not isinstance(t, bool) for t in input)):
            input = [input]
        if not isinstance(input, list) or not input:
            raise CooktopError("input must be a string, a list of strings, or token ids (non-empty)")
        out = []
        for i, item in enumerate(input):
            if isinstance(item, str):
                out.append(self.tokenize(item, add_bos=True, special=False))
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                out.append([int(t) for t in item])
            else:
                raise CooktopError(f"input[{i}] must be a string or a list of token ids, got {type(item).__name__}")
            if not out[-1]:
                raise CooktopError(f"input[{i}] has no tokens")
        return out

    def embed(self, input: Any, normalize: bool = True, truncate: bool = True,
              return_count: bool = False) -> Any:
        """Embedding vector(s) of ``input``.

        Args:
            input: a string, a list of strings, token ids, or a list of token-id lists.
            normalize: L2-normalise (default True, as llama-server; llama-cpp-python defaults to False).
            truncate: cut an input longer than ``n_ctx`` tokens (else raise).
            return_count: also return the number of tokens evaluated.
        Returns:
            ``list[float]`` for one input, ``list[list[float]]`` for several (with pooling
            ``none``, one more level: a vector per token); ``(result, n_tokens)`` with return_count.
        Raises:
            CooktopError: created without ``embedding=True``; bad input; pooling ``rank``.
            ContextOverflowError: an input longer than ``n_ctx`` with ``truncate=False``.
        """
        eng = self._engine
        if not self.embedding_enabled:
            raise CooktopError("Llama model must be created with embedding=True to call this method")
        pooling = self.pooling()
        if pooling == "rank":
            raise CooktopError("pooling_type rank gives relevance scores, not embeddings: use rerank() or /v1/rerank")
        batches = self._inputs(input)
        seq = getattr(self, "_embd_seq", None)
        if seq is None:
            seq = self._embd_seq = eng.new_sequence()
        results, total = [], 0
        for ids in batches:
            if truncate:
                ids = ids[: self.n_ctx()]
            h = seq.hidden_states(ids).astype(np.float64)
            total += len(ids)
            if pooling == "mean":
                v = h.mean(axis=0)
            elif pooling == "cls":
                v = h[0]
            elif pooling == "last":
                v = h[-1]
            else:
                v = h
            if normalize:
                v = _normalize(v)
            results.append(v.astype(np.float32).tolist())
        out = results[0] if (isinstance(input, str) or (isinstance(input, list) and input and isinstance(
            input[0], int))) else results
        return (out, total) if return_count else out

    def create_embedding(self, input: Any, model: str | None = None) -> CreateEmbeddingResponse:
        """OpenAI ``/v1/embeddings`` response for ``input`` (see :meth:`embed`)."""
        single = isinstance(input, str) or (isinstance(input, list) and input and isinstance(input[0], int))
        vectors, total = self.embed(input, return_count=True)
        if single:
            vectors = [vectors]
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": total, "total_tokens": total}}
