"""A vocabulary as a GGUF file stores it: token texts (bytes), types, scores, merges, special ids
and flags, read fast and with llama.cpp's rules (``src/llama-vocab.cpp`` ``llama_vocab::impl::load``).

Token texts are bytes, as llama.cpp keeps them (``std::string``): a vocabulary whose token
text is not valid UTF-8 loads, tokenizes and detokenizes by those bytes. What a tokenizer
does with a vocabulary whatever its type (special tokens, end of generation, pieces) is in
:mod:`.base`; the merge algorithms in :mod:`.spm` and :mod:`.bpe`; :mod:`.tokenizer` picks one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import UnsupportedModelError
from ..format.gguf import GGUFValueType, RawValue, read_raw_metadata
from .pretokenize import pre_type

log = logging.getLogger("cooktop")

# llama.cpp token types (llama.h, enum llama_token_type), stored in tokenizer.ggml.token_type.
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# GGUF keys of the special ids (llama.cpp LLM_KV_TOKENIZER_*_ID); deprecated aliases last.
_ID_KEYS = {
    "bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
    "unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id", "mask": "mask_token_id",
    "fim_pre": "fim_pre_token_id", "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
    "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id", "fim_sep": "fim_sep_token_id",
}
_ID_ALIASES = {"fim_pre": "prefix_token_id", "fim_suf": "suffix_token_id", "fim_mid": "middle_token_id"}
_KEYS = frozenset(
    [f"tokenizer.ggml.{k}" for k in (
        "model", "pre", "tokens", "scores", "token_type", "merges", "add_bos_token", "add_eos_token",
        "add_space_prefix", *_ID_KEYS.values(), *_ID_ALIASES.values())]
    + ["general.name", "general.architecture"])


@dataclasses.dataclass(frozen=True)
class Vocab:
    """A vocabulary as read from a GGUF file (``tokenizer.ggml.*`` keys).

    Attributes:
        tokens: token texts [n_vocab] as str, for display and lookups by text; a text
            that is not valid UTF-8 is decoded with ``surrogateescape``, so it maps back
            to its bytes exactly. :attr:`texts` holds the bytes the tokenizer uses.
        scores: float32 [n_vocab], SentencePiece log-probabilities (the SPM merge
            priority, higher first); zeros when the file has none (BPE).
        token_types: int32 [n_vocab], llama.cpp token types as stored (1 NORMAL,
            2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE); all NORMAL when absent.
        bos_id, eos_id, unk_id: special ids, -1 when none (defaults: SPM 1, 2, 0; BPE 11, 11, none).
        pad_id: padding id, or None.
        add_bos, add_eos: whether ``tokenize(add_bos=True)`` adds BOS / EOS.
        add_space_prefix: SPM prepends a space to a text fragment; in ``detokenize_llama``
            one leading space is removed.
        model: ``tokenizer.ggml.model`` (``llama`` = SPM, ``gpt2`` = byte-level BPE).
        name: ``general.name`` in lower case (per-model token attributes key on it).
        eot_id, eom_id: end-of-turn / end-of-message ids, or None.
        pre: ``tokenizer.ggml.pre`` (BPE pre-tokenizer; ``default`` when absent).
        merges: BPE merges ``b"left right"`` in rank order, or None (SPM).
        clean_spaces, ignore_merges: llama.cpp's per-``pre`` BPE settings.
        special_ids: the other special ids the file sets (``sep``, ``mask``, ``fim_pre``,
            ``fim_suf``, ``fim_mid``, ``fim_pad``, ``fim_rep``, ``fim_sep``); the tokenizer
            adds those llama.cpp finds by text (:attr:`BaseTokenizer.special_ids`).
        arch: ``general.architecture``.
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
    pre: str = ""
    merges: list[bytes] | None = None
    clean_spaces: bool = False
    ignore_merges: bool = False
    special_ids: Mapping[str, int] = dataclasses.field(default_factory=dict)
    arch: str = ""

    @cached_property
    def texts(self) -> list[bytes]:
        """Token texts as bytes [n_vocab] (what the file stores; what tokenization compares)."""
        return [t.encode("utf-8", "surrogateescape") for t in self.tokens]

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)


