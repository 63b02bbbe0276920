"""Reranking: relevance scores of documents for a query with pooling ``rank`` (a reranker GGUF).

As llama.cpp does it (``src/llama-graph.cpp`` ``build_pooling``, case
``LLAMA_POOLING_TYPE_RANK``; the prompt from ``tools/server/server-common.cpp``
``format_prompt_rerank``):

* the pair's tokens are the model's ``tokenizer.chat_template.rerank`` with
  ``{query}`` and ``{document}`` filled in (special tokens parsed), else
  ``[BOS] query [EOS] [SEP] document [EOS]`` by the vocabulary's add-BOS / add-EOS flags;
* the output-normed hidden state of the last token (causal models; the first
  for non-causal BERT-style encoders, which cooktop does not run) goes through
  the classification head: ``cls.weight`` [n_embd, n_embd] (+ ``cls.bias``) and
  tanh when the model has it, then ``cls.output.weight`` [n_cls_out, n_embd]
  (+ ``cls.output.bias``); qwen3 rerankers add a softmax;
* the score is the head's first output.

A model whose pooling is not ``rank`` (``{arch}.pooling_type`` 4, or
``Llama(pooling_type=4)`` / ``--rerank``) or that has no ``cls.output`` /
``cls`` tensor is refused with :class:`RerankUnsupportedError`; cosine
similarity of embeddings is not a reranker.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import CooktopError
from ..format.quants import dequantize


class RerankUnsupportedError(CooktopError):
    """The model cannot rerank: no pooling ``rank`` or no classification head."""


@dataclasses.dataclass
class RankHead:
    """The classification head (float64 weights; None where the model has no such tensor)."""

    cls_w: np.ndarray | None
    cls_b: np.ndarray | None
    out_w: np.ndarray | None
    out_b: np.ndarray | None
    softmax: bool

    def score(self, h: np.ndarray) -> float:
        """The relevance score of one pooled hidden state ``h``: float [n_embd]."""
        x = h.astype(np.float64)
        if self.cls_w is not None:
            x = self.cls_w @ x
            if self.cls_b is not None:
                x = x + self.cls_b
            x = np.tanh(x)
        if self.out_w is not None:
            x = self.out_w @ x
            if self.out_b is not None:
                x = x + self.out_b
        if self.softmax:
            e = np.exp(x - x.max())
            x = e / e.sum()
        return float(np.atleast_1d(x)[0])


def _tensor(gf: Any, name: str) -> np.ndarray | None:
    t = gf.tensors.get(name)
    if t is None:
        return None
    return np.asarray(dequantize(t.data, t.ggml_type, t.shape), dtype=np.float64).reshape(t.shape)


def rank_head(llm: Any) -> RankHead:
    """The reranking head of ``llm``.

    Raises:
        RerankUnsupportedError: pooling is not ``rank``, or the model has no ``cls`` / ``cls.output`` tensor.
    """
    pooling = llm.pooling()
    gf = llm._gf
    head = getattr(llm, "_rank_head", None)
    if head is not None:
        return head
    if pooling != "rank":
        raise RerankUnsupportedError(
            f"this model does not support reranking: its pooling is {pooling!r}, not 'rank' (a reranker GGUF has "
            "pooling_type 4 and a classification head cls / cls.output); embeddings are not a reranker")
    w, b = _tensor(gf, "cls.weight"), _tensor(gf, "cls.bias")
    ow, ob = _tensor(gf, "cls.output.weight"), _tensor(gf, "cls.output.bias")
    if w is None and ow is None:
        raise RerankUnsupportedError("this model has pooling 'rank' but no classification head "
                                     "(tensors cls.weight / cls.output.weight); it cannot rerank")
    head = RankHead(w, b, ow, ob, softmax=gf.metadata.get("general.architecture") in ("qwen3", "qwen3vl"))
    llm._rank_head = head
    return head


def pair_tokens(llm: Any, query: str, document: str) -> list[int]:
    """The token ids of one (query, document) pair (llama.cpp ``format_prompt_rerank``)."""
    tmpl = llm._gf.metadata.get("tokenizer.chat_template.rerank")
    if isinstance(tmpl, str) and tmpl:
        text = tmpl.replace("{query}", query).replace("{document}", document)
        return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    tk = llm._tokenizer
    vocab = tk.vocab
    q = llm.tokenize(query.encode("utf-8"), add_bos=False, special=False)
    d = llm.tokenize(document.encode("utf-8"), add_bos=False, special=False)
    eos = tk.eos_id
    sep = getattr(vocab, "sep_id", -1)
    if eos < 0:
        eos = sep
    out = [tk.bos_id] if vocab.add_bos and tk.bos_id >= 0 else []
    out += q
    if vocab.add_eos and eos >= 0:
        out.append(eos)
    if getattr(vocab, "add_sep", False) and sep >= 0:
        out.append(sep)
    out += d
    if vocab.add_eos and eos >= 0:
        out.append(eos)
    return out


def rerank(llm: Any, query: str, documents: list[str]) -> tuple[list[float], int]:
    """Relevance scores of ``documents`` for ``query`` (document order) and the tokens evaluated.

    Raises:
        RerankUnsupportedError: see :func:`rank_head`. CooktopError: ``query`` not a string, ``documents``
            not a non-empty list of strings. ContextOverflowError: a pair longer than ``n_ctx``.
    """
    if not isinstance(query, str):
        raise CooktopError("query must be a string")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise CooktopError("documents must be a non-empty list of strings")
    head = rank_head(llm)
    seq = getattr(llm, "_embd_seq", None)
    if seq is None:
        seq = llm._embd_seq = llm._engine.new_sequence()
    scores, total = [], 0
    for doc in documents:
        ids = pair_tokens(llm, query, doc)
        h = seq.hidden_states(ids)
        total += len(ids)
        scores.append(head.score(h[-1]))  # causal model: the last token (llama.cpp: RANK && causal_attn)
    return scores, total
