"""The SentencePiece (SPM) tokenizer of llama.cpp, for ``tokenizer.ggml.model == "llama"``.

Llama 1/2, TinyLlama, Mistral v0.1, the llama2.c "stories" models, ... Every rule is
llama.cpp's (``src/llama-vocab.cpp``: ``impl::tokenize`` for ``LLAMA_VOCAB_TYPE_SPM``,
``llm_tokenizer_spm_session``); what all vocabularies share (special-token partition,
pieces, end of generation) is in :mod:`.vocab`. Text is handled as UTF-8 bytes, so
invalid UTF-8 input tokenizes (into byte tokens) instead of failing.

Per raw-text fragment (between special tokens):

1. A leading space is added when ``add_space_prefix`` and the fragment is the first
   piece or follows a special token; spaces become U+2581 (``▁``).
2. *SPM merge* (``llm_tokenizer_spm_session``): the fragment is split into UTF-8
   characters (length from the lead byte), then the adjacent pair whose
   concatenation is a vocabulary token with the highest score is merged, ties to
   the leftmost, until no pair is a token (priority queue of bigrams over a linked
   list of symbols: O(n log n)).
3. *Resegment*: a final symbol that is a token is emitted as it is; any other (a
   character missing from the vocabulary) is emitted byte by byte as ``<0xNN>``
   tokens (or the one-byte token, or UNK if the vocabulary has neither).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .base import SPACE, BaseTokenizer
from .vocab import Vocab

ESCAPED_SPACE = "\u2581".encode()  # ▁, SentencePiece's whitespace symbol

# UTF-8 sequence length from the high nibble of the lead byte (llama.cpp unicode_len_utf8);
# a stray continuation byte counts as a one-byte character.
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


class SpmTokenizer(BaseTokenizer):
    """llama.cpp's SPM tokenizer and detokenizer over a :class:`~cooktop.text.vocab.Vocab`."""

    model = "llama"

    def __init__(self, vocab: Vocab):
        """Index the vocabulary (see :class:`~cooktop.text.base.BaseTokenizer`)."""
        super().__init__(vocab)
        self._scores = vocab.scores.astype("float32").tolist()

    def _normal_pieces(self, ids: Sequence[int]) -> list[bytes]:
        """``▁`` prints as a space."""
        texts = self._texts
        return [texts[i].replace(ESCAPED_SPACE, SPACE) for i in ids]

    def _encode(self, fragment: bytes, out: list[int], after_special: bool) -> None:
        """Space prefix, ``▁`` escaping, then the merge."""
        if self.vocab.add_space_prefix and after_special:
            fragment = SPACE + fragment
        self._spm(fragment.replace(SPACE, ESCAPED_SPACE), out)

    def _spm(self, text: bytes, out: list[int]) -> None:
        """Append the SPM tokens of one escaped fragment (llama.cpp ``llm_tokenizer_spm_session::tokenize``)."""
        n_text = len(text)
        if n_text == 0:
            return
        to_id = self._to_id
        scores = self._scores
        # Symbols: start offset, byte length (0 once merged away), prev, next index.
        start: list[int] = []
        size: list[int] = []
        offs = 0
        while offs < n_text:
            ln = _UTF8_LEN[text[offs] >> 4]
            if offs + ln > n_text:
                ln = n_text - offs
            start.append(offs)
            size.append(ln)
            offs += ln
        n_sym = len(start)
        prev = list(range(-1, n_sym - 1))
        nxt = list(range(1, n_sym + 1))
        nxt[-1] = -1

        heap: list[tuple[float, int, int, int]] = []
        push = heapq.heappush

        # Seed with every adjacent pair that is a token. Heap order: highest score, then leftmost.
        for i in range(n_sym - 1):
            s = start[i]
            e = s + size[i] + size[i + 1]
            tid = to_id.get(text[s:e])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, e - s))
        heapq.heapify(heap)

        pop = heapq.heappop
        while heap:
            _, left, right, bsize = pop(heap)
            ln, rn = size[left], size[right]
            # Skip a bigram whose symbols changed since it was queued.
            if ln == 0 or rn == 0 or ln + rn != bsize:
                continue
            size[left] = bsize
            size[right] = 0
            r_next = nxt[right]
            nxt[left] = r_next
            if r_next >= 0:
                prev[r_next] = left
            # New candidate pairs with the neighbours.
            p = prev[left]
            if p >= 0:
                s = start[p]
                e = start[left] + bsize
                tid = to_id.get(text[s:e])
                if tid is not None:
                    push(heap, (-scores[tid], p, left, e - s))
            if r_next >= 0:
                s = start[left]
                e = start[r_next] + size[r_next]
                tid = to_id.get(text[s:e])
                if tid is not None:
                    push(heap, (-scores[tid], left, r_next, e - s))

        # Resegment: whole symbol if it is a token, otherwise its bytes.
        byte_tok = self._byte_tok
        i = 0
        while i != -1:
            s = start[i]
            piece = text[s:s + size[i]]
            tid = to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(byte_tok[b] for b in piece)
            i = nxt[i]
