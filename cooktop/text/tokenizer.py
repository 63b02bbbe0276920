"""The tokenizer of a GGUF vocabulary: SentencePiece or byte-level BPE, with llama.cpp's semantics.

:meth:`Tokenizer.from_gguf` reads the vocabulary (:func:`~cooktop.text.vocab.load_vocab`) and
returns the tokenizer its ``tokenizer.ggml.model`` names:

* ``llama``: :class:`~cooktop.text.spm.SpmTokenizer` (Llama 1/2, Mistral v0.1, TinyLlama, ...);
* ``gpt2``: :class:`~cooktop.text.bpe.BpeTokenizer` (GPT-2, Llama 3, Qwen2/3, SmolLM, StarCoder, ...),
  with the pre-tokenizer ``tokenizer.ggml.pre`` names (:mod:`~cooktop.text.pretokenize`).

Both share :class:`~cooktop.text.base.BaseTokenizer`: ``tokenize(text, add_bos, special)``,
``detokenize`` (llama-cpp-python's), ``detokenize_llama`` (llama.cpp's ``llama_detokenize``),
``token_to_piece``, ``is_eog``.
"""

from __future__ import annotations

from .base import BaseTokenizer, InvalidTokenError
from .bpe import BpeTokenizer
from .spm import SpmTokenizer
from .vocab import (
    TOKEN_TYPE_BYTE,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNDEFINED,
    TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    Vocab,
    load_vocab,
)

#: The tokenizer of a vocabulary: ``Tokenizer(vocab)`` and ``Tokenizer.from_gguf(path)`` build the
#: :class:`SpmTokenizer` or :class:`BpeTokenizer` its ``tokenizer.ggml.model`` names.
Tokenizer = BaseTokenizer

__all__ = [
    "Tokenizer", "BpeTokenizer", "SpmTokenizer", "BaseTokenizer", "Vocab", "load_vocab", "InvalidTokenError",
    "TOKEN_TYPE_UNDEFINED", "TOKEN_TYPE_NORMAL", "TOKEN_TYPE_UNKNOWN", "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED", "TOKEN_TYPE_UNUSED", "TOKEN_TYPE_BYTE",
]
