"""Model architectures, one module each (``llama.py`` is the llama architecture).

``ARCHITECTURES[general.architecture]`` is the :class:`~.descriptor.Architecture` descriptor:
hyper-parameters, tensors, rope mode, block and head. The modules share ``base.py`` (tensor
specs, weights, the KV view), ``skeleton.py`` (llama's tensor list, with each architecture's
additions) and ``builders.py`` (norm, attention and FFN, as llama.cpp's graph builders), so each
holds only what differs. A new architecture is a new module here plus one entry below (and,
when its block needs one, a new backend op).
"""

from __future__ import annotations

from ...errors import UnsupportedModelError
from .descriptor import Architecture
from .gemma3 import GEMMA3
from .llama import LLAMA
from .phi3 import PHI3
from .qwen import QWEN2, QWEN3

#: general.architecture -> descriptor.
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA, GEMMA3, PHI3, QWEN2, QWEN3)}


def architecture(name: str, path: str = "") -> Architecture:
    """The descriptor of ``general.architecture`` ``name``.

    Raises:
        UnsupportedModelError: ``name`` is not in :data:`ARCHITECTURES` (the message lists them).
    """
    arch = ARCHITECTURES.get(name)
    if arch is None:
        where = f"{path}: " if path else ""
        raise UnsupportedModelError(f"{where}unsupported architecture {name!r}; cooktop runs "
                                    f"{', '.join(sorted(ARCHITECTURES))} (general.architecture)")
    return arch
