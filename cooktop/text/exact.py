"""Tokenize a text fragment to ids whose bytes are exactly the fragment.

A SentencePiece vocabulary with ``add_space_prefix`` puts a space in front of
every text it tokenizes (llama.cpp ``llama_vocab::impl::tokenize``). Where a
fragment continues earlier text (a fill-in-the-middle suffix, the bytes a
grammar forces), that space is wrong. :class:`ExactTokenizer` takes it off
again: the first token is re-spelled without its space (as one vocabulary
token when there is one, else as byte tokens). llama-cpp-python does the same
with its ``"☺"`` prefix trick for infill suffixes.
"""

from __future__ import annotations

from .tokenizer import TOKEN_TYPE_BYTE, TOKEN_TYPE_NORMAL, Tokenizer


class ExactTokenizer:
    """Exact-bytes tokenization over a :class:`Tokenizer` (the piece table is built once).

    Args:
        tokenizer: the model's tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        types = list(getattr(tokenizer, "_types", None) or tokenizer.vocab.token_types.tolist())
        self._piece_id: dict[bytes, int] = {}
        for i in range(tokenizer.n_vocab):
            if types[i] in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_BYTE):
                p = tokenizer.token_to_piece(i)
                if p:
                    self._piece_id.setdefault(p, i)
        self._space_prefix = bool(getattr(getattr(tokenizer, "vocab", None), "add_space_prefix", False))

    def tokenize(self, text: bytes | str, special: bool = False) -> list[int]:
        """Ids (no BOS) whose pieces joined are ``text``'s bytes.

        Args:
            text: UTF-8 bytes or str.
            special: parse special-token texts.
        Returns:
            list[int]; ``[]`` for an empty text.
        """
        if isinstance(text, str):
            text = text.encode("utf-8")
        ids = self.tokenizer.tokenize(text, add_bos=False, special=special)
        if not (self._space_prefix and ids):
            return ids
        first = self.tokenizer.token_to_piece(ids[0])
        if not first.startswith(b" "):
            return ids
        rest = first[1:]
        if not rest:
            return ids[1:]
        if rest in self._piece_id:
            return [self._piece_id[rest]] + ids[1:]
        out = []
        for b in rest:
            tid = self._piece_id.get(bytes([b]))
            if tid is None:
                return ids  # no token for this byte: keep the spelling with the space
            out.append(tid)
        return out + ids[1:]
