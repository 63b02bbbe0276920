"""The llama SentencePiece (SPM) tokenizer, with llama.cpp's semantics, from a GGUF vocabulary.

Only ``tokenizer.ggml.model == "llama"`` vocabularies are supported (Llama 1/2,
TinyLlama, Mistral v0.1, the llama2.c "stories" models, ...). Every rule below
is llama.cpp's (``src/llama-vocab.cpp``: ``llama_vocab::impl::load``,
``tokenizer_st_partition``, ``impl::tokenize`` for ``LLAMA_VOCAB_TYPE_SPM``,
``llm_tokenizer_spm_session``, ``token_to_piece``, ``detokenize``); the
detokenizer of the Python API follows llama-cpp-python's
``LlamaModel.detokenize``.

Text is handled as UTF-8 bytes throughout, as llama.cpp does, so invalid UTF-8
input tokenizes (into byte tokens) instead of failing.

Tokenization of one text:

1. *Special-token partition* (``tokenizer_st_partition``): the text is split
   around occurrences of special token texts, longest texts first.
   USER_DEFINED tokens are always split out; CONTROL and UNKNOWN tokens only
   when ``special=True``.
2. Each remaining raw fragment gets a leading space when ``add_space_prefix``
   and it is the first piece or follows a special token; spaces become
   U+2581 (``▁``).
3. *SPM merge* (``llm_tokenizer_spm_session``): the fragment is split into
   UTF-8 characters (length from the lead byte), then the adjacent pair whose
   concatenation is a vocabulary token with the highest score is merged,
   ties to the leftmost, until no pair is a token (priority queue of bigrams
   over a linked list of symbols: O(n log n)).
4. *Resegment*: a final symbol that is a token is emitted as it is; any other
   (a character missing from the vocabulary) is emitted byte by byte as
   ``<0xNN>`` tokens (or the one-byte token, or UNK if the vocabulary has
   neither).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType

from ..errors import CooktopError, UnsupportedModelError

# llama.cpp token types (llama.h, enum llama_token_type), stored in tokenizer.ggml.token_type.
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

_SPACE = b" "
_ESCAPED_SPACE = "\u2581".encode()  # ▁, SentencePiece's whitespace symbol
_C_ISSPACE = b" \t\n\v\f\r"

# Token texts llama.cpp treats as end of generation besides EOS/EOT/EOM (llama_vocab::impl::load:
# its EOG list, plus the FIM pad/repo/file-separator tokens it detects by text).
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
# Texts of end-of-turn and fill-in-the-middle tokens that llama.cpp forces to CONTROL when
# the file marks them otherwise (so they print as nothing and are parsed only with special).
_CONTROL_TEXTS = _EOG_TEXTS | frozenset({
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
    "<|code_middle|>", "<|middle|>",
})

# UTF-8 sequence length from the high nibble of the lead byte (llama.cpp unicode_len_utf8);
# a stray continuation byte counts as a one-byte character.
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


class InvalidTokenError(CooktopError, ValueError):
    """A token id outside ``[0, n_vocab)`` was given to the detokenizer."""


@dataclass(frozen=True)
class Vocab:
    """An SPM vocabulary as read from a GGUF file (``tokenizer.ggml.*`` keys).

    Attributes:
        tokens: token texts [n_vocab]; ``▁`` stands for a space. A text that is
            not valid UTF-8 is decoded with ``surrogateescape`` (its bytes are
            recovered by encoding it the same way).
        scores: float32 [n_vocab], SentencePiece log-probabilities; the merge
            priority (higher first). Zeros when the file has none.
        token_types: int32 [n_vocab], llama.cpp token types (1 NORMAL, 2 UNKNOWN,
            3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE). All NORMAL when absent.
        bos_id, eos_id, unk_id: special ids (llama.cpp defaults 1, 2, 0 for SPM);
            -1 when absent and out of range.
        pad_id: padding id, or None.
        add_bos, add_eos: whether ``tokenize(add_bos=True)`` adds BOS / EOS.
        add_space_prefix: whether a space is prepended to a text fragment.
        model: the ``tokenizer.ggml.model`` value (always ``"llama"`` here).
        name: ``general.name`` (lower case), used for per-model token attributes.
        eot_id, eom_id: end-of-turn / end-of-message ids, or None.
    """

    tokens: list[str]
    scores: np.ndarray
    token_types: np.ndarray
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    model: str
    name: str = ""
    eot_id: int | None = None
    eom_id: int | None = None

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)


def _field(reader, key: str):
    """The GGUF field ``key`` or None."""
    return reader.fields.get(key)


def _scalar(reader, key: str, default):
    """The value of scalar field ``key``, or ``default`` when absent."""
    f = _field(reader, key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception as e:  # noqa: BLE001 - any decoding failure is a bad file
        raise UnsupportedModelError(f"GGUF key {key} is unreadable ({e})") from None


def _array(reader, key: str, *sub_types: GGUFValueType) -> list | None:
    """Parts of array field ``key`` (one numpy array per element), or None when absent.

    Raises:
        UnsupportedModelError: the field is not an array of one of ``sub_types``.
    """
    f = _field(reader, key)
    if f is None:
        return None
    if len(f.types) != 2 or f.types[0] != GGUFValueType.ARRAY or f.types[1] not in sub_types:
        want = " or ".join(t.name for t in sub_types)
        raise UnsupportedModelError(f"GGUF key {key} is not an array of {want}")
    return [f.parts[i] for i in f.data]


def load_vocab(reader) -> Vocab:
    """Read the SPM vocabulary of a GGUF file (llama.cpp ``llama_vocab::impl::load`` rules).

    Args:
        reader: a ``gguf.GGUFReader`` over a model or vocab-only file.

    Returns:
        The :class:`Vocab`. Special ids absent from the file take llama.cpp's SPM
        defaults (BOS 1, EOS 2, UNK 0, no PAD); an id out of range keeps the
        default, as in llama.cpp. ``add_bos_token`` defaults to true,
        ``add_eos_token`` to false, ``add_space_prefix`` to true.

    Raises:
        UnsupportedModelError: no ``tokenizer.ggml.model`` or ``tokenizer.ggml.tokens``
            key, a tokenizer model other than ``llama`` (named in the message),
            scores/types shorter than the token list, a duplicate token text, or
            ``add_bos_token`` true without a valid BOS id.
    """
    model = _scalar(reader, "tokenizer.ggml.model", None)
    if model is None:
        raise UnsupportedModelError(
            "GGUF has no tokenizer.ggml.model key: the file carries no vocabulary cooktop can use")
    if model != "llama":
        raise UnsupportedModelError(
            f"tokenizer model {model!r} is not supported: cooktop only has the llama SentencePiece "
            f"tokenizer (tokenizer.ggml.model == 'llama')")

    parts = _array(reader, "tokenizer.ggml.tokens", GGUFValueType.STRING)
    if parts is None:
        raise UnsupportedModelError("GGUF has no tokenizer.ggml.tokens key (the token list)")
    n = len(parts)
    if n == 0:
        raise UnsupportedModelError("tokenizer.ggml.tokens is empty")
    tokens = []
    for i, p in enumerate(parts):
        b = p.tobytes()
        # llama.cpp renames empty tokens so that they cannot match anything.
        tokens.append(b.decode("utf-8", "surrogateescape") if b else f"[EMPTY_{i}]")

    sp = _array(reader, "tokenizer.ggml.scores", GGUFValueType.FLOAT32, GGUFValueType.INT32)
    if sp is None:
        scores = np.zeros(n, dtype=np.float32)
    else:
        if len(sp) < n:
            raise UnsupportedModelError(f"tokenizer.ggml.scores has {len(sp)} entries for {n} tokens")
        scores = np.concatenate(sp[:n]).astype(np.float32)

    tp = _array(reader, "tokenizer.ggml.token_type", GGUFValueType.INT32)
    if tp is None:
        types = np.full(n, TOKEN_TYPE_NORMAL, dtype=np.int32)
    else:
        if len(tp) < n:
            raise UnsupportedModelError(f"tokenizer.ggml.token_type has {len(tp)} entries for {n} tokens")
        types = np.concatenate(tp[:n]).astype(np.int32)

    def special(key: str, default: int | None) -> int | None:
        if default is not None and default >= n:
            default = None
        v = _scalar(reader, f"tokenizer.ggml.{key}", None)
        if v is None or not (0 <= int(v) < n):
            return default
        return int(v)

    bos = special("bos_token_id", 1)
    eos = special("eos_token_id", 2)
    unk = special("unknown_token_id", 0)
    pad = special("padding_token_id", None)
    add_bos = bool(_scalar(reader, "tokenizer.ggml.add_bos_token", True))
    add_eos = bool(_scalar(reader, "tokenizer.ggml.add_eos_token", False))
    add_space_prefix = bool(_scalar(reader, "tokenizer.ggml.add_space_prefix", True))
    if add_bos and bos is None:
        raise UnsupportedModelError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
    if add_eos and eos is None:
        raise UnsupportedModelError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")

    name = _scalar(reader, "general.name", "")
    return Vocab(
        tokens=tokens, scores=scores, token_types=types,
        bos_id=-1 if bos is None else bos, eos_id=-1 if eos is None else eos,
        unk_id=-1 if unk is None else unk, pad_id=pad,
        add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix,
        model=model, name=str(name).lower(),
        eot_id=special("eot_token_id", None), eom_id=special("eom_token_id", None),
    )


def _byte_token_value(text: bytes, token_id: int) -> bytes:
    """The byte of a BYTE token ``<0xNN>``.

    Raises:
        UnsupportedModelError: the text is not of that form (a corrupt vocabulary).
    """
    if len(text) == 6 and text.startswith(b"<0x") and text.endswith(b">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    raise UnsupportedModelError(f"byte token {token_id} is {text!r}, not <0xNN>: the vocabulary is corrupt")


class Tokenizer:
    """llama.cpp's SPM tokenizer and detokenizer over a :class:`Vocab`.

    Token ids are Python ints in ``[0, n_vocab)``. Pieces and detokenized text
    are ``bytes`` (a token may hold part of a UTF-8 character).
    """

    def __init__(self, vocab: Vocab):
        """Index the vocabulary.

        Raises:
            UnsupportedModelError: two tokens share a text (llama.cpp refuses too).
        """
        self.vocab = vocab
        texts = [t.encode("utf-8", "surrogateescape") for t in vocab.tokens]
        self._texts = texts
        self._scores = vocab.scores.astype(np.float32).tolist()
        types = vocab.token_types.tolist()
        for i, t in enumerate(vocab.tokens):
            if t in _CONTROL_TEXTS and types[i] != TOKEN_TYPE_CONTROL:
                types[i] = TOKEN_TYPE_CONTROL  # llama.cpp ORs in CONTROL; CONTROL wins everywhere
        self._types = types
        to_id: dict[bytes, int] = {}
        for i, t in enumerate(texts):
            j = to_id.setdefault(t, i)
            if j != i:
                raise UnsupportedModelError(
                    f"duplicate token in vocabulary: {vocab.tokens[i]!r} has ids {j} and {i}")
        self._to_id = to_id

        # byte -> token (llama_vocab::byte_to_token: <0xNN>, else the one-byte token, else UNK).
        self._byte_tok = []
        for b in range(256):
            tid = to_id.get(b"<0x%02X>" % b)
            if tid is None:
                tid = to_id.get(bytes([b]), vocab.unk_id)
            self._byte_tok.append(tid)

        # Special tokens for the partition, longest text first (llama.cpp cache_special_tokens).
        cand = [i for i, t in enumerate(types)
                if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNKNOWN)]
        cand.sort(key=lambda i: -len(texts[i]))
        self._special = [(i, texts[i], types[i] == TOKEN_TYPE_USER_DEFINED) for i in cand]
        # Phi-3 marks its special tokens RSTRIP (whitespace after them is dropped), llama.cpp load().
        self._rstrip: set[int] = set()
        if "phi-3" in vocab.name or "phi3" in vocab.name:
            self._rstrip = set(cand)
            for t in (b"</s>",):
                if t in to_id:
                    self._rstrip.add(to_id[t])
            for t in (b"<unk>", b"<s>", b"<|endoftext|>"):
                self._rstrip.discard(to_id.get(t, -1))

        # token -> piece, with and without special (llama_vocab::impl::token_to_piece).
        pieces, pieces_sp = [], []
        for i, t in enumerate(texts):
            ty = types[i]
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                pieces.append(b"")
                pieces_sp.append(t)
                continue
            if ty == TOKEN_TYPE_USER_DEFINED:
                p = t
            elif ty == TOKEN_TYPE_NORMAL:
                p = t.replace(_ESCAPED_SPACE, _SPACE)
            elif ty == TOKEN_TYPE_BYTE:
                p = _byte_token_value(t, i)
            else:  # UNUSED, UNDEFINED and unknown types print nothing
                p = b""
            pieces.append(p)
            pieces_sp.append(p)
        self._pieces = pieces
        self._pieces_sp = pieces_sp

        eog = {i for i in (vocab.eos_id, vocab.eot_id, vocab.eom_id) if i is not None and i >= 0}
        eog.update(i for i, t in enumerate(vocab.tokens) if t in _EOG_TEXTS)
        self._eog = frozenset(eog)

    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        """Build the tokenizer of a ``gguf.GGUFReader``; raises UnsupportedModelError (see :func:`load_vocab`)."""
        return cls(load_vocab(reader))

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
        return len(self._texts)

    @property
    def bos_id(self) -> int:
        """Beginning-of-sequence id (-1 if none)."""
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int:
        """End-of-sequence id (-1 if none)."""
        return self.vocab.eos_id

    def is_eog(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation: EOS, EOT, EOM, or an end-of-turn text llama.cpp knows."""
        return token_id in self._eog

    # -- tokenize -----------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama.cpp ``llama_tokenize(text, add_special=add_bos, parse_special=special)``).

        Args:
            text: str (encoded as UTF-8) or raw bytes.
            add_bos: add BOS in front if the vocabulary's ``add_bos`` says so, and
                EOS at the end if its ``add_eos`` says so.
            special: parse CONTROL/UNKNOWN token texts (``<s>``, ``</s>``) in the
                text as those tokens; USER_DEFINED texts are always parsed.

        Returns:
            list[int] of token ids.

        Raises:
            TypeError: ``text`` is neither str nor bytes.
        """
        if isinstance(text, str):
            raw = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            raw = bytes(text)
        else:
            raise TypeError(f"tokenize() takes str or bytes, not {type(text).__name__}")
        v = self.vocab
        out: list[int] = []
        if add_bos and v.add_bos:
            out.append(v.bos_id)
        is_prev_special = True  # the first fragment gets the space prefix
        for frag in self._partition(raw, special):
            if isinstance(frag, int):
                out.append(frag)
                is_prev_special = True
                continue
            if v.add_space_prefix and is_prev_special:
                frag = _SPACE + frag
            self._spm(frag.replace(_SPACE, _ESCAPED_SPACE), out)
            is_prev_special = False
        if add_bos and v.add_eos:
            out.append(v.eos_id)
        return out

    def _partition(self, raw: bytes, special: bool) -> list:
        """Split ``raw`` into raw-text fragments (bytes) and special token ids (int).

        llama.cpp ``tokenizer_st_partition``: for each special token, longest text
        first, every raw fragment is cut at each occurrence of its text.
        """
        if not raw:
            return []
        frags: list = [raw]
        for tid, t, user_defined in self._special:
            if not (special or user_defined):
                continue
            if not any(isinstance(f, bytes) and t in f for f in frags):
                continue
            rstrip = tid in self._rstrip
            new: list = []
            for f in frags:
                if isinstance(f, int) or t not in f:
                    new.append(f)
                    continue
                pos = 0
                while True:
                    m = f.find(t, pos)
                    if m < 0:
                        break
                    if m > pos:
                        new.append(f[pos:m])
                    new.append(tid)
                    pos = m + len(t)
                    if rstrip:
                        while pos < len(f) and f[pos] in _C_ISSPACE:
                            pos += 1
                if pos < len(f):
                    new.append(f[pos:])
            frags = new
        return frags

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

    # -- detokenize ---------------------------------------------------------------

    def _check_id(self, token_id: int) -> None:
        """Raise InvalidTokenError unless ``0 <= token_id < n_vocab``."""
        if not (0 <= token_id < len(self._texts)):
            raise InvalidTokenError(f"token id {token_id} is out of range [0, {len(self._texts)})")

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token (llama.cpp ``llama_token_to_piece``, lstrip 0).

        NORMAL tokens with ``▁`` -> space, ``<0xNN>`` BYTE tokens -> that byte,
        USER_DEFINED -> their text, CONTROL/UNKNOWN -> b'' unless ``special``
        (then their text), UNUSED/undefined -> b''.

        Raises:
            InvalidTokenError: ``token_id`` is outside ``[0, n_vocab)``.
        """
        self._check_id(token_id)
        return (self._pieces_sp if special else self._pieces)[token_id]

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        """Concatenated pieces of ``ids``, as llama-cpp-python's ``Llama.detokenize``.

        Like llama-cpp-python, when ``ids[0]`` is BOS and the text starts with a
        space (the one SPM prepended), that space is removed.

        Raises:
            InvalidTokenError: an id is outside ``[0, n_vocab)``.
        """
        pieces = self._pieces_sp if special else self._pieces
        try:
            if ids and min(ids) < 0:
                raise IndexError
            out = b"".join([pieces[i] for i in ids])
        except (IndexError, TypeError):
            for i in ids:
                self._check_id(int(i))
            raise
        if ids and ids[0] == self.vocab.bos_id and out[:1] == _SPACE:
            out = out[1:]
        return out

    def detokenize_llama(self, ids: list[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama.cpp ``llama_detokenize`` (what ``common_detokenize`` prints) for SPM.

        The first token's piece loses one leading space when ``add_space_prefix``
        (unless a BOS was removed by ``remove_special``); with ``remove_special``
        a leading BOS / trailing EOS (when the vocabulary adds them) is dropped.

        Raises:
            InvalidTokenError: an id is outside ``[0, n_vocab)``.
        """
        v = self.vocab
        ids = list(ids)
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == v.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == v.eos_id:
            ids = ids[:-1]
        parts = []
        for k, i in enumerate(ids):
            p = self.token_to_piece(int(i), unparse_special)
            if k == 0 and remove_space and p[:1] == _SPACE:
                p = p[1:]
            parts.append(p)
        return b"".join(parts)
