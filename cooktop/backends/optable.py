"""The op table: every device op declared once, with its argument roles and its shape rule.

The public checks of :class:`~.ops.DeviceOps` (one generic check per call, then the backend's
``_op``), :data:`OPS` (what a device claims by default), the error messages, the contract
tests' fault cases (``tests/test_device_contract.py`` builds a valid call of every op from
its :attr:`OpSpec.example` and breaks each argument in turn) and the op table of
``docs/DESIGN.md`` (:func:`markdown`, checked by a test) all come from :data:`TABLE`.

Conventions (numpy order, as in :mod:`.base`): a weight is ``[n_out, n_in]``, an activation
f32 ``[n_tokens, n]``; ``pos``/``ids`` are int32 device tensors. Each op writes into its first
argument and returns nothing.

Argument kinds: ``f32`` and ``i32`` activations; ``weight``: an uploaded tensor of any type
the device runs for that op (or an f32 activation); ``act``: f32 or i32; ``kv``: a KV cache,
f32 or any cache type the device stores (``DeviceInfo.kv_types``; ``cooktop.format.kvtypes``),
made by ``Device.empty``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from gguf import GGMLQuantizationType

from ..format.kvtypes import KV_TYPES

_GGML_F32, _GGML_I32 = GGMLQuantizationType.F32, GGMLQuantizationType.I32

#: Argument kinds.
F32, I32, WEIGHT, ACT, KV = "f32", "i32", "weight", "act", "kv"


@dataclasses.dataclass(frozen=True)
class Arg:
    """One tensor argument of an op: its name, kind, and whether it may be None."""

    name: str
    kind: str
    optional: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class OpSpec:
    """One op of the device contract.

    Attributes:
        name: the method name (``device.matmul(...)``) and the backend hook's (``_matmul``).
        args: tensor arguments in call order (the output first).
        scalars: scalar arguments after the tensors, in call order (defaults are the method's).
        computes: what it computes, one line (the design doc's table).
        rule: the shape rule in words, formatted with the scalars (the ShapeError's tail).
        fits: ``fits(*tensors, **named scalars) -> bool``: the shape rule (optional tensors may be
            None), given the scalars its signature names. Only called once devices and types passed.
        source: where the formula or layout comes from (llama.cpp / ggml).
        weight: the argument whose GGML type decides support (``matmul``'s ``w``), or None.
        kv: the KV cache arguments (kind ``kv``): their type decides support (``DeviceInfo.kv_types``).
        forward: part of the forward pass (``copy`` is a bench tool, not claimed by default).
        default: claimed by every device unless it says otherwise; False for the
            mixture-of-experts ops (:data:`MOE_OPS`), the recurrent ops (:data:`RECURRENT_OPS`) and the
            vision ops (:data:`VISION_OPS`),
            which only the backends implementing them list in their ``DeviceInfo.ops``.
        group: the op group of a non-default op: ``moe``, ``recurrent`` or ``vision`` ("" for the default
            ops).
        limits: dimension names a device may cap for this op (``DeviceInfo.op_limits``), and
            ``dims(*tensors, **scalars) -> {name: value}`` computing them from a call.
        example: a valid call: ``{arg: shape}`` for tensors (absent optional ones are None)
            and ``{scalar: value}``; the contract tests derive their fault cases from it.
    """

    name: str
    args: tuple[Arg, ...]
    scalars: tuple[str, ...]
    computes: str
    rule: str
    fits: Callable[..., bool]
    source: str
    weight: str | None = None
    kv: tuple[str, ...] = ()
    forward: bool = True
    default: bool = True
    group: str = ""
    limits: tuple[str, ...] = ()
    dims: Callable[..., dict[str, int]] | None = None
    example: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of :attr:`args`, in order."""
        return tuple(a.kind for a in self.args)

    @functools.cached_property
    def check(self) -> Callable[..., None]:
        """``check(device, *tensors, **scalars)``: the op's public argument check, written out
        from this spec (as ``dataclasses`` writes ``__init__``) so it costs what a hand-written
        chain of ``is`` tests costs: each tensor lives on ``device`` and has its role's type, the
        shapes satisfy :attr:`fits`, and the device's ``op_limits`` (if any for this op) allow the
        call's :attr:`dims`. On a failure it calls ``device._refuse(spec, tensors, scalars)`` or
        ``device._refuse_limit(spec, name, value, limit)``, which raise."""
        return _make_check(self)


def _make_check(spec: OpSpec) -> Callable[..., None]:
    names = [a.name for a in spec.args]
    tests = []
    for a in spec.args:
        n = a.name
        if a.kind == F32:
            t = f"{n}.device is not dev or {n}.ggml_type is not F32"
        elif a.kind == I32:
            t = f"{n}.device is not dev or {n}.ggml_type is not I32"
        elif a.kind == WEIGHT:
            t = f"{n}.device is not dev or ({n}.ggml_type is not F32 and not {n}.is_weight)"
        elif a.kind == KV:
            t = f"{n}.device is not dev or ({n}.ggml_type is not F32 and {n}.ggml_type not in dev.kv_types)"
        else:
            t = f"{n}.device is not dev or ({n}.ggml_type is not F32 and {n}.ggml_type is not I32)"
        tests.append(f"({n} is not None and ({t}))" if a.optional else f"({t})")
    params = ", ".join(names + [f"{k}=None" for k in spec.scalars])
    scal = ", ".join(f"{k}={k}" for k in spec.scalars)
    # the shape rule gets only the scalars it names (a plain positional call is the cheapest)
    wants = [k for k in inspect.signature(spec.fits).parameters if k in spec.scalars]
    fits_call = f"fits({', '.join(names + [f'{k}={k}' for k in wants])})"
    src = [f"def check(dev, {params}):",
           f"    if {' or '.join(tests)} or not {fits_call}:",
           f"        dev._refuse(spec, ({', '.join(names)},), {{{', '.join(f'{k!r}: {k}' for k in spec.scalars)}}})"]
    if spec.limits and spec.dims is not None:
        src += ["    lim = dev.info.op_limits",
                f"    if lim and {spec.name!r} in lim:",
                f"        for name, value in dims({', '.join(names)}{', ' + scal if scal else ''}).items():",
                f"            cap = lim[{spec.name!r}].get(name)",
                "            if cap is not None and value > cap:",
                "                dev._refuse_limit(spec, name, value, cap)"]
    env: dict[str, Any] = {"F32": _GGML_F32, "I32": _GGML_I32, "fits": spec.fits, "dims": spec.dims, "spec": spec}
    exec("\n".join(src), env)  # noqa: S102 - source built above from the table, no outside input
    return env["check"]


def _same3(a: Any, b: Any, c: Any) -> bool:
    return a.shape == b.shape == c.shape


def _same2(a: Any, b: Any) -> bool:
    return a.shape == b.shape


def _rope_fits(out: Any, x: Any, pos: Any, freq_factors: Any, *, head_dim: int, n_rot: int) -> bool:
    xs = x.shape
    return (len(xs) == 2 and out.shape == xs and pos.shape == xs[:1] and head_dim > 0 and not head_dim % 2
            and not n_rot % 2 and 0 < n_rot <= head_dim and not xs[1] % head_dim
            and (freq_factors is None or (len(freq_factors.shape) == 1 and freq_factors.shape[0] >= n_rot // 2)))


def _attention_fits(out: Any, q: Any, k: Any, v: Any, pos: Any, kv_start: Any, *, n_head: int, n_head_kv: int,
                    window: int) -> bool:
    qs, ks = q.shape, k.shape
    return (len(qs) == 2 and out.shape == qs and v.shape == ks and pos.shape == qs[:1] and n_head > 0
            and n_head_kv > 0 and not n_head % n_head_kv and not qs[1] % n_head
            and ks[1:] == (n_head_kv * (qs[1] // n_head),) and window >= 0
            and (kv_start is None or kv_start.shape == qs[:1]))


_ONE_SHAPE = "want {names} of one shape"

#: The KV cache types a ``kv`` argument may have (each device lists those it stores: ``DeviceInfo.kv_types``).
_KV_NAMES = "/".join(t.name for t in KV_TYPES)


def _route_fits(ids: Any, weights: Any, logits: Any, bias: Any) -> bool:
    ls, is_ = logits.shape, ids.shape
    return (len(ls) == 2 and len(is_) == 2 and weights.shape == is_ and is_[0] == ls[0] and 0 < is_[1] <= ls[1]
            and (bias is None or bias.shape == ls[1:]))


def _matmul_id_fits(out: Any, x: Any, w: Any, ids: Any) -> bool:
    xs, ws, is_ = x.shape, w.shape, ids.shape
    return (len(ws) == 3 and len(is_) == 2 and len(xs) == 2 and xs[0] == is_[0]
            and xs[1] in (ws[2], is_[1] * ws[2]) and out.shape == (is_[0], is_[1] * ws[1]))


def _add_id_fits(out: Any, x: Any, b: Any, ids: Any) -> bool:
    bs, is_ = b.shape, ids.shape
    return len(bs) == 2 and len(is_) == 2 and out.shape == x.shape and x.shape == (is_[0], is_[1] * bs[1])


def _combine_fits(out: Any, y: Any, weights: Any) -> bool:
    os_, ws = out.shape, weights.shape
    return len(os_) == 2 and len(ws) == 2 and ws[0] == os_[0] and y.shape == (os_[0], ws[1] * os_[1])


def _sinks_fits(out: Any, q: Any, k: Any, v: Any, pos: Any, kv_start: Any, sinks: Any, *, n_head: int,
                n_head_kv: int, window: int) -> bool:
    return (_attention_fits(out, q, k, v, pos, kv_start, n_head=n_head, n_head_kv=n_head_kv, window=window)
            and sinks.shape == (n_head,))

def _ssm_conv_fits(out: Any, x: Any, state: Any, w: Any, slots: Any) -> bool:
    xs, ws, ss = x.shape, w.shape, state.shape
    return (len(xs) == 2 and out.shape == xs and len(ws) == 2 and ws[0] == xs[1] and ws[1] >= 2
            and len(ss) == 2 and ss[1] == (ws[1] - 1) * xs[1] and slots.shape == xs[:1])


def _gdn_fits(out: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slots: Any) -> bool:
    vs, gs, ss = v.shape, g.shape, state.shape
    if len(vs) != 2 or len(gs) != 2 or gs[0] != vs[0] or gs[1] < 1 or vs[1] % gs[1]:
        return False
    h_v, n = gs[1], vs[0]
    d = vs[1] // h_v
    return (d > 0 and q.shape == k.shape and len(q.shape) == 2 and q.shape[0] == n and q.shape[1] % d == 0
            and q.shape[1] > 0 and h_v % (q.shape[1] // d) == 0 and beta.shape == gs and out.shape == vs
            and len(ss) == 2 and ss[1] == h_v * d * d and slots.shape == (n,))


def _gdn_gate_fits(g: Any, beta: Any, alpha: Any, b: Any, dt_bias: Any, a: Any) -> bool:
    s = alpha.shape
    return len(s) == 2 and g.shape == s and beta.shape == s and b.shape == s and dt_bias.shape == s[1:] \
        and a.shape == s[1:]


def _ssm_scan_fits(out: Any, xbc: Any, dt: Any, a: Any, d: Any, dt_bias: Any, state: Any, slots: Any) -> bool:
    os_, ds, ss, xs = out.shape, dt.shape, state.shape, xbc.shape
    if len(os_) != 2 or len(ds) != 2 or len(ss) != 2 or len(xs) != 2 or ds[0] != os_[0] or ds[1] < 1:
        return False
    n, d_inner, h = os_[0], os_[1], ds[1]
    if d_inner < 1 or d_inner % h or ss[1] % d_inner or ss[1] == 0:
        return False
    n_state = ss[1] // d_inner
    rest = xs[1] - d_inner
    if xs[0] != n or rest <= 0 or rest % (2 * n_state) or h % (rest // (2 * n_state)):
        return False
    return a.shape == (h, 1) and d.shape == (h, 1) and dt_bias.shape == (h,) and slots.shape == (n,)


def _ssm_norm_fits(out: Any, y: Any, z: Any, w: Any) -> bool:
    ys, ws = y.shape, w.shape
    return (len(ys) == 2 and out.shape == ys and z.shape == ys and len(ws) == 2 and ws[0] > 0 and ws[1] > 0
            and ws[0] * ws[1] == ys[1])


def _layer_norm_fits(out: Any, x: Any, w: Any, b: Any) -> bool:
    xs = x.shape
    return (len(xs) == 2 and out.shape == xs and xs[1] > 0 and w.shape == xs[1:]
            and (b is None or b.shape == xs[1:]))


def _attention_full_fits(out: Any, q: Any, k: Any, v: Any, *, n_head: int) -> bool:
    qs = q.shape
    return (len(qs) == 2 and out.shape == qs and k.shape == qs and v.shape == qs and n_head > 0
            and qs[1] > 0 and not qs[1] % n_head)


def _avg_pool2d_fits(out: Any, x: Any, *, width: int, height: int, k: int) -> bool:
    xs = x.shape
    return (len(xs) == 2 and k > 0 and width > 0 and height > 0 and not width % k and not height % k
            and xs[0] == width * height and out.shape == ((width // k) * (height // k), xs[1]))


def _rope_multi_fits(out: Any, x: Any, pos: Any, *, head_dim: int, sections: Any, mode: int) -> bool:
    xs = x.shape
    return (len(xs) == 2 and out.shape == xs and pos.shape == (4, xs[0]) and head_dim > 0 and not head_dim % 2
            and not xs[1] % head_dim and mode == 24 and len(sections) == 4 and all(int(v) > 0 for v in sections))


#: Every op, in the order of the design doc's table.
TABLE: tuple[OpSpec, ...] = (
    OpSpec("matmul", (Arg("out", F32), Arg("x", F32), Arg("w", WEIGHT)), (),
           "out f32 [n, n_out] = x f32 [n, n_in] @ w[n_out, n_in]^T (w any supported type)",
           "want out [n, n_out], x [n, n_in], w [n_out, n_in]",
           lambda out, x, w: (len(w.shape) == 2 and x.shape[1:] == w.shape[1:]
                                   and out.shape == (x.shape[0], w.shape[0])),
           "ggml_mul_mat", weight="w", limits=("n_in",), dims=lambda out, x, w, **_: {"n_in": w.shape[-1]},
           example={"out": (3, 5), "x": (3, 32), "w": (5, 32)}),
    OpSpec("rmsnorm", (Arg("out", F32), Arg("x", F32), Arg("w", F32)), ("eps",),
           "out = x / sqrt(mean(x^2) + eps) * w over each group of g values of a row (w f32 [g], g dividing "
           "the row width: g = n_embd normalises rows, g = head_dim each head)",
           "want out and x [n, width], w [g] with g dividing width",
           lambda out, x, w: (out.shape == x.shape and len(x.shape) == 2 and len(w.shape) == 1
                                   and w.shape[0] > 0 and not x.shape[1] % w.shape[0]),
           "ggml_rms_norm + ggml_mul (llama.cpp src/llama-graph.cpp build_norm)", limits=("width",),
           dims=lambda out, x, w, **_: {"width": x.shape[-1]},
           example={"out": (2, 8), "x": (2, 8), "w": (8,), "eps": 1e-5}),
    OpSpec("rope", (Arg("out", F32), Arg("x", F32), Arg("pos", I32), Arg("freq_factors", F32, True)),
           ("head_dim", "n_rot", "freq_base", "freq_scale", "mode", "ext_factor", "attn_factor", "beta_fast",
            "beta_slow", "n_ctx_orig"),
           "rotate pairs of each head of x f32 [n, n_head*head_dim] by pos (mode 0 adjacent pairs, 2 NeoX "
           "halves; optional frequency factors and YaRN)",
           "want out and x [n, n_head * head_dim], pos [n], freq_factors [>= n_rot / 2] if given, with "
           "head_dim {head_dim} and n_rot {n_rot} even and 0 < n_rot <= head_dim",
           _rope_fits, "ggml_rope_ext (ggml-cpu/ops.cpp rope_yarn)", limits=("head_dim",),
           dims=lambda *t, head_dim, **_: {"head_dim": head_dim},
           example={"out": (2, 8), "x": (2, 8), "pos": (2,), "freq_factors": None, "head_dim": 8, "n_rot": 8,
                    "freq_base": 1e4, "freq_scale": 1.0, "mode": 0}),
    OpSpec("kv_store", (Arg("cache", KV), Arg("x", F32), Arg("pos", I32)), (),
           "cache[pos[i], :] = x[i, :] (cache [n_cells, n_head_kv*head_dim] of a KV cache type, " + _KV_NAMES
           + " where the device stores it: f16/bf16 rounded to nearest even, block types quantized along "
           "the row as quantize_row_*_ref)",
           "want cache [n_ctx, n_kv_dim], x [n, n_kv_dim], pos [n]",
           lambda c, x, pos: len(x.shape) == 2 and c.shape[1:] == x.shape[1:] and pos.shape == x.shape[:1],
           "ggml_set_rows into the KV cache (llama.cpp src/llama-kv-cache.cpp cpy_k / cpy_v)", kv=("cache",),
           example={"cache": (16, 8), "x": (2, 8), "pos": (2,)}),
    OpSpec("attention", (Arg("out", F32), Arg("q", F32), Arg("k_cache", KV), Arg("v_cache", KV),
                         Arg("pos", I32), Arg("kv_start", I32, True)),
           ("n_head", "n_head_kv", "scale", "window", "flash"),
           "causal softmax(q k^T * scale) v over cache rows kv_start[i]..pos[i], GQA (window > 0: rows "
           "pos[i]-window < j <= pos[i] only); k_cache and v_cache each of a KV cache type (" + _KV_NAMES
           + "), read as stored; flash: the fused online-softmax kernel, else scores materialised, "
           "softmax, then V (same result)",
           "want out and q [n, n_head * head_dim], k_cache and v_cache [n_ctx, n_head_kv * head_dim], pos [n], "
           "kv_start [n] if given, with n_head {n_head} a multiple of n_head_kv {n_head_kv} and window {window} >= 0",
           _attention_fits, "llama.cpp src/llama-graph.cpp build_attn_mha (flash: ggml_flash_attn_ext, else mul_mat, "
           "soft_max_ext, mul_mat); SWA mask llama_hparams::is_masked_swa",
           kv=("k_cache", "v_cache"),
           limits=("head_dim",), dims=lambda out, q, *t, n_head, **_: {"head_dim": q.shape[-1] // max(1, n_head)},
           example={"out": (2, 8), "q": (2, 8), "k_cache": (16, 4), "v_cache": (16, 4), "pos": (2,),
                    "kv_start": None, "n_head": 2, "n_head_kv": 1, "scale": 0.5, "window": 0, "flash": True}),
    OpSpec("silu_mul", (Arg("out", F32), Arg("gate", F32), Arg("up", F32)), (),
           "out = silu(gate) * up (SwiGLU)", _ONE_SHAPE.format(names="out, gate and up"), _same3,
           "ggml_swiglu_split", example={"out": (2, 3), "gate": (2, 3), "up": (2, 3)}),
    OpSpec("add", (Arg("out", F32), Arg("a", F32), Arg("b", F32)), (),
           "out = a + b", _ONE_SHAPE.format(names="out, a and b"), _same3, "ggml_add",
           example={"out": (2, 3), "a": (2, 3), "b": (2, 3)}),
    OpSpec("get_rows", (Arg("out", F32), Arg("table", WEIGHT), Arg("ids", I32)), (),
           "out[i] = dequantize(table[ids[i]]) (table any supported type)",
           "want out [k, n], table [n_rows, n], ids [k]",
           lambda out, table, ids: len(table.shape) == 2 and len(ids.shape) == 1
           and out.shape == (ids.shape[0], table.shape[1]),
           "ggml_get_rows", weight="table", example={"out": (3, 32), "table": (5, 32), "ids": (3,)}),
    OpSpec("add_bias", (Arg("out", F32), Arg("x", F32), Arg("b", F32)), (),
           "out[i, :] = x[i, :] + b (b f32 [n]: a bias row broadcast over rows)",
           "want out and x [n, m], b [m]",
           lambda out, x, b: out.shape == x.shape and len(x.shape) == 2 and b.shape == x.shape[1:],
           "ggml_add of a [m] bias (llama.cpp build_qkv / build_ffn biases)",
           example={"out": (2, 8), "x": (2, 8), "b": (8,)}),
    OpSpec("gelu_mul", (Arg("out", F32), Arg("gate", F32), Arg("up", F32)), (),
           "out = gelu_tanh(gate) * up (GeGLU)", _ONE_SHAPE.format(names="out, gate and up"), _same3,
           "ggml_geglu_split (ggml_gelu_f32, ggml-cpu/vec.h)", example={"out": (2, 3), "gate": (2, 3), "up": (2, 3)}),
    # -- mixture of experts (backends/moe_ops.py): claimed only where implemented ------------
    OpSpec("moe_route", (Arg("ids", I32), Arg("weights", F32), Arg("logits", F32), Arg("bias", F32, optional=True)),
           ("gating", "norm", "scale"),
           "ids i32 [n, k], weights f32 [n, k] = the top-k experts of each row of logits f32 [n, n_expert] "
           "by the gating function (softmax / softmax over the selected k / sigmoid), plus the selection "
           "bias f32 [n_expert] when given (it picks, it does not weigh), their weights "
           "(renormalised when norm, times scale)",
           "want ids and weights [n, k], logits [n, n_expert] with 0 < k <= n_expert, bias [n_expert]", _route_fits,
           "llama.cpp src/llama-graph.cpp build_moe_ffn (exp_probs_b, ggml_argsort_top_k, get_rows of the probs)",
           default=False, group="moe",
           example={"ids": (3, 2), "weights": (3, 2), "logits": (3, 5), "bias": (5,), "gating": "sigmoid"}),
    OpSpec("matmul_id", (Arg("out", F32), Arg("x", F32), Arg("w", WEIGHT), Arg("ids", I32)), (),
           "out[i, slot j] = x[i] (or its slot j) @ w[ids[i, j]]^T; out f32 [n, k * n_out], "
           "w [n_expert, n_out, n_in]",
           "want out [n, k * n_out], x [n, n_in] or [n, k * n_in], w [n_expert, n_out, n_in], ids [n, k]",
           _matmul_id_fits, "ggml_mul_mat_id", weight="w", default=False, group="moe",
           example={"out": (3, 10), "x": (3, 32), "w": (4, 5, 32), "ids": (3, 2)}),
    OpSpec("add_id", (Arg("out", F32), Arg("x", F32), Arg("b", F32), Arg("ids", I32)), (),
           "out[i, slot j] = x[i, slot j] + b[ids[i, j]] (per-expert bias, b f32 [n_expert, m])",
           "want out and x [n, k * m], b [n_expert, m], ids [n, k]", _add_id_fits, "ggml_add_id",
           default=False, group="moe",
           example={"out": (3, 8), "x": (3, 8), "b": (4, 4), "ids": (3, 2)}),
    OpSpec("moe_combine", (Arg("out", F32), Arg("y", F32), Arg("weights", F32)), (),
           "out[i] = sum_j weights[i, j] * y[i, slot j] in slot order (y f32 [n, k * m])",
           "want out [n, m], y [n, k * m], weights [n, k]", _combine_fits,
           "llama.cpp build_moe_ffn (ggml_mul by the weights, views added in order)", default=False, group="moe",
           example={"out": (3, 4), "y": (3, 8), "weights": (3, 2)}),
    OpSpec("swiglu_oai", (Arg("out", F32), Arg("gate", F32), Arg("up", F32)), ("alpha", "limit"),
           "out = g * sigmoid(alpha g) * (clamp(up, -limit, limit) + 1), g = min(gate, limit) (gpt-oss)",
           _ONE_SHAPE.format(names="out, gate and up"), _same3, "ggml_swiglu_oai (ggml-cpu/ops.cpp)",
           default=False, group="moe",
           example={"out": (2, 3), "gate": (2, 3), "up": (2, 3)}),
    OpSpec("attention_sinks", (Arg("out", F32), Arg("q", F32), Arg("k_cache", KV), Arg("v_cache", KV),
                               Arg("pos", I32), Arg("kv_start", I32, True), Arg("sinks", F32)),
           ("n_head", "n_head_kv", "scale", "window", "flash"),
           "attention with one extra logit per head (sinks f32 [n_head]) in each softmax denominator (gpt-oss)",
           "want out and q [n, n_head * head_dim], k_cache and v_cache [n_ctx, n_head_kv * head_dim], pos [n], "
           "kv_start [n] if given, sinks [n_head], with n_head {n_head} a multiple of n_head_kv {n_head_kv} and "
           "window {window} >= 0", _sinks_fits, "llama.cpp build_attn_mha with ggml_soft_max_add_sinks",
           kv=("k_cache", "v_cache"), default=False, group="moe", limits=("head_dim",),
           dims=lambda out, q, *t, n_head, **_: {"head_dim": q.shape[-1] // max(1, n_head)},
           example={"out": (2, 8), "q": (2, 8), "k_cache": (16, 4), "v_cache": (16, 4), "pos": (2,),
                    "kv_start": None, "sinks": (2,), "n_head": 2, "n_head_kv": 1, "scale": 0.5, "window": 0,
                    "flash": True}),
    # -- recurrent layers (backends/recurrent_ops.py): claimed only where implemented ---------
    OpSpec("ssm_conv", (Arg("out", F32), Arg("x", F32), Arg("state", F32), Arg("w", F32), Arg("slots", I32)), (),
           "out[i, c] = sum_k window_i[k, c] * w[c, k], window_i = the last d_conv - 1 inputs of row i's slot "
           "(state f32 [n_slots, (d_conv - 1) * n_channels]) then x[i]; each row then shifts x[i] into "
           "its slot's state (causal depthwise conv, rows of a slot in order)",
           "want out and x [n, n_channels], w [n_channels, d_conv] with d_conv >= 2, "
           "state [n_slots, (d_conv - 1) * n_channels], slots [n]", _ssm_conv_fits,
           "ggml_ssm_conv (ggml-cpu/ops.cpp ssm_conv_f32), state as llama.cpp src/models/lfm2.cpp",
           default=False, group="recurrent",
           example={"out": (3, 4), "x": (3, 4), "state": (2, 8), "w": (4, 3), "slots": (3,)}),
    OpSpec("mul", (Arg("out", F32), Arg("a", F32), Arg("b", F32)), (),
           "out = a * b elementwise", _ONE_SHAPE.format(names="out, a and b"), _same3, "ggml_mul",
           default=False, group="recurrent", example={"out": (2, 3), "a": (2, 3), "b": (2, 3)}),
    OpSpec("silu", (Arg("out", F32), Arg("x", F32)), (),
           "out = x * sigmoid(x) elementwise", _ONE_SHAPE.format(names="out and x"), _same2,
           "ggml_silu (ggml-cpu/vec.h ggml_silu_f32)", default=False, group="recurrent",
           example={"out": (2, 3), "x": (2, 3)}),
    OpSpec("sigmoid_mul", (Arg("out", F32), Arg("a", F32), Arg("gate", F32)), (),
           "out = a * sigmoid(gate) elementwise (gated attention output)", _ONE_SHAPE.format(names="out, a and gate"),
           _same3, "ggml_sigmoid + ggml_mul (llama.cpp src/models/qwen35.cpp build_layer_attn)",
           default=False, group="recurrent", example={"out": (2, 3), "a": (2, 3), "gate": (2, 3)}),
    OpSpec("l2_norm", (Arg("out", F32), Arg("x", F32)), ("group", "eps"),
           "out = x / sqrt(mean(x^2) + eps / g) / sqrt(g) over each group of g values of a row (an L2 norm: "
           "x / sqrt(sum(x^2) + eps))",
           "want out and x [n, width] with group {group} > 0 dividing width",
           lambda out, x, *, group: (out.shape == x.shape and len(x.shape) == 2 and group > 0
                                     and not x.shape[1] % group),
           "llama.cpp src/models/models.h build_gdn_l2_norm (ggml_rms_norm with eps / g, ggml_scale 1 / sqrt(g))",
           default=False, group="recurrent", example={"out": (2, 8), "x": (2, 8), "group": 4, "eps": 1e-6}),
    OpSpec("gdn_gate", (Arg("g", F32), Arg("beta", F32), Arg("alpha", F32), Arg("b", F32), Arg("dt_bias", F32),
                        Arg("a", F32)), (),
           "g = softplus(alpha + dt_bias) * a (the log decay), beta = sigmoid(b); alpha, b f32 [n, n_head], "
           "dt_bias, a f32 [n_head] broadcast over rows",
           "want g, beta, alpha and b [n, n_head], dt_bias and a [n_head]", _gdn_gate_fits,
           "ggml_add + ggml_softplus + ggml_mul, ggml_sigmoid (llama.cpp src/models/qwen35.cpp "
           "build_layer_attn_linear; softplus as ggml-cpu/unary-ops.cpp op_softplus)",
           default=False, group="recurrent",
           example={"g": (3, 2), "beta": (3, 2), "alpha": (3, 2), "b": (3, 2), "dt_bias": (2,), "a": (2,)}),
    OpSpec("gated_delta_net", (Arg("out", F32), Arg("q", F32), Arg("k", F32), Arg("v", F32), Arg("g", F32),
                               Arg("beta", F32), Arg("state", F32), Arg("slots", I32)), ("interleaved",),
           "the gated delta rule per value head h (key head h mod n_k_heads, or h // (n_v_heads / n_k_heads) "
           "when interleaved) with a carried state "
           "S [d, d] per slot and head: S = exp(g) S; S += k (beta (v - S^T k))^T; out = S^T q / sqrt(d) "
           "(rows of a slot in order; q, k [n, n_k_heads * d], v, out [n, n_v_heads * d], g, beta "
           "[n, n_v_heads], state [n_slots, n_v_heads * d * d])",
           "want out and v [n, n_v_heads * d], q and k [n, n_k_heads * d] with n_k_heads dividing n_v_heads, "
           "g and beta [n, n_v_heads], state [n_slots, n_v_heads * d * d], slots [n]", _gdn_fits,
           "ggml_gated_delta_net (ggml-cpu/ops.cpp ggml_compute_forward_gated_delta_net_one_chunk; state "
           "layout and head mapping as there; interleaved: llama.cpp src/models/qwen3next.cpp's "
           "repeat-interleaved q and k)", default=False, group="recurrent",
           example={"out": (3, 8), "q": (3, 4), "k": (3, 4), "v": (3, 8), "g": (3, 2), "beta": (3, 2),
                    "state": (2, 32), "slots": (3,), "interleaved": False}),
    OpSpec("ssm_scan", (Arg("out", F32), Arg("xbc", F32), Arg("dt", F32), Arg("a", F32), Arg("d", F32),
                        Arg("dt_bias", F32), Arg("state", F32), Arg("slots", I32)), (),
           "Mamba-2's selective scan per head h (group h // (H / G)) with a carried state S [P, N] per slot "
           "and head: dt' = softplus(dt + dt_bias); S = exp(dt' a) S + (dt' x) B^T; out = S C + d x "
           "(rows of a slot in order; xbc [n, H * P + 2 * G * N]: x, then B [G, N], then C [G, N]; dt "
           "[n, H]; a, d [H, 1]; state [n_slots, H * P * N])",
           "want out [n, H * P], xbc [n, H * P + 2 * G * N] with G dividing H, dt [n, H], a and d [H, 1], "
           "dt_bias [H], state [n_slots, H * P * N], slots [n]", _ssm_scan_fits,
           "ggml_ssm_scan (ggml-cpu/ops.cpp ggml_compute_forward_ssm_scan_f32, Mamba-2's scalar A per head), "
           "dt bias and D as llama.cpp src/models/mamba-base.cpp build_mamba2_layer",
           default=False, group="recurrent",
           example={"out": (3, 8), "xbc": (3, 16), "dt": (3, 2), "a": (2, 1), "d": (2, 1), "dt_bias": (2,),
                    "state": (2, 32), "slots": (3,)}),
    OpSpec("ssm_norm", (Arg("out", F32), Arg("y", F32), Arg("z", F32), Arg("w", F32)), ("eps",),
           "Mamba-2's gated grouped RMS norm: g = y * silu(z), then each group j of a row (w f32 [G, width / G]) "
           "out = g / sqrt(mean(g^2) + eps) * w[j]",
           "want out, y and z [n, width], w [G, width / G]", _ssm_norm_fits,
           "ggml_swiglu_split + ggml_rms_norm + ggml_mul (llama.cpp src/models/mamba-base.cpp build_mamba2_layer)",
           default=False, group="recurrent",
           example={"out": (2, 8), "y": (2, 8), "z": (2, 8), "w": (2, 4), "eps": 1e-5}),
    OpSpec("scale", (Arg("out", F32), Arg("x", F32)), ("s",),
           "out = x * s elementwise (s a float32 scalar)", _ONE_SHAPE.format(names="out and x"), _same2,
           "ggml_scale (Granite's residual and logit multipliers, llama.cpp src/models/granite-hybrid.cpp)",
           default=False, group="recurrent", example={"out": (2, 3), "x": (2, 3), "s": 0.5}),
    # -- vision encoders (backends/vision_ops.py): claimed only where implemented -------------
    OpSpec("layer_norm", (Arg("out", F32), Arg("x", F32), Arg("w", F32), Arg("b", F32, optional=True)), ("eps",),
           "out = (x - mean(x)) / sqrt(var(x) + eps) * w + b over each row (var the biased variance; w, b f32 "
           "[n]; no b: no bias)",
           "want out and x [n_rows, n], w [n], b [n] if given", _layer_norm_fits,
           "ggml_norm + ggml_mul + ggml_add (llama.cpp tools/mtmd/clip.cpp build_norm NORM_TYPE_NORMAL)",
           default=False, group="vision",
           example={"out": (2, 8), "x": (2, 8), "w": (8,), "b": (8,), "eps": 1e-6}),
    OpSpec("gelu", (Arg("out", F32), Arg("x", F32)), (),
           "out = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) elementwise (GELU, tanh form)",
           _ONE_SHAPE.format(names="out and x"), _same2,
           "ggml_gelu (ggml-cpu/vec.h ggml_gelu_f32; ggml's CPU f32 path reads an fp16 table)",
           default=False, group="vision", example={"out": (2, 3), "x": (2, 3)}),
    OpSpec("gelu_erf", (Arg("out", F32), Arg("x", F32)), (),
           "out = 0.5 x (1 + erf(x / sqrt(2))) elementwise (exact GELU)", _ONE_SHAPE.format(names="out and x"),
           _same2, "ggml_gelu_erf (ggml-cpu/vec.h ggml_vec_gelu_erf_f32)",
           default=False, group="vision", example={"out": (2, 3), "x": (2, 3)}),
    OpSpec("gelu_quick", (Arg("out", F32), Arg("x", F32)), (),
           "out = x * sigmoid(1.702 x) elementwise", _ONE_SHAPE.format(names="out and x"), _same2,
           "ggml_gelu_quick (ggml-cpu/vec.h ggml_gelu_quick_f32; ggml's CPU f32 path reads an fp16 table)",
           default=False, group="vision", example={"out": (2, 3), "x": (2, 3)}),
    OpSpec("attention_full", (Arg("out", F32), Arg("q", F32), Arg("k", F32), Arg("v", F32)), ("n_head", "scale"),
           "non-causal softmax(q k^T * scale) v per head over all rows (no KV cache, no mask: a ViT's "
           "self-attention over one image's patches); q, k, v, out f32 [n_tokens, n_head * head_dim]",
           "want out, q, k and v [n_tokens, n_head * head_dim] with n_head {n_head} dividing the width",
           _attention_full_fits,
           "llama.cpp tools/mtmd/clip.cpp build_attn (ggml_flash_attn_ext or mul_mat, soft_max_ext, mul_mat; "
           "no mask)", default=False, group="vision", limits=("head_dim",),
           dims=lambda out, q, *t, n_head, **_: {"head_dim": q.shape[-1] // max(1, n_head)},
           example={"out": (3, 8), "q": (3, 8), "k": (3, 8), "v": (3, 8), "n_head": 2, "scale": 0.5}),
    OpSpec("avg_pool2d", (Arg("out", F32), Arg("x", F32)), ("width", "height", "k"),
           "out[(Y, X)] = the mean of x over the k x k patch window at (k Y, k X) (x f32 [height * width, c] "
           "token-major, token y * width + x; out f32 [(height / k) * (width / k), c]; stride k, no padding)",
           "want x [height * width, c], out [(height / k) * (width / k), c] with width {width} and "
           "height {height} divisible by k {k} > 0",
           _avg_pool2d_fits,
           "ggml_pool_2d GGML_OP_POOL_AVG, stride k, no padding (llama.cpp tools/mtmd/models/siglip.cpp, "
           "Gemma 3's projector)", default=False, group="vision",
           example={"out": (2, 3), "x": (8, 3), "width": 4, "height": 2, "k": 2}),
    OpSpec("rope_multi", (Arg("out", F32), Arg("x", F32), Arg("pos", I32)),
           ("head_dim", "sections", "freq_base", "mode"),
           "multi-section rope of each head, vision mode (24): pair (i, i + head_dim / 2) rotated by "
           "pos[s, row] * freq_base^(-4 j / head_dim), s the section of i mod sum(sections) and j its index in "
           "that section (pos i32 [4, n]: one position row per section; Qwen2-VL's 2-D patch positions)",
           "want out and x [n, n_head * head_dim], pos [4, n], with head_dim {head_dim} even, sections {sections} "
           "four values > 0 and mode {mode} 24 (GGML_ROPE_TYPE_VISION)",
           _rope_multi_fits,
           "ggml_rope_multi with GGML_ROPE_TYPE_VISION, n_dims = head_dim / 2 (ggml-cpu/ops.cpp "
           "ggml_mrope_cache_init, rotate_pairs; llama.cpp tools/mtmd/models/qwen2vl.cpp)",
           default=False, group="vision",
           example={"out": (2, 8), "x": (2, 8), "pos": (4, 2), "head_dim": 8, "sections": (1, 1, 1, 1),
                    "freq_base": 1e4, "mode": 24}),
    OpSpec("copy", (Arg("out", ACT), Arg("x", ACT)), (),
           "out = x (F32 or I32; `cooktop bench --ops` measures bandwidth with it; not in the forward pass)",
           _ONE_SHAPE.format(names="out and x"), _same2, "ggml_cpy", forward=False,
           example={"out": (2, 3), "x": (2, 3)}),
)

#: Op specs by name.
SPECS: dict[str, OpSpec] = {s.name: s for s in TABLE}

#: Op names of the forward pass, in table order: what a device claims unless it says otherwise.
OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.forward and s.default)

#: The mixture-of-experts ops: claimed only by the backends that implement them (after :data:`OPS`).
MOE_OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.forward and s.group == "moe")

#: The recurrent layers' ops (short convolution with state, the gated delta rule and the small ops around
#: them): claimed only by the backends that implement them.
RECURRENT_OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.forward and s.group == "recurrent")

#: The vision encoders' ops (CLIP / SigLIP ViTs: layer norm, the GELUs, full attention, the patch
#: average pool): claimed only by the backends that implement them.
VISION_OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.forward and s.group == "vision")

#: Ops whose weight (or table) type matters to ``DeviceInfo.supports``.
TYPED_OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.weight is not None)

#: Ops reading or writing a KV cache: their cache type matters to ``DeviceInfo.supports``.
KV_OPS: tuple[str, ...] = tuple(s.name for s in TABLE if s.kv)


def markdown() -> str:
    """The op table as the design doc shows it (``docs/DESIGN.md``; a test keeps them equal)."""
    rows = ["| op | arguments | computes | shape rule | source |", "|---|---|---|---|---|"]
    for s in TABLE:
        args = ", ".join(f"{a.name}{'?' if a.optional else ''}: {a.kind}" for a in s.args)
        if s.scalars:
            args += "; " + ", ".join(s.scalars)
        rule = re.sub(r" \{\w+\}", "", s.rule)
        rows.append(f"| `{s.name}` | {args} | {s.computes} | {rule} | {s.source} |")
    return "\n".join(rows)
