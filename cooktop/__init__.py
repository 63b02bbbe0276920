"""cooktop: one GGUF model file, any stove.

Public API (llama-cpp-python names)::

    from cooktop import Llama
    llm = Llama(model_path="model.gguf", n_ctx=512, n_gpu_layers=-1, device="opencl")
    llm.create_completion("Once upon a time", max_tokens=32)

Images (an mmproj, llama-cpp-python's chat handler): ``Llama(..., chat_handler=MTMDChatHandler(clip_model_path=
"mmproj.gguf"))`` (or ``Llava15ChatHandler`` / ``Gemma3ChatHandler``), then ``image_url`` parts in
``create_chat_completion`` messages.

``load()`` returns the lower-level :class:`cooktop.engine.Engine`;
``list_devices()`` probes every backend family.
"""

from __future__ import annotations

from .api import Gemma3ChatHandler, Llama, LlamaGrammar, Llava15ChatHandler, MTMDChatHandler
from .errors import CooktopError
from .version import __version__


def load(model_path, **kwargs):
    """Open a GGUF and place it on devices; see :func:`cooktop.engine.load`."""
    from .engine.generate import load as _load
    return _load(model_path, **kwargs)


def list_devices(refresh: bool = False):
    """Probe every backend family: ``{family: ProbeResult}`` (never raises)."""
    from .backends.registry import probe_all
    return probe_all(refresh)


__all__ = ["Llama", "LlamaGrammar", "MTMDChatHandler", "Llava15ChatHandler", "Gemma3ChatHandler", "CooktopError",
           "load", "list_devices", "__version__"]
