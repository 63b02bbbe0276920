"""The Python API: :class:`Llama` with llama-cpp-python's names and semantics.

Modules: ``llama`` (the class: loading, tokens, state), ``completion``,
``chat``, ``embedding`` (its mixins), ``grammar`` (``LlamaGrammar``,
``response_format``), ``options`` (llama-cpp-python's constructor arguments),
``logprobs``, ``types`` (response shapes), ``multimodal`` (the chat handlers that bring an mmproj:
``MTMDChatHandler``, ``Llava15ChatHandler``, ``Gemma3ChatHandler``).
"""

from __future__ import annotations

from .grammar import LlamaGrammar
from .llama import Llama, LlamaState
from .multimodal import Gemma3ChatHandler, Llava15ChatHandler, MTMDChatHandler

__all__ = ["Gemma3ChatHandler", "Llama", "LlamaGrammar", "LlamaState", "Llava15ChatHandler", "MTMDChatHandler"]
