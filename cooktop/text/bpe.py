"""Byte-level BPE as llama.cpp runs it, for ``tokenizer.ggml.model == "gpt2"`` (GPT-2, Llama 3,
Qwen2/2.5/3, SmolLM, StarCoder, DeepSeek, Mistral Tekken, ...).

llama.cpp ``src/llama-vocab.cpp`` ``llm_tokenizer_bpe_session::tokenize``; the vocabulary-wide
parts (special-token partition, pieces, end of generation) are in :mod:`.vocab`.

Per raw-text fragment (between special tokens):

1. The bytes become code points as llama.cpp decodes them (an invalid byte is U+FFFD) and
   the pre-tokenizer named by ``tokenizer.ggml.pre`` cuts them into words (:mod:`.pretokenize`).
2. Each word's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode
   table: ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for themselves, the other 68 bytes
   for U+0100..U+0143; a space is ``Ġ``).
3. With ``ignore_merges`` (Llama 3, Tekken) a word that is a token is emitted whole.
   Otherwise the word starts as one symbol per character and the adjacent pair with the
   lowest merge rank (``tokenizer.ggml.merges`` order) is merged, ties to the leftmost,
   until no pair has a rank.
4. Each final symbol is its token; a symbol that is not a token is emitted byte by byte as
   one-byte tokens, where those exist (llama.cpp drops the others).

Words recur, so their ids are cached (the result of a word never depends on its context).
"""

from __future__ import annotations

import bisect
import codecs
import heapq
import re
from collections.abc import Sequence

import numpy as np

from .base import BaseTokenizer
from .pretokenize import PreTokenizer, pre_type, utf8_codepoints
from .vocab import Vocab, decode_all


def _byte_to_unicode() -> list[str]:
    """GPT-2's ``bytes_to_unicode`` (llama.cpp ``unicode_byte_to_utf8_map``): byte -> character."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, n = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# The table as a charmap codec (C speed): decode = bytes -> mapped characters, encode = back.
_TABLE = "".join(BYTE_TO_UNICODE)
_ENCODING_MAP = codecs.charmap_build(_TABLE)
_UNMAPPED = re.compile("[^" + "".join(re.escape(c) for c in BYTE_TO_UNICODE) + "]")
_CACHE_SIZE = 1 << 16


def decode_text(text: bytes) -> bytes:
    """The bytes a NORMAL byte-level BPE token stands for (llama.cpp ``llama_decode_text``).

    A character outside the byte-to-unicode table is written, as llama.cpp writes it,
    ``[UNK_BYTE_0x<its UTF-8 in hex><the token text>]``.
    """
    s = utf8_codepoints(text)
    try:
        return codecs.charmap_encode(s, "strict", _ENCODING_MAP)[0]
    except UnicodeEncodeError:
        pass
    out = bytearray()
    for c in s:
        b = UNICODE_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8", "surrogatepass").hex().encode() + text + b"]"
    return bytes(out)


class BpeTokenizer(BaseTokenizer):
    """llama.cpp's byte-level BPE tokenizer and detokenizer over a :class:`~cooktop.text.vocab.Vocab`."""

    model = "gpt2"

    def __init__(self, vocab: Vocab):
        """Index the vocabulary, its merges and its pre-tokenizer.

        Raises:
            UnsupportedModelError: an unknown ``tokenizer.ggml.pre`` (named), no merges, or
                what :class:`~cooktop.text.base.BaseTokenizer` refuses.
        """
        super().__init__(vocab)
        self._pre = PreTokenizer(pre_type(vocab.pre or "default").regexes)
        merges = decode_all(vocab.merges or [])
        # "left right" -> rank; the first of duplicate merges wins, as in llama.cpp (emplace).
        self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))
        self._cache: dict[str, tuple[int, ...]] = {}

    def _normal_pieces(self, ids: Sequence[int]) -> list[bytes]:
        """The byte-to-unicode mapping undone (:func:`decode_text`), for all tokens in a few passes."""
        tokens, texts = self.vocab.tokens, self._texts
        strs = tokens if isinstance(ids, range) and len(ids) == len(tokens) else [tokens[i] for i in ids]
        big = "".join(strs)
        data = codecs.charmap_encode(big, "replace", _ENCODING_MAP)[0]  # one byte per character
        ends = np.cumsum(np.fromiter(map(len, strs), dtype=np.int64, count=len(strs))).tolist()
        out = [data[a:b] for a, b in zip([0] + ends[:-1], ends)]
        for m in _UNMAPPED.finditer(big):  # tokens with a character outside the table: one by one
            k = bisect.bisect_right(ends, m.start())
            out[k] = decode_text(texts[ids[k]])
        return out

    def _encode(self, fragment: bytes, out: list[int], after_special: bool) -> None:
        """Pre-tokenize, map bytes to characters, merge each word."""
        for word in self._pre.split(utf8_codepoints(fragment)):
            out.extend(self._word(codecs.charmap_decode(word.encode("utf-8", "surrogatepass"), "strict", _TABLE)[0]))

    def _word(self, word: str) -> tuple[int, ...]:
        """The ids of one byte-mapped word (llama.cpp's merge loop over a priority queue)."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        tid = self._to_id.get(word.encode()) if self.vocab.ignore_merges else None
        if tid is not None:
            ids = (tid,)
        else:
            ids = self._merge(word)
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _merge(self, word: str) -> tuple[int, ...]:
        n = len(word)
        if n == 0:
            return ()
        ranks = self._ranks
        size = [1] * n  # symbol i spans word[i:i + size[i]]; 0 once merged away
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            r = ranks.get(word[i] + " " + word[i + 1])
            if r is not None:
                heap.append((r, i, i + 1, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, bsize = pop(heap)
            # Skip a bigram whose symbols changed since it was queued.
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != bsize:
                continue
            size[left] = bsize
            size[right] = 0
            r_next = nxt[right]
            nxt[left] = r_next
            if r_next >= 0:
                prev[r_next] = left
            p = prev[left]
            if p >= 0:
                r = ranks.get(word[p:left] + " " + word[left:left + bsize])
                if r is not None:
                    push(heap, (r, p, left, size[p] + bsize))
            if r_next >= 0:
                r = ranks.get(word[left:r_next] + " " + word[r_next:r_next + size[r_next]])
                if r is not None:
                    push(heap, (r, left, r_next, bsize + size[r_next]))
        to_id = self._to_id
        out: list[int] = []
        i = 0
        while i != -1:
            piece = word[i:i + size[i]].encode()
            tid = to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:  # llama.cpp: each byte as a one-byte token, where the vocabulary has one
                for b in piece:
                    tid = to_id.get(bytes((b,)))
                    if tid is not None:
                        out.append(tid)
            i = nxt[i]
        return tuple(out)
