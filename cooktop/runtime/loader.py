"""Loading: open a GGUF, read its config and vocabulary, resolve the devices, plan the
placement and upload the weights.

:func:`load_model` returns a :class:`LoadedModel` (no generation state);
``cooktop.engine`` runs generation on it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from ..backends import registry
from ..backends.base import Device
from ..backends.optable import KV_OPS
from ..errors import CooktopError
from ..format.gguf import GGUFFile, open_gguf
from ..format.kvtypes import KVConfig
from ..model.config import ModelConfig, load_config
from ..model.forward import Model
from ..model.placed import PlacedModel
from ..text.tokenizer import Tokenizer
from .budget import device_limits, memory_overrides
from .placement import Placement, TensorPlacement, parse_ngl, place

log = logging.getLogger("cooktop")


@dataclasses.dataclass
class LoadedModel:
    """A model placed on devices, with its tokenizer; what :func:`load_model` returns.

    Attributes:
        gf: the opened GGUF; cfg: its config; tokenizer: its vocabulary.
        model: the forward pass with its device buffers; placement: where each unit runs.
        devices: selector -> opened Device; n_ctx, n_batch: tokens; load_ms: milliseconds.
    """

    gf: GGUFFile
    cfg: ModelConfig
    tokenizer: Tokenizer
    model: PlacedModel
    placement: Placement
    devices: dict[str, Device]
    n_ctx: int
    n_batch: int
    load_ms: float


def default_n_ctx(cfg: ModelConfig, n_ctx: int) -> int:
    """``n_ctx == 0`` means the training context capped at 4096 (llama.cpp's default), else ``n_ctx``.

    A context longer than the training context is allowed with llama.cpp's warning
    (src/llama-context.cpp: "n_ctx_seq (N) > n_ctx_train (M) -- possible training context overflow").

    Raises:
        CooktopError: ``n_ctx`` is negative.
    """
    if n_ctx < 0:
        raise CooktopError(f"n_ctx (-c) must be >= 0 (0 = from the model), got {n_ctx}")
    if n_ctx > cfg.n_ctx_train > 0:
        log.warning("n_ctx_seq (%d) > n_ctx_train (%d) -- possible training context overflow", n_ctx, cfg.n_ctx_train)
    return min(cfg.n_ctx_train, 4096) if n_ctx == 0 else n_ctx


def check_batch(n_batch: int, n_ctx: int) -> int:
    """The prompt chunk size actually used: ``min(n_batch, n_ctx)``.

    Raises:
        CooktopError: ``n_batch`` is not positive.
    """
    if n_batch <= 0:
        raise CooktopError(f"n_batch (-b) must be positive, got {n_batch}")
    return min(n_batch, n_ctx)


def parse_split(split: str | list[float] | None) -> list[float] | None:
    """``"3,1"`` -> ``[3.0, 1.0]`` (``--split`` / ``--tensor-split``)."""
    if split is None or isinstance(split, list):
        return split
    try:
        return [float(s) for s in str(split).split(",") if s.strip()]
    except ValueError:
        raise CooktopError(f"bad --split {split!r}: expected comma-separated numbers such as 3,1") from None


_warned: set[str] = set()


def warn_unknown_memory_overrides() -> None:
    """Log a warning (once each) for a ``COOKTOP_DEVICE_MEMORY`` selector naming no probed device.

    Raises:
        DeviceError: a malformed ``COOKTOP_DEVICE_MEMORY``.
    """
    for sel in memory_overrides():
        family = sel.split(":")[0]
        res = registry.probe(family) if family in registry.FAMILIES else None
        known = [d.selector.lower() for d in res.devices] if res is not None and res.available else []
        if sel not in known and sel not in _warned:
            _warned.add(sel)
            log.warning("COOKTOP_DEVICE_MEMORY names %s, which is no device here (%s); the entry is ignored",
                        sel, f"{family} devices: {', '.join(known)}" if known else f"no {family} device")


def plan_for(gf: GGUFFile, cfg: ModelConfig, selectors: list[str], n_gpu_layers: int | str,
             split: str | list[float] | None, n_ctx: int, n_batch: int, logits_all: bool,
             tensors: TensorPlacement | None = None, kv: KVConfig | None = None, n_seq: int = 1) -> Placement:
    """Placement of a model on resolved devices, from their probed capabilities and memory.

    Probing only: no device allocation happens here. A ``COOKTOP_DEVICE_MEMORY`` entry for a
    device that does not exist here gets a warning (once). ``kv``: the KV cache types (default
    :class:`KVConfig`): a device that does not store them runs no attention (the unit stays on
    the host with the reason), and the budgets count their bytes, for ``n_seq`` sequences (the K/V
    and the recurrent states of each).
    """
    warn_unknown_memory_overrides()
    info = registry.device_info
    kv = kv if kv is not None else KVConfig()

    def supports(sel: str, op: str, ty, **dims: int) -> str:
        why = info(sel).supports_op(op, ty, **dims)
        if not why and ty is None and op in KV_OPS:  # the cache's types, K and V
            why = "; ".join(dict.fromkeys(r for t in (kv.type_k, kv.type_v) if (r := info(sel).supports_op(op, t))))
        return why

    def limits(sel: str):
        i = info(sel)
        return device_limits(sel, i.usable_mem_bytes or i.global_mem_bytes, i.max_alloc_bytes)

    return place(gf, cfg, selectors, n_gpu_layers, parse_split(split), supports, limits, n_ctx, n_batch,
                 logits_all, tensors, kv, n_seq)


def load_model(model_path: str | os.PathLike, *, n_ctx: int = 0, n_batch: int = 512, device: str | None = None,
         n_gpu_layers: int | str = -1, split: str | list[float] | None = None, logits_all: bool = False,
         tensors: TensorPlacement | None = None, kv: KVConfig | None = None, n_seq_max: int = 1,
         lora: list[tuple[str, float]] | None = None) -> LoadedModel:
    """Open a GGUF and place it on devices.

    Args:
        model_path: path of a llama-family GGUF.
        n_ctx: context length in tokens (<= 0: training context capped at 4096).
        n_batch: max tokens per forward call (prompt chunk size).
        device: ``--device`` selector(s) (default ``COOKTOP_DEVICE`` or ``auto``).
        n_gpu_layers: units to offload (llama.cpp semantics, -1 = all, "auto" = as many as
            fit); see runtime/placement.py.
        split: proportions for several devices.
        logits_all: keep logits for every position (needed for ``eval(..., logits_all=True)``).
        tensors: ``--n-cpu-moe`` / ``-ot`` (``runtime.placement.TensorPlacement``).
        kv: KV cache types and ``-fa`` (``-ctk``/``-ctv``/``-fa``; default :class:`KVConfig`).
        n_seq_max: sequences that will share one cache (the server's slots): the placement's budgets
            count the K/V and recurrent states of that many (llama.cpp ``n_seq_max``).
        lora: ``(path, scale)`` of each LoRA adapter to load, in id order (``model/lora.py``; llama.cpp
            ``--lora`` / ``--lora-scaled``); their memory is not in the placement's budget (adapters are small).
    Raises:
        GGUFError, UnsupportedModelError, DeviceError, DeviceOutOfMemoryError, KVTypeError (a cache
        type llama.cpp refuses with this model, e.g. quantized V with ``-fa off``), LoraError (an
        adapter that does not fit the model: ``LoraSet.load``).
    """
    t0 = time.perf_counter()
    gf = open_gguf(model_path)
    cfg = load_config(gf)
    tokenizer = Tokenizer.from_gguf(gf.raw)  # the metadata already read, strings as bytes
    n_ctx = default_n_ctx(cfg, n_ctx)
    n_batch = check_batch(n_batch, n_ctx)
    n_gpu_layers = parse_ngl(n_gpu_layers)
    selectors = registry.resolve(device)
    kv = kv if kv is not None else KVConfig()
    kv.resolve(cfg.head_dim)  # refused combinations fail before anything is placed

    if not isinstance(n_seq_max, int) or n_seq_max < 1:
        raise CooktopError(f"n_seq_max must be an integer >= 1, not {n_seq_max!r}")
    placement = plan_for(gf, cfg, selectors, n_gpu_layers, split, n_ctx, n_batch, logits_all, tensors, kv,
                         n_seq_max)
    for note in placement.notes:
        log.info(note)
    devices = {sel: registry.open_device(sel) for sel in placement.devices()}
    caps = [(c, sel) for sel, d in devices.items() if (c := d.max_attention_keys(cfg.head_dim)) is not None]
    if caps and min(caps)[0] < n_ctx:
        cap, sel = min(caps)
        log.warning("%s computes attention right over at most %d keys at head_dim %d (its driver stops a "
                    "shader's loops early past that): n_ctx %d -> %d; use another device for a longer context",
                    sel, cap, cfg.head_dim, n_ctx, cap)
        n_ctx = cap
        n_batch = min(n_batch, n_ctx)
    for sel in devices:
        if sel != "cpu":
            res = registry.smoke_test(sel)
            if not res.ok:
                log.warning("%s failed its smoke test (%s); using it because it was named", sel, res.detail)
    segments = [(devices[sel], blocks, head, parts) for sel, blocks, head, parts in placement.units()]
    model = Model(gf, cfg, segments, n_ctx, n_batch, logits_all, kv)
    try:
        for path, scale in lora or ():
            model.load_lora(path, scale)
    except BaseException:
        model.close()
        raise
    return LoadedModel(gf, cfg, tokenizer, model, placement, devices, n_ctx, n_batch,
                       (time.perf_counter() - t0) * 1e3)
