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
from .gemma4 import GEMMA4
from .glm4 import GLM4
from .glm4moe import GLM4MOE
from .gpt_oss import GPT_OSS
from .lfm2 import LFM2
from .llama import LLAMA
from .mamba2 import GRANITEHYBRID, MAMBA2
from .mistral3 import MISTRAL3
from .phi3 import PHI3
from .qwen import QWEN2, QWEN3
from .qwen3next import QWEN3NEXT
from .qwen35 import QWEN35, QWEN35MOE
from .qwen_moe import OLMOE, QWEN2MOE, QWEN3MOE
from .smollm3 import SMOLLM3

#: general.architecture -> descriptor.
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA, GEMMA3, PHI3, QWEN2, QWEN3, QWEN3MOE, QWEN2MOE,
                                                               OLMOE, GPT_OSS, LFM2, QWEN35,
                                                               QWEN35MOE, QWEN3NEXT, GRANITEHYBRID, MAMBA2,
                                                               SMOLLM3, MISTRAL3, GLM4, GLM4MOE, GEMMA4)}

#: Mixture-of-experts architectures llama.cpp runs and cooktop does not, and what they need
#: (refused by name rather than as an unknown architecture).
UNSUPPORTED_MOE = {
    "deepseek2": "DeepSeek-V2/V3 multi-head latent attention (MLA) and grouped expert selection",
    "deepseek": "DeepSeek-MoE's shared experts with its expert-weight scale",
    "granitemoe": "Granite MoE's embedding, residual and attention multipliers",
}


#: Recurrent and hybrid architectures llama.cpp runs and cooktop does not (yet), and what they need
#: (refused by name rather than as an unknown architecture).
UNSUPPORTED_RECURRENT = {
    "lfm2moe": "LFM2-MoE's sigmoid-routed experts beside its convolution blocks",
    "mamba": "Mamba's selective scan (ssm_scan)",
    "nemotron_h": "Nemotron-H's Mamba-2 layers",
    "falcon-h1": "Falcon-H1's parallel Mamba-2 and attention layers",
    "jamba": "Jamba's Mamba layers and experts",
    "rwkv6": "RWKV-6's time-mix recurrence",
    "rwkv6qwen2": "RWKV-6's time-mix recurrence",
    "rwkv7": "RWKV-7's time-mix recurrence",
    "arwkv7": "RWKV-7's time-mix recurrence",
    "nemotron_h_moe": "Nemotron-H's Mamba-2 layers and experts",
    "kimi-linear": "Kimi-Linear's delta-rule attention",
    "plamo2": "PLaMo-2's Mamba layers",
}


def architecture(name: str, path: str = "") -> Architecture:
    """The descriptor of ``general.architecture`` ``name``.

    Raises:
        UnsupportedModelError: ``name`` is not in :data:`ARCHITECTURES` (the message lists them).
    """
    arch = ARCHITECTURES.get(name)
    if arch is None:
        where = f"{path}: " if path else ""
        if name in UNSUPPORTED_MOE:
            raise UnsupportedModelError(f"{where}the mixture-of-experts architecture {name!r} is not supported "
                                        f"(it needs {UNSUPPORTED_MOE[name]}); cooktop runs "
                                        f"{', '.join(sorted(ARCHITECTURES))}")
        if name in UNSUPPORTED_RECURRENT:
            raise UnsupportedModelError(f"{where}unsupported architecture {name!r}: a recurrent architecture cooktop "
                                        f"does not run yet (it needs {UNSUPPORTED_RECURRENT[name]}); cooktop runs "
                                        f"{', '.join(sorted(ARCHITECTURES))}")
        raise UnsupportedModelError(f"{where}unsupported architecture {name!r}; cooktop runs "
                                    f"{', '.join(sorted(ARCHITECTURES))} (general.architecture)")
    return arch
