"""What every tokenizer does with its vocabulary, whatever the merge algorithm: llama.cpp's
load-time token rules (control-looking tokens, end of generation, strip attributes), the
special-token partition, pieces and detokenization (``src/llama-vocab.cpp``: ``impl::load``,
``tokenizer_st_partition``, ``token_to_piece``, ``detokenize``).

:class:`BaseTokenizer` leaves two methods to the tokenizer types (:mod:`.spm`, :mod:`.bpe`):
how one raw-text fragment becomes ids, and what a NORMAL token prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import CooktopError, UnsupportedModelError
from .vocab import (
    TOKEN_TYPE_BYTE,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_USER_DEFINED,
    Vocab,
    load_vocab,
)

SPACE = b" "
_C_ISSPACE = b" \t\n\v\f\r"

# Texts llama.cpp's load() recognizes (its lists, verbatim), as bytes.
_EOG_TEXTS = frozenset(t.encode() for t in (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["))
_EOT_TEXTS = tuple(t.encode() for t in (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"))
# Special-id keys found by text when the file does not set them: key -> texts.
_BY_TEXT = {key: tuple(t.encode() for t in texts) for key, texts in {
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}.items()}
# gpt-oss: always rendered (llama.cpp sets them USER_DEFINED).
_ALWAYS_USER_DEFINED = frozenset((b"<|channel|>", b"<|message|>", b"<|start|>", b"<|constrain|>"))


class InvalidTokenError(CooktopError, ValueError):
    """A token id outside ``[0, n_vocab)`` was given to the detokenizer."""


def byte_token_value(text: bytes, token_id: int) -> bytes:
    """The byte of a BYTE token ``<0xNN>`` (llama.cpp ``token_to_byte``).

    Raises:
        UnsupportedModelError: the text is not of that form (a corrupt vocabulary).
    """
    if len(text) == 6 and text.startswith(b"<0x") and text.endswith(b">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    raise UnsupportedModelError(f"byte token {token_id} is {text!r}, not <0xNN>: the vocabulary is corrupt")


def clean_up_spaces(text: bytes) -> bytes:
    """llama.cpp ``detokenize``'s ``clean_spaces`` passes (``clean_up_tokenization_spaces``).

    Removes the space before ``?``, ``!``, ``.``, ``,``; the spaces around a lone
    apostrophe (`` ' `` -> ``'``); the space before ``'s``, ``'m``, ``'re``, ``'ve``.
    Ported pass by pass on a byte buffer, so corner cases come out as llama.cpp's.
    """
    buf = bytearray(text)
    total = len(buf)
    n, total = total, 1 if total else 0
    for i in range(1, n):  # first pass: " ?", " !", " .", " ,"
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    n, total = total, 1 if total else 0
    i = 1
    while i < n:  # second pass: " ' " -> "'"
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0
    for i in range(1, n):  # third pass: " 's", " 'm", " 're", " 've"
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, buf[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])


class BaseTokenizer:
    """A tokenizer: the vocabulary-wide half here; :mod:`.spm` and :mod:`.bpe` add the merge step.

    ``BaseTokenizer(vocab)`` (exported as :class:`cooktop.text.tokenizer.Tokenizer`) builds
    the subclass registered for ``vocab.model``: a subclass names its tokenizer model in
    ``model`` and implements :meth:`_encode` (one raw-text fragment to ids) and
    :meth:`_normal_pieces` (the bytes NORMAL tokens print).

    Token ids are Python ints in ``[0, n_vocab)``. Pieces and detokenized text are
    ``bytes`` (a token may hold part of a UTF-8 character).
    """

    #: The ``tokenizer.ggml.model`` a subclass implements.
    model: ClassVar[str] = ""
    _by_model: ClassVar[dict[str, type[BaseTokenizer]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.model:
            BaseTokenizer._by_model[cls.model] = cls

    def __new__(cls, vocab: Vocab) -> BaseTokenizer:
        """The tokenizer of ``vocab.model`` when called on the base class.

        Raises:
            UnsupportedModelError: no tokenizer for that model (named in the message).
        """
        if not cls.model:
            impl = BaseTokenizer._by_model.get(vocab.model)
            if impl is None:
                raise UnsupportedModelError(
                    f"tokenizer model {vocab.model!r} is not supported: cooktop has the SentencePiece ('llama') "
                    f"and byte-level BPE ('gpt2') tokenizers (tokenizer.ggml.model)")
            cls = impl
        return super().__new__(cls)

    @classmethod
    def from_gguf(cls, source: Any) -> BaseTokenizer:
        """The tokenizer of a GGUF file.

        Args:
            source: a path, a :class:`~cooktop.format.gguf.GGUFFile`, a ``gguf.GGUFReader``, or
                metadata read by :func:`~cooktop.format.gguf.read_raw_metadata`.
        Raises:
            UnsupportedModelError, GGUFError: see :func:`~cooktop.text.vocab.load_vocab`.
        """
        return cls(load_vocab(source))

    def __init__(self, vocab: Vocab):
        """Index the vocabulary and apply llama.cpp's load-time token attribute rules.

        Raises:
            UnsupportedModelError: two tokens share a text (llama.cpp refuses too), or a
                BYTE token is not ``<0xNN>``.
        """
        self.vocab = vocab
        texts = vocab.texts
        self._texts = texts
        n = len(texts)
        to_id = dict(zip(texts, range(n)))
        if len(to_id) != n:
            seen: dict[bytes, int] = {}
            for i, t in enumerate(texts):
                j = seen.setdefault(t, i)
                if j != i:
                    raise UnsupportedModelError(
                        f"duplicate token in vocabulary: {vocab.tokens[i]!r} has ids {j} and {i}")
        self._to_id = to_id

        # llama.cpp load(): special ids the file does not set are found by text, and every such
        # token, like every end-of-generation text, is made CONTROL whatever the file says. Where
        # several texts match, llama.cpp takes the first its hash map yields; cooktop takes the first
        # in llama.cpp's list order (<|eot_id|> before <|end_of_text|>, <|im_end|> before <|endoftext|>).
        types = np.array(vocab.token_types, dtype=np.int32)  # a copy: the rules below change it
        ids = dict(vocab.special_ids)
        if vocab.eot_id is not None:
            ids["eot"] = vocab.eot_id
        if vocab.eom_id is not None:
            ids["eom"] = vocab.eom_id
        forced = [to_id[t] for t in _EOG_TEXTS if t in to_id]
        for key, texts_of in (("eot", _EOT_TEXTS), *_BY_TEXT.items()):
            if key not in ids:
                found = [i for i in (to_id.get(t) for t in texts_of) if i is not None]
                if found:
                    ids[key] = found[0]
                    forced.append(found[0])
        for i in forced:
            types[i] = TOKEN_TYPE_CONTROL
        for t in _ALWAYS_USER_DEFINED:  # gpt-oss: always rendered
            if t in to_id:
                types[to_id[t]] = TOKEN_TYPE_USER_DEFINED
        self.special_ids: dict[str, int] = ids
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep", "eot", "eom") if k in ids}
        eog.update(to_id[t] for t in _EOG_TEXTS if t in to_id)
        if vocab.eos_id >= 0:
            eog.add(vocab.eos_id)
        eog_texts = {texts[i]: i for i in eog}
        has_call = b"<|call|>" in eog_texts or b"<|calls|>" in eog_texts
        if b"<|end|>" in eog_texts and has_call and (b"<|return|>" in eog_texts or b"<|flush|>" in eog_texts):
            i = eog_texts[b"<|end|>"]  # o200k_harmony / solar-open: <|end|> does not end generation
            eog.discard(i)
            types[i] = TOKEN_TYPE_USER_DEFINED
        if b"</s>" in eog_texts and (b"<|tool_response>" in eog_texts or b"<|plamo:eos|>" in eog_texts):
            i = eog_texts[b"</s>"]  # gemma4, plamo: </s> is a normal token
            eog.discard(i)
            types[i] = TOKEN_TYPE_NORMAL
        self._types: list[int] = types.tolist()  # a list: cooktop.text.exact and engine.grammar read it
        self._eog = frozenset(eog)

        # Special tokens for the partition, longest text first (llama.cpp cache_special_tokens).
        cand = np.flatnonzero((types == TOKEN_TYPE_CONTROL) | (types == TOKEN_TYPE_USER_DEFINED)
                              | (types == TOKEN_TYPE_UNKNOWN)).tolist()
        cand.sort(key=lambda i: -len(texts[i]))
        self._special = [(i, texts[i], bool(types[i] == TOKEN_TYPE_USER_DEFINED)) for i in cand]
        # Per-model strip attributes (llama.cpp load(), "set attributes by model/tokenizer/architecture name").
        self._rstrip: set[int] = set()
        self._lstrip: set[int] = set()
        if any(s in vocab.pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                s in vocab.arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            self._lstrip = {to_id[b"<mask>"]} if b"<mask>" in to_id else set()
        elif "phi-3" in vocab.name or "phi3" in vocab.name:
            self._rstrip = set(cand)
            if b"</s>" in to_id:
                self._rstrip.add(to_id[b"</s>"])
            for t in (b"<unk>", b"<s>", b"<|endoftext|>"):
                self._rstrip.discard(to_id.get(t, -1))
        elif "modern-bert" in vocab.name and b"[MASK]" in to_id:
            self._lstrip = {to_id[b"[MASK]"]}

        # byte -> token (llama_vocab::byte_to_token: <0xNN>, else the one-byte token, else UNK).
        self._byte_tok = []
        for b in range(256):
            tid = to_id.get(b"<0x%02X>" % b)
            if tid is None:
                tid = to_id.get(bytes([b]), vocab.unk_id)
            self._byte_tok.append(tid)

        # token -> piece, with and without special (llama_vocab::impl::token_to_piece).
        is_normal = types == TOKEN_TYPE_NORMAL
        if is_normal.all():
            pieces = self._normal_pieces(range(len(texts)))
        else:
            pieces = [b""] * len(texts)  # UNUSED, UNDEFINED and unknown types print nothing
            normal = np.flatnonzero(is_normal).tolist()
            for i, p in zip(normal, self._normal_pieces(normal)):
                pieces[i] = p
        pieces_sp = list(pieces)
        for i in np.flatnonzero(~is_normal).tolist():
            ty = types[i]
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                pieces_sp[i] = texts[i]
            elif ty == TOKEN_TYPE_USER_DEFINED:
                pieces[i] = pieces_sp[i] = texts[i]
            elif ty == TOKEN_TYPE_BYTE:
                pieces[i] = pieces_sp[i] = byte_token_value(texts[i], i)
        self._pieces = pieces
        self._pieces_sp = pieces_sp

    # -- to be provided by the tokenizer type ---------------------------------------

    def _normal_pieces(self, ids: Sequence[int]) -> list[bytes]:
        """The bytes each NORMAL token of ``ids`` prints."""
        raise NotImplementedError

    def _encode(self, fragment: bytes, out: list[int], after_special: bool) -> None:
        """Append the ids of one raw-text fragment (``after_special``: first, or after a special token)."""
        raise NotImplementedError

    # -- vocabulary ---------------------------------------------------------------------

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

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation (llama.cpp ``special_eog_ids``)."""
        return self._eog

    def is_eog(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation: EOS, EOT, EOM, FIM pad/repo/file-separator, or an
        end-of-turn text llama.cpp knows (``<|eot_id|>``, ``<|im_end|>``, ``<end_of_turn>``, ``<|end|>``...)."""
        return token_id in self._eog

    def token_type(self, token_id: int) -> int:
        """The token's type after llama.cpp's load-time rules (e.g. ``<|im_end|>`` is CONTROL)."""
        self._check_id(token_id)
        return self._types[token_id]

    @property
    def token_types(self) -> list[int]:
        """Every token's type after llama.cpp's load-time rules [n_vocab] (a copy)."""
        return list(self._types)

    # -- tokenize -----------------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama.cpp ``llama_tokenize(text, add_special=add_bos, parse_special=special)``).

        Args:
            text: str (encoded as UTF-8) or raw bytes.
            add_bos: add BOS in front if the vocabulary's ``add_bos`` says so, and
                EOS at the end if its ``add_eos`` says so.
            special: parse CONTROL/UNKNOWN token texts (``<s>``, ``<|im_end|>``) in the
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
        after_special = True
        for frag in self._partition(raw, special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                self._encode(frag, out, after_special)
                after_special = False
        if add_bos and v.add_eos:
            out.append(v.eos_id)
        return out

    def _partition(self, raw: bytes, special: bool) -> list:
        """Split ``raw`` into raw-text fragments (bytes) and special token ids (int).

        llama.cpp ``tokenizer_st_partition``: for each special token, longest text
        first, every raw fragment is cut at each occurrence of its text; a token with
        the RSTRIP (LSTRIP) attribute swallows the whitespace after (before) it.
        """
        if not raw:
            return []
        frags: list = [raw]
        for tid, t, user_defined in self._special:
            if not (special or user_defined):
                continue
            if not any(isinstance(f, bytes) and t in f for f in frags):
                continue
            rstrip, lstrip = tid in self._rstrip, tid in self._lstrip
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
                    left = f[pos:m]
                    if lstrip:
                        left = left.rstrip(_C_ISSPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    pos = m + len(t)
                    if rstrip and pos < len(f):
                        while pos < len(f) and f[pos] in _C_ISSPACE:
                            pos += 1
                if pos < len(f):
                    new.append(f[pos:])
            frags = new
        return frags

    # -- detokenize ---------------------------------------------------------------------

    def _check_id(self, token_id: int) -> None:
        """Raise InvalidTokenError unless ``0 <= token_id < n_vocab``."""
        if not (0 <= token_id < len(self._texts)):
            raise InvalidTokenError(f"token id {token_id} is out of range [0, {len(self._texts)})")

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token (llama.cpp ``llama_token_to_piece``, lstrip 0).

        NORMAL tokens print their text (SPM: ``▁`` -> space; BPE: the byte-to-unicode
        mapping undone), ``<0xNN>`` BYTE tokens that byte, USER_DEFINED their text,
        CONTROL/UNKNOWN nothing unless ``special`` (then their text), UNUSED/undefined nothing.

        Raises:
            InvalidTokenError: ``token_id`` is outside ``[0, n_vocab)``.
        """
        self._check_id(token_id)
        return (self._pieces_sp if special else self._pieces)[token_id]

    def _join(self, ids: list[int], special: bool) -> bytes:
        pieces = self._pieces_sp if special else self._pieces
        try:
            if ids and min(ids) < 0:
                raise IndexError
            return b"".join([pieces[i] for i in ids])
        except (IndexError, TypeError):
            for i in ids:
                self._check_id(int(i))
            raise

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        """Concatenated pieces of ``ids``, as llama-cpp-python's ``Llama.detokenize``.

        Like llama-cpp-python, when ``ids[0]`` is BOS and the text starts with a
        space (the one SPM prepended), that space is removed.

        Raises:
            InvalidTokenError: an id is outside ``[0, n_vocab)``.
        """
        out = self._join(ids, special)
        if ids and ids[0] == self.vocab.bos_id and out[:1] == SPACE:
            out = out[1:]
        return out

    def detokenize_llama(self, ids: list[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama.cpp ``llama_detokenize`` (what ``common_detokenize`` prints).

        The first token's piece loses one leading space when ``add_space_prefix``
        (unless a BOS was removed by ``remove_special``); with ``remove_special`` a
        leading BOS / trailing EOS (when the vocabulary adds them) is dropped; where the
        vocabulary's ``clean_spaces`` says so, :func:`clean_up_spaces` runs last.

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
        out = self._join(ids, unparse_special)
        if remove_space and out[:1] == SPACE and self.token_to_piece(int(ids[0]), unparse_special)[:1] == SPACE:
            out = out[1:]
        return clean_up_spaces(out) if v.clean_spaces else out
