"""The numpy backend's mixture-of-experts ops (:mod:`.moe_ops`): routing, ``matmul_id`` grouped by
expert, per-expert biases, the weighted sum and gpt-oss's clamped SwiGLU.

Memory: an expert tensor is never converted whole (a 30B-A3B model's experts are ~120 GB in
float32, and the numpy backend's float32 cache only takes 2-D weights). Each ``matmul_id`` call
finds the experts its rows selected, and for each of them dequantizes that expert's rows only, in
blocks of :data:`~.cpu_quants.CHUNK_VALUES` values into a per-thread scratch that stays in cache,
multiplied at once by every row routed to it; experts no row selected are not read. F32 experts
take the same blocks of the file's rows. The (expert, row block) jobs are spread over the
dequantization threads, each a one-thread BLAS product (:func:`~.cpu_quants.blocked_matmuls`, the
dense matmul's blocks): the same bits under any thread count.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from ..tensor import DeviceTensor
from . import quants as cpu_quants


def _a(t: DeviceTensor) -> np.ndarray:
    """The numpy view of an activation tensor (honouring ``head`` views)."""
    return t.handle[: t.shape[0]] if t.handle.shape[0] != t.shape[0] else t.handle


def _softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax in float32 (ggml_soft_max: exp(x - max) / sum)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True, dtype=np.float32)


def route(logits: np.ndarray, k: int, gating: str, norm: bool, scale: float,
          bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [n, k], weights float32 [n, k]) of ``moe_route`` (see ``MoeOps.moe_route``); ``bias``
    float32 [n_expert]: the selection bias added to the probabilities for the choice only."""
    lg = logits.astype(np.float32, copy=False)
    if gating == "softmax":
        p = _softmax(lg)
    elif gating == "sigmoid":
        with np.errstate(over="ignore"):
            p = (np.float32(1.0) / (np.float32(1.0) + np.exp(-lg))).astype(np.float32)
    else:  # softmax_weight: select on the logits, softmax over the selected
        p = lg
    score = p if bias is None else p + bias.astype(np.float32, copy=False)
    sel = np.argsort(-score, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, sel, axis=1)
    if gating == "softmax_weight":
        w = _softmax(w)
    if norm:
        w = w / np.maximum(w.sum(axis=1, keepdims=True, dtype=np.float32), np.float32(6.103515625e-5))
    if scale != 0.0 and scale != 1.0:
        w = w * np.float32(scale)
    return sel.astype(np.int32), w.astype(np.float32)


def matmul_id(out: np.ndarray, x: np.ndarray, w: DeviceTensor, ids: np.ndarray) -> None:
    """``mul_mat_id`` on numpy (module doc). out f32 [n, k * n_out]; x f32 [n, n_in] or [n, k * n_in];
    w: a numpy-device weight [n_expert, n_out, n_in] (F32 values, or raw GGML rows
    [n_expert * n_out, row bytes]); ids int32 [n, k]."""
    n, k = ids.shape
    n_exp, n_out, n_in = w.shape
    o3 = out.reshape(n, k, n_out)
    x3 = x.reshape(n, k, n_in) if x.shape[1] != n_in else None
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    experts, starts = np.unique(flat[order], return_index=True)
    bounds = list(starts[1:]) + [len(order)]
    groups = []
    for e, a, b in zip(experts, starts, bounds):
        r = order[a:b]
        i, j = r // k, r % k
        groups.append((int(e), i, j, np.ascontiguousarray(x3[i, j] if x3 is not None else x[i])))  # [m, n_in]
    outs = [np.empty((len(xe), n_out), np.float32) for _, _, _, xe in groups]
    if w.ggml_type == T.F32:  # the file's values, used in place
        wf = w.handle.reshape(n_exp, n_out, n_in)

        def rows_of(e: int):
            return lambda r0, r1: wf[e, r0:r1]
    else:
        raw = w.handle.reshape(n_exp * n_out, -1)

        def rows_of(e: int):
            def block(r0: int, r1: int) -> np.ndarray:
                blk = cpu_quants.scratch_f32((r1 - r0) * n_in).reshape(r1 - r0, n_in)
                cpu_quants.dequantize_rows(raw[e * n_out + r0:e * n_out + r1], w.ggml_type, n_in, blk)
                return blk
            return block
    # the dense matmul's fixed row blocks (one-thread BLAS each): the same bits under any thread count
    cpu_quants.blocked_matmuls([(oe, xe, n_out, n_in, rows_of(e)) for oe, (e, _, _, xe) in zip(outs, groups)])
    for oe, (_, i, j, _) in zip(outs, groups):
        o3[i, j] = oe


def add_id(out: np.ndarray, x: np.ndarray, b: np.ndarray, ids: np.ndarray) -> None:
    """``out[i, slot j] = x[i, slot j] + b[ids[i, j]]``; x, out f32 [n, k * m], b f32 [n_expert, m]."""
    n, k = ids.shape
    m = b.shape[1]
    np.add(x.reshape(n, k, m), b[ids], out=out.reshape(n, k, m))


def moe_combine(out: np.ndarray, y: np.ndarray, weights: np.ndarray) -> None:
    """``out = sum_j weights[:, j] * y[:, slot j]`` in slot order, float32."""
    n, k = weights.shape
    y3 = y.reshape(n, k, -1)
    acc = y3[:, 0] * weights[:, 0:1]
    for j in range(1, k):
        acc += y3[:, j] * weights[:, j:j + 1]
    out[...] = acc


def swiglu_oai(out: np.ndarray, gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> None:
    """ggml ``swiglu_oai``: ``min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, +-limit) + 1)``."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):
        np.multiply(g / (np.float32(1.0) + np.exp(np.float32(-alpha) * g)), u + np.float32(1.0), out=out)


class CpuMoeOps:
    """The ``_op`` hooks of :class:`~.moe_ops.MoeOps` for the numpy device (mixed into CpuDevice)."""

    def _moe_route(self, ids, weights, logits, gating, norm, scale, bias=None):
        sel, w = route(_a(logits), ids.shape[1], gating, norm, scale, None if bias is None else _a(bias))
        _a(ids)[...] = sel
        _a(weights)[...] = w

    def _matmul_id(self, out, x, w, ids):
        matmul_id(_a(out), _a(x), w, _a(ids))

    def _add_id(self, out, x, b, ids):
        add_id(_a(out), _a(x), b.handle, _a(ids))

    def _moe_combine(self, out, y, weights):
        moe_combine(_a(out), _a(y), _a(weights))

    def _swiglu_oai(self, out, gate, up, alpha, limit):
        swiglu_oai(_a(out), _a(gate), _a(up), alpha, limit)
