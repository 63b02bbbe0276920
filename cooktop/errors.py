"""Typed errors of cooktop.

Every error a user can cause (bad file, bad flag, too long a prompt, a device
out of memory) is a :class:`CooktopError` with a one-line message that says
what was wrong and what to do. The CLI prints ``error: <message>`` and exits
with code 1; the server maps the types to HTTP status codes. Nothing else is
caught: an exception that is not a ``CooktopError`` is a bug.

The errors the Python API raises where llama-cpp-python raises ``ValueError``
(a file that does not load, a prompt over the context, a template or grammar
that fails, a bad argument) are ``ValueError`` s too, so code written for it
(``except ValueError``) catches them; the typed hierarchy stays.
"""

from __future__ import annotations


class CooktopError(Exception):
    """Base of every user-facing error; ``str(e)`` is a complete one-line message."""


class GGUFError(CooktopError, ValueError):
    """The model file is not a readable GGUF (foreign, truncated or corrupt)."""


class UnsupportedModelError(CooktopError, ValueError):
    """A readable GGUF that cooktop cannot run (architecture, tensor type, missing key)."""


class ContextOverflowError(CooktopError, ValueError):
    """A prompt (or an eval) does not fit in the context window ``n_ctx``.

    Attributes:
        n_prompt_tokens: the tokens that were to be in the context (0: not known).
        n_ctx: the context they did not fit in, in tokens (0: not known); llama-server's
            ``exceed_context_size_error`` carries both.
    """

    def __init__(self, message: str, n_prompt_tokens: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_prompt_tokens, self.n_ctx = int(n_prompt_tokens), int(n_ctx)


class DeviceError(CooktopError):
    """A device selector names no usable device, a device failed, or a device was misused
    (a tensor of another device or of a released buffer, a weight written or read back)."""


class DeviceOutOfMemoryError(DeviceError, ValueError):
    """An allocation did not fit in a device's memory."""


class ShapeError(DeviceError, ValueError):
    """A device op (or a write) was given tensors whose shapes or element counts do not fit.

    Raised by the checks of :class:`cooktop.backends.base.Device` before any backend
    runs, so every backend raises it with the same message; it is a ``ValueError`` too.
    """


class UnsupportedOpError(CooktopError):
    """A backend was asked for an (op, GGML type) pair it cannot run, or an op was given a
    tensor of the wrong type (e.g. float positions) or an option it lacks (a rope mode)."""


class ChatTemplateError(CooktopError, ValueError):
    """A chat template failed to compile or refused a conversation (it raised, or hit an undefined or unsafe value)."""


class ClusterError(CooktopError):
    """A Ray cluster cannot be used: Ray is missing, the cluster is unreachable, a node
    name is unknown, or a node (or the actor holding a segment there) died or stopped answering."""


class RecurrentStateError(CooktopError, ValueError):
    """A recurrent model's state was asked to go back to a position it has no checkpoint of (a
    recurrent layer keeps one state per sequence, not one per position: ``cooktop.model.recurrent``),
    or asked for what such a model cannot do (a context shift)."""


class SlidingWindowError(CooktopError, ValueError):
    """A sequence was asked to go back to a position whose sliding window its sliding-window layers
    no longer keep (they hold only their window: ``cooktop.model.swa``); evaluate it again from 0."""


class ImageError(CooktopError, ValueError):
    """An image cannot be used: not an image of a supported format, corrupt or truncated, too
    large (a decompression bomb), or given to a model without a vision projector (mmproj)."""
