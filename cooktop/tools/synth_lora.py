"""Synthetic GGUF LoRA adapters for a model file (tests; ``synth.py`` writes the models).

The layout is llama.cpp convert_lora_to_gguf.py's: ``general.type = adapter``, ``adapter.type =
lora``, ``adapter.lora.alpha`` (float32), and for each adapted weight ``<name>`` (numpy ``[n_out,
n_in]``) the pair ``<name>.lora_a`` (numpy ``[rank, n_in]``, GGUF ne ``[n_in, rank]``) and
``<name>.lora_b`` (numpy ``[n_out, rank]``).
"""

from __future__ import annotations

import fnmatch
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFType, GGUFWriter, Keys

from ..errors import CooktopError
from ..format.gguf import open_gguf

#: What an adapter adapts by default: attention q/k/v/o (or a fused qkv), feed-forward gate/up/down, the output head.
DEFAULT_TARGETS = ("blk.*.attn_q.weight", "blk.*.attn_k.weight", "blk.*.attn_v.weight", "blk.*.attn_qkv.weight",
                   "blk.*.attn_output.weight", "blk.*.ffn_gate.weight", "blk.*.ffn_up.weight", "blk.*.ffn_down.weight",
                   "output.weight")


def write_adapter(path: str | os.PathLike, model: str | os.PathLike, rank: int = 4, alpha: float = 8.0,
                  seed: int = 0, std: float = 0.05, targets: tuple[str, ...] = DEFAULT_TARGETS,
                  arch: str | None = None, ggml_type: T = T.F32, token_embd: bool = False) -> list[str]:
    """Write a random LoRA adapter for the model GGUF ``model`` at ``path``; returns the adapted names.

    Every 2-D tensor of ``model`` whose name matches a glob of ``targets`` gets ``A`` and ``B``
    with values of standard deviation ``std`` (both non-zero, unlike a fresh PEFT adapter, so the
    adapter changes the logits). ``arch``: the adapter's ``general.architecture`` (default the
    model's; tests write another to see it refused). ``ggml_type``: F32 or F16 pairs. ``token_embd``:
    also a pair of the token embedding, in llama.cpp's flipped layout (A ``[n_vocab, rank]``, B
    ``[n_embd, rank]``: src/llama-adapter.cpp).

    Raises:
        CooktopError: no tensor matches, a rank below 1, or another type than F32 / F16.
    """
    if rank < 1:
        raise CooktopError(f"a LoRA rank is at least 1, not {rank}")
    if ggml_type not in (T.F32, T.F16):
        raise CooktopError(f"synthetic LoRA pairs are F32 or F16, not {ggml_type.name}")
    gf = open_gguf(model)
    names = [n for n, t in gf.tensors.items() if len(t.shape) == 2 and any(fnmatch.fnmatch(n, g) for g in targets)]
    if not names:
        raise CooktopError(f"{model}: no tensor matches {list(targets)}")
    rng = np.random.default_rng(seed)
    dtype = np.float32 if ggml_type == T.F32 else np.float16
    w = GGUFWriter(os.fspath(path), arch or gf.architecture)
    w.add_type(GGUFType.ADAPTER)
    w.add_string(Keys.Adapter.TYPE, "lora")
    w.add_float32(Keys.Adapter.LORA_ALPHA, float(alpha))
    for n in names:
        n_out, n_in = gf.tensors[n].shape
        w.add_tensor(f"{n}.lora_a", (rng.standard_normal((rank, n_in)) * std).astype(dtype))
        w.add_tensor(f"{n}.lora_b", (rng.standard_normal((n_out, rank)) * std).astype(dtype))
    if token_embd:
        n_vocab, n_embd = gf.tensors["token_embd.weight"].shape
        w.add_tensor("token_embd.weight.lora_a", (rng.standard_normal((n_vocab, rank)) * std).astype(dtype))
        w.add_tensor("token_embd.weight.lora_b", (rng.standard_normal((n_embd, rank)) * std).astype(dtype))
        names.append("token_embd.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names
