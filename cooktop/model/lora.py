"""LoRA adapters of a loaded model: reading a GGUF adapter (:func:`read_adapter`), attaching it
to the model's weights (:meth:`LoraSet.load`) and their run-time scales (:class:`LoraSet`).

An adapter file (llama.cpp convert_lora_to_gguf.py) has ``general.type = adapter``,
``adapter.type = lora``, ``adapter.lora.alpha`` (float32, 0: none) and, for each adapted weight
``<name>`` of the base model, ``<name>.lora_a`` (ne ``[n_in, rank]``: numpy ``[rank, n_in]``) and
``<name>.lora_b`` (ne ``[rank, n_out]``: numpy ``[n_out, rank]``); ``*_norm.weight`` tensors are
skipped, as llama.cpp does. The checks and their wording follow llama.cpp src/llama-adapter.cpp
``llama_adapter_lora_init_impl``.

Loading uploads each pair as float32 next to its weight (a fused weight's part gets its rows of
B) and appends a :class:`~cooktop.backends.lora.LoraDelta` to the weight tensor's ``lora``;
the device's ``matmul`` applies it (``backends/lora.py``). The weights are never changed, so
:meth:`LoraSet.set_scales` changes the adapters' effect between two forward passes. The scales
are part of each segment's graph key (``model/forward.py``): a recording device records the
op list again for new scales.

The token embedding's pair is kept on the host, where the lookup runs (``PlacedModel.embed``):
``x += scale * A[tokens] @ B^T`` with A numpy ``[n_vocab, rank]`` and B ``[n_embd, rank]`` (the
layout llama.cpp ``build_inp_embd`` reads: "A and B are flipped"). Not supported (refused by name):
that pair on a model whose output head is the token embedding (tied; llama.cpp would apply the
flipped pair to the head too), mixture-of-experts expert tensors (``build_lora_mm_id``), and aLoRA
adapters (``adapter.alora.invocation_tokens``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from ..backends.lora import LoraDelta
from ..backends.tensor import DeviceTensor
from ..errors import CooktopError, GGUFError, UnsupportedModelError
from ..format.gguf import TensorInfo, open_gguf
from ..format.quants import dequantize


class LoraError(UnsupportedModelError):
    """A LoRA adapter file that cannot be applied to this model (the message names the file and why)."""


@dataclasses.dataclass
class LoraAdapter:
    """A read and checked GGUF LoRA adapter (no device memory).

    Attributes:
        path: the file; arch: its ``general.architecture``; alpha: ``adapter.lora.alpha`` (0: none).
        pairs: base tensor name -> (A f32-convertible [rank, n_in], B [n_out, rank]) tensors of the file.
        task_name, prompt_prefix: ``adapter.lora.task_name`` / ``adapter.lora.prompt_prefix`` ("" when
            absent; llama-server lists them).
    """

    path: str
    arch: str
    alpha: float
    pairs: dict[str, tuple[TensorInfo, TensorInfo]]
    task_name: str = ""
    prompt_prefix: str = ""


def read_adapter(path: str | os.PathLike) -> LoraAdapter:
    """Open ``path`` and check that it is a LoRA adapter (llama.cpp ``llama_adapter_lora_init_impl``).

    Raises:
        GGUFError: not a readable GGUF.
        LoraError: ``general.type`` is not ``adapter`` (a model given as an adapter), ``adapter.type``
            is not ``lora``, an aLoRA adapter, a tensor with another suffix than ``.lora_a`` /
            ``.lora_b`` / ``_norm.weight``, or a pair missing one half.
    """
    p = os.fspath(path)
    gf = open_gguf(p)
    md = gf.metadata
    gtype = md.get("general.type", "")
    if gtype != "adapter":
        raise LoraError(f"{p}: not a LoRA adapter: expected general.type 'adapter', got {gtype!r}"
                        + (" (this is a model; pass it as the model, and an adapter made for it as the LoRA)"
                           if gtype in ("", "model") else ""))
    atype = md.get("adapter.type", "")
    if atype != "lora":
        raise LoraError(f"{p}: expected adapter.type 'lora', got {atype!r} (control vectors and other adapters "
                        "are not LoRA adapters)")
    if "adapter.alora.invocation_tokens" in md:
        raise LoraError(f"{p}: an aLoRA adapter (adapter.alora.invocation_tokens): activated LoRA is not "
                        "supported by cooktop")
    alpha = md.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not np.isfinite(alpha):
        raise LoraError(f"{p}: adapter.lora.alpha must be a number, got {alpha!r}")
    halves: dict[str, dict[str, TensorInfo]] = {}
    for name, t in gf.tensors.items():
        for suffix in (".lora_a", ".lora_b"):
            if name.endswith(suffix):
                halves.setdefault(name[:-len(suffix)], {})[suffix] = t
                break
        else:
            if not name.endswith("_norm.weight"):  # llama.cpp skips norm vectors
                raise LoraError(f"{p}: LoRA tensor '{name}' has unexpected suffix (want .lora_a or .lora_b)")
    pairs = {}
    for base, h in halves.items():
        if len(h) != 2:
            raise LoraError(f"{p}: LoRA tensor pair for '{base}' is missing one component "
                            f"({'lora_b' if '.lora_a' in h else 'lora_a'})")
        pairs[base] = (h[".lora_a"], h[".lora_b"])
    if not pairs:
        raise LoraError(f"{p}: the adapter has no .lora_a / .lora_b tensors")
    return LoraAdapter(p, str(md.get("general.architecture", "")), float(alpha), pairs,
                       str(md.get("adapter.lora.task_name", "")), str(md.get("adapter.lora.prompt_prefix", "")))


def parse_lora_request(entries: Any) -> dict[int, float]:
    """``[{"id": int, "scale": float}, ...]`` -> ``{id: scale}`` (llama-server server-common.cpp
    ``parse_lora_request``; ids and scales checked against the model by :meth:`LoraSet.check_scales`).

    Raises:
        CooktopError: not a list of objects with an integer ``id`` and a numeric ``scale``.
    """
    if not isinstance(entries, list):
        raise CooktopError(f"LoRA adapters must be a list of {{\"id\": int, \"scale\": float}} objects, got "
                           f"{type(entries).__name__}")
    out: dict[int, float] = {}
    for e in entries:
        if not isinstance(e, dict) or "id" not in e:
            raise CooktopError(f"each LoRA entry must be an object with an \"id\" and a \"scale\", got {e!r}")
        i, s = e["id"], e.get("scale", 0.0)
        if isinstance(i, bool) or not isinstance(i, int):
            raise CooktopError(f"LoRA entry {e!r}: \"id\" must be an integer")
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise CooktopError(f"LoRA entry {e!r}: \"scale\" must be a number")
        out[i] = float(s)
    return out


def _f32(t: TensorInfo, rows: list[tuple[int, int]] | None = None) -> np.ndarray:
    v = dequantize(t.data, t.ggml_type, t.shape)
    if rows is not None:
        v = np.concatenate([v[a:e] for a, e in rows])
    return np.ascontiguousarray(v, dtype=np.float32)


class LoraSet:
    """The adapters loaded into one model and their scales (llama.cpp ``llama_set_adapters_lora``).

    Adapter ``i`` (its id, in load order) is applied with ``scales[i]``; 0 leaves it out.

    Args:
        lock: the model's lock (scales change between forward passes, never inside one).
    """

    def __init__(self, lock: threading.Lock):
        self.adapters: list[LoraAdapter] = []
        #: adapter scales, shared with every LoraDelta (changed in place)
        self.scales: list[float] = []
        self._lock = lock
        self._version = 0
        #: the token embedding's pairs, on the host: (adapter id, A f32 [n_vocab, rank], B f32 [n_embd, rank], alpha)
        self.embd: list[tuple[int, np.ndarray, np.ndarray, float]] = []

    def embed_delta(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``x`` (float32 [n, n_embd], the looked-up rows of ``tokens`` int [n]) plus each token-embedding
        pair's ``scale * A[tokens] @ B^T`` (llama.cpp src/llama-graph.cpp ``build_inp_embd``)."""
        for idx, a, b, alpha in self.embd:
            s = float(self.scales[idx])
            if s == 0.0:
                continue
            rank = b.shape[1]
            f = np.float32(s * alpha / rank if alpha else s)
            x = np.asarray(x, dtype=np.float32) + f * (a[tokens] @ b.T)
        return x

    def key(self) -> tuple:
        """What the forward pass's op list depends on: which adapters are loaded and their scales."""
        return self._version, tuple(self.scales)

    def entries(self) -> list[dict[str, Any]]:
        """``[{"id", "path", "scale"}]`` of the loaded adapters (llama-server ``GET /lora-adapters``)."""
        return [{"id": i, "path": a.path, "scale": float(s)}
                for i, (a, s) in enumerate(zip(self.adapters, self.scales))]

    def check_scales(self, scales: dict[int, float]) -> dict[int, float]:
        """``scales`` (adapter id -> scale) checked: known ids, finite numbers.

        Raises:
            CooktopError: an id that is no loaded adapter, or a scale that is not a finite number.
        """
        out = {}
        for i, s in scales.items():
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.adapters):
                raise CooktopError(f"LoRA adapter id {i!r} is invalid: {len(self.adapters)} adapter(s) loaded "
                                   f"(ids 0..{len(self.adapters) - 1})" if self.adapters else
                                   f"LoRA adapter id {i!r} is invalid: no adapter is loaded")
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not np.isfinite(s):
                raise CooktopError(f"LoRA adapter {i}: the scale must be a finite number, got {s!r}")
            out[i] = float(s)
        return out

    def construct(self, scales: dict[int, float]) -> list[float]:
        """Every adapter's scale from ``{id: scale}``: the adapters left out get 0 (llama-server
        server-context.cpp ``construct_lora_list``, used by ``POST /lora-adapters`` and a request's
        ``lora`` field).

        Raises:
            CooktopError: see :meth:`check_scales`.
        """
        checked = self.check_scales(scales)
        return [checked.get(i, 0.0) for i in range(len(self.adapters))]

    def set_scales(self, scales: dict[int, float] | list[float]) -> None:
        """Set the scales of the adapters named (a list: every adapter's, in id order), between passes.

        Raises:
            CooktopError: see :meth:`check_scales`; a list of the wrong length.
        """
        if isinstance(scales, (list, tuple)):
            if len(scales) != len(self.adapters):
                raise CooktopError(f"{len(scales)} LoRA scales for {len(self.adapters)} adapter(s)")
            scales = dict(enumerate(scales))
        checked = self.check_scales(scales)
        with self._lock:
            for i, s in checked.items():
                self.scales[i] = s

    def load(self, model: Any, path: str | os.PathLike, scale: float = 1.0) -> int:
        """Read the adapter ``path``, upload its pairs beside the weights they adapt and attach them
        (llama.cpp ``llama_adapter_lora_init``); returns its id. All or nothing: on an error no
        weight changes. ``model``: a ``model.forward.Model`` (its ``gf``, ``segments`` with their
        ``matrices`` and ``buffer``; not imported here: ``forward`` imports this module).

        Raises:
            GGUFError / LoraError: see :func:`read_adapter`; an adapter of another architecture,
                naming a tensor the model lacks, of a tensor cooktop does not adapt (the token
                embedding, expert tensors, a tensor no matmul reads), or with shapes that do not fit
                the base tensor.
            CooktopError: a scale that is not a finite number.
            DeviceOutOfMemoryError: from the devices.
        """
        ad = read_adapter(path)
        p = ad.path
        arch = model.gf.architecture
        if ad.arch != arch:
            raise LoraError(f"{p}: model arch and LoRA arch mismatch: the adapter is for {ad.arch!r}, the model "
                            f"is {arch!r}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
            raise CooktopError(f"{p}: the LoRA scale must be a finite number, got {scale!r}")
        where: dict[str, list[tuple[Any, DeviceTensor, list[tuple[int, int]] | None]]] = {}
        for seg in model.segments:
            for name, lst in seg.matrices.items():
                where.setdefault(name, []).extend((seg, t, rows) for t, rows in lst)
        for name, (a, b) in ad.pairs.items():
            base = model.gf.tensors.get(name)
            if base is None:
                raise LoraError(f"{p}: LoRA tensor '{name}' does not exist in base model (hint: maybe wrong "
                                "base model?)")
            if name == "token_embd.weight":
                n_vocab, n_embd = base.shape
                if a.shape != (n_vocab, a.shape[-1]) or b.shape != (n_embd, a.shape[-1]):
                    raise LoraError(f"{p}: tensor '{name}' has incorrect shape (hint: maybe wrong base model?): "
                                    f"base [{n_vocab}, {n_embd}], lora_a {list(a.shape)} (want [{n_vocab}, rank]), "
                                    f"lora_b {list(b.shape)} (want [{n_embd}, rank])")
                if name in where:
                    raise LoraError(f"{p}: LoRA of '{name}' on a model whose output head is the token embedding "
                                    "(tied): not supported (its flipped pair does not fit the head)")
                continue
            if name.endswith("token_embd.weight"):
                raise LoraError(f"{p}: LoRA of '{name}' is not supported by cooktop")
            if len(base.shape) != 2:
                raise LoraError(f"{p}: LoRA of '{name}' (shape {list(base.shape)}): adapters of mixture-of-experts "
                                "expert tensors are not supported by cooktop")
            n_out, n_in = base.shape
            if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != n_in or b.shape[0] != n_out:
                raise LoraError(f"{p}: tensor '{name}' has incorrect shape (hint: maybe wrong base model?): "
                                f"base [{n_out}, {n_in}], lora_a {list(a.shape)} (want [rank, {n_in}]), lora_b "
                                f"{list(b.shape)} (want [{n_out}, rank])")
            if a.shape[0] != b.shape[1]:
                raise LoraError(f"{p}: '{name}': lora_a is not transposed: lora_a {list(a.shape)} and lora_b "
                                f"{list(b.shape)} have different ranks")
            if name not in where:
                raise LoraError(f"{p}: LoRA of '{name}': cooktop applies adapters to the matrices its matmuls "
                                "read (attention, feed-forward, output head), not to this tensor")
        with self._lock:  # no forward pass while the weights change
            idx = len(self.adapters)
            staged: list[tuple[DeviceTensor, LoraDelta, Any]] = []
            try:
                for name, (a, b) in ad.pairs.items():
                    if name == "token_embd.weight":
                        continue
                    av = _f32(a)
                    for seg, t, rows in where[name]:
                        da = seg.buffer.upload(av, T.F32, av.shape)
                        bv = _f32(b, rows)
                        db = seg.buffer.upload(bv, T.F32, bv.shape)
                        staged.append((t, LoraDelta(da, db, ad.alpha, self.scales, idx), seg))
            except BaseException:
                for _, dl, seg in staged:
                    seg.device.release([dl.a, dl.b])
                    seg.buffer.tensors = [x for x in seg.buffer.tensors if x.device is not None]
                raise
            self.adapters.append(ad)
            self.scales.append(float(scale))
            if "token_embd.weight" in ad.pairs:
                a, b = ad.pairs["token_embd.weight"]
                self.embd.append((idx, _f32(a), _f32(b), ad.alpha))
            for t, dl, _ in staged:
                t.lora = t.lora + (dl,)
            self._version += 1
        return idx


__all__ = ["LoraAdapter", "LoraError", "LoraSet", "parse_lora_request", "read_adapter", "GGUFError"]