def _source_path(source: Any) -> str:
    """The file behind ``source``: a path, a :class:`~cooktop.format.gguf.GGUFFile`, or a ``gguf.GGUFReader``."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(getattr(source, "path", None), str):  # GGUFFile
        return source.path
    filename = getattr(getattr(source, "data", None), "filename", None)  # GGUFReader's np.memmap
    if isinstance(filename, (str, os.PathLike)):
        return os.fspath(filename)
    raise TypeError(f"expected a GGUF path, GGUFFile or gguf.GGUFReader, not {type(source).__name__}")


def _text(md: Mapping[str, RawValue], key: str, default: str | None) -> str | None:
    """A string value decoded for display (invalid UTF-8 replaced), or ``default``."""
    v = md.get(key)
    if v is None:
        return default
    if v.type != GGUFValueType.STRING:
        raise UnsupportedModelError(f"GGUF key {key} is not a string")
    return v.value.decode("utf-8", "replace")


def _scalar(md: Mapping[str, RawValue], key: str, kind: type) -> Any:
    """An int or bool value, or None when absent."""
    v = md.get(key)
    if v is None:
        return None
    if v.sub_type is not None or isinstance(v.value, (bytes, float)):
        raise UnsupportedModelError(f"GGUF key {key} is not {'a bool' if kind is bool else 'an integer'}")
    return kind(v.value)


def _array(md: Mapping[str, RawValue], key: str, n: int | None, *types: GGUFValueType) -> Any:
    """An array value of one of ``types`` with at least ``n`` entries, or None when absent."""
    v = md.get(key)
    if v is None:
        return None
    if v.type != GGUFValueType.ARRAY or v.sub_type not in types:
        raise UnsupportedModelError(f"GGUF key {key} is not an array of {' or '.join(t.name for t in types)}")
    if n is not None and len(v.value) < n:
        raise UnsupportedModelError(f"{key} has {len(v.value)} entries for {n} tokens")
    return v.value


def load_vocab(source: Any) -> Vocab:
    """Read the vocabulary of a GGUF file with llama.cpp's rules (``llama_vocab::impl::load``).

    One pass over the file's metadata, strings kept as bytes (~0.2 s for a 150k-token
    vocabulary; see :func:`cooktop.format.gguf.read_raw_metadata`).

    Args:
        source: a path, a :class:`~cooktop.format.gguf.GGUFFile`, a ``gguf.GGUFReader``, or
            metadata already read by :func:`~cooktop.format.gguf.read_raw_metadata`.
    Returns:
        The :class:`Vocab`. Special ids absent from the file take llama.cpp's defaults for
        the tokenizer model; an id out of range keeps the default. ``add_bos_token``
        defaults to true for SPM and per pre-tokenizer for BPE (Llama 3, Tekken: true).
    Raises:
        UnsupportedModelError: no ``tokenizer.ggml.model`` / ``tokens`` key, a tokenizer
            model other than ``llama`` and ``gpt2`` or an unknown ``tokenizer.ggml.pre``
            (each named in the message), a BPE vocabulary without merges, scores/types
            shorter than the token list or of the wrong type, or ``add_bos_token`` /
            ``add_eos_token`` true without a valid id.
        GGUFError: the file is not a readable GGUF.
    """
    md = source if isinstance(source, Mapping) else read_raw_metadata(_source_path(source), _KEYS)
    model = _text(md, "tokenizer.ggml.model", None)
    if model is None:
        raise UnsupportedModelError(
            "GGUF has no tokenizer.ggml.model key: the file carries no vocabulary cooktop can use")
    if model not in ("llama", "gpt2"):
        raise UnsupportedModelError(
            f"tokenizer model {model!r} is not supported: cooktop has the SentencePiece ('llama') and "
            f"byte-level BPE ('gpt2') tokenizers (tokenizer.ggml.model)")
    raw = _array(md, "tokenizer.ggml.tokens", None, GGUFValueType.STRING)
    if raw is None:
        raise UnsupportedModelError("GGUF has no tokenizer.ggml.tokens key (the token list)")
    n = len(raw)
    if n == 0:
        raise UnsupportedModelError("tokenizer.ggml.tokens is empty")
    texts = [b if b else b"[EMPTY_%d]" % i for i, b in enumerate(raw)]  # llama.cpp renames empty tokens
    tokens = decode_all(texts)

    sc = _array(md, "tokenizer.ggml.scores", n, GGUFValueType.FLOAT32, GGUFValueType.INT32)
    scores = np.zeros(n, np.float32) if sc is None else sc[:n].astype(np.float32)
    tp = _array(md, "tokenizer.ggml.token_type", n, GGUFValueType.INT32)
    types = np.full(n, TOKEN_TYPE_NORMAL, np.int32) if tp is None else tp[:n].astype(np.int32)

    pre, merges, clean_spaces, ignore_merges = "", None, False, False
    if model == "llama":
        defaults = {"bos": 1, "eos": 2, "unk": 0}
        add_bos, add_space_prefix = True, True
    else:
        defaults = {"bos": 11, "eos": 11}
        merges = _array(md, "tokenizer.ggml.merges", None, GGUFValueType.STRING)
        if merges is None:
            raise UnsupportedModelError("GGUF has no tokenizer.ggml.merges key: a 'gpt2' (BPE) vocabulary needs them")
        pre = _text(md, "tokenizer.ggml.pre", None) or ""
        if not pre:
            log.warning("missing tokenizer.ggml.pre: using the 'default' pre-tokenizer, as llama.cpp does; "
                        "tokenization may not match the model's (re-convert the model)")
            pre = "default"
        pt = pre_type(pre)
        clean_spaces, ignore_merges, add_bos, add_space_prefix = pt.clean_spaces, pt.ignore_merges, pt.add_bos, False
        if pt.no_bos:
            defaults.pop("bos")
    sp = _scalar(md, "tokenizer.ggml.add_space_prefix", bool)
    add_space_prefix = add_space_prefix if sp is None else sp

    ids: dict[str, int] = {}
    for name, key in _ID_KEYS.items():
        default = defaults.get(name)
        if default is not None and default >= n:
            default = None
        v = _scalar(md, f"tokenizer.ggml.{key}", int)
        if v is None and name in _ID_ALIASES:
            v = _scalar(md, f"tokenizer.ggml.{_ID_ALIASES[name]}", int)
        if v is not None and 0 <= v < n:
            ids[name] = v
        elif default is not None:
            ids[name] = default
    v = _scalar(md, "tokenizer.ggml.add_bos_token", bool)
    add_bos = add_bos if v is None else v
    v = _scalar(md, "tokenizer.ggml.add_eos_token", bool)
    add_eos = False if v is None else v
    if add_bos and "bos" not in ids:
        raise UnsupportedModelError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
    if add_eos and "eos" not in ids:
        raise UnsupportedModelError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")

    vocab = Vocab(
        tokens=tokens, scores=scores, token_types=types,
        bos_id=ids.pop("bos", -1), eos_id=ids.pop("eos", -1), unk_id=ids.pop("unk", -1), pad_id=ids.pop("pad", None),
        add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix, model=model,
        name=(_text(md, "general.name", "") or "").lower(), eot_id=ids.pop("eot", None), eom_id=ids.pop("eom", None),
        pre=pre, merges=merges, clean_spaces=clean_spaces, ignore_merges=ignore_merges, special_ids=ids,
        arch=_text(md, "general.architecture", "") or "",
    )
    vocab.__dict__["texts"] = texts  # the bytes as read (cached_property slot): no re-encoding
    return vocab


def decode_all(texts: list[bytes]) -> list[str]:
    """``[t.decode("utf-8", "surrogateescape") for t in texts]``, in one decode when no text holds a NUL."""
    out = b"\0".join(texts).decode("utf-8", "surrogateescape").split("\0")
    if len(out) != len(texts):  # a text with a NUL byte, or none at all
        out = [t.decode("utf-8", "surrogateescape") for t in texts]
    return out
