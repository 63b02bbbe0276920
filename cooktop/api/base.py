"""What the :class:`~cooktop.api.llama.Llama` mixins may use of the ``Llama`` they are mixed into.

The completion, chat, embedding and batch mixins (``api/completion.py``, ``api/chat.py``,
``api/embedding.py``, ``api/batch.py``) read attributes that ``Llama.__init__`` sets and call
methods that ``Llama`` (or another mixin) defines. :class:`LlamaBase` declares them for the type
checker only: every declaration is under ``TYPE_CHECKING``, so at run time the class is empty and
``Llama``'s method resolution order is what it was without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine.generate import Engine
    from ..engine.sampling import Sampler
    from ..text.chat_template import TemplateChoice
    from ..text.tokenizer import Tokenizer


class HasMetadata(Protocol):
    """What the mixins read of ``Llama._gf`` (a GGUFFile, or the metadata-only file of ``vocab_only``)."""

    @property
    def metadata(self) -> dict[str, Any]: ...


class LlamaBase:
    """Declarations (no behaviour) shared by the ``Llama`` mixins; see the module doc."""

    if TYPE_CHECKING:
        # set by Llama.__init__ (api/llama.py)
        model_path: str
        seed: int
        pooling_type: int
        embedding_enabled: bool
        last_n_tokens_size: int
        spm_infill: bool
        _n_keep: int | None
        chat_format: str | None
        chat_handler: Any  # a multimodal projector (api/multimodal.py) or None
        _gf: HasMetadata
        _chat: TemplateChoice | None
        # per-thread sequence chooser (a property of Llama)
        _active_seq: Any

        @property
        def _engine(self) -> Engine: ...

        @property
        def _tokenizer(self) -> Tokenizer: ...

        def _speculation(self) -> Any: ...  # the thread's Speculation or None (draft_model)
        def n_ctx(self) -> int: ...
        def n_vocab(self) -> int: ...
        def token_bos(self) -> int: ...
        def token_prefix(self) -> int: ...
        def token_suffix(self) -> int: ...
        def token_middle(self) -> int: ...
        def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]: ...
        def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None,
                       special: bool = False) -> bytes: ...

        # defined by CompletionMixin (api/completion.py), used by the chat and batch mixins
        def _sampler(self, *args: Any, **kwargs: Any) -> Sampler: ...
        def create_completion(self, *args: Any, **kwargs: Any) -> Any: ...
