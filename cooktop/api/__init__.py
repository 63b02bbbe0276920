"""The Python API: :class:`Llama` with llama-cpp-python's names and semantics.

Modules: ``llama`` (the class: loading, tokens, state), ``completion``,
``chat``, ``embedding`` (its mixins), ``grammar`` (``LlamaGrammar``,
``response_format``), ``options`` (llama-cpp-python's constructor arguments),
``logprobs``, ``types`` (response shapes).
"""

from __future__ import annotations

from .grammar import LlamaGrammar
from .llama import Llama, LlamaState

__all__ = ["Llama", "LlamaGrammar", "LlamaState"]
