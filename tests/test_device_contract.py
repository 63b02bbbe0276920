"""The device contract's roles, on every backend family (registry.FAMILIES):

- every fault of an op or a copy raises the same exception type with the same message
  on every backend (the checks live once in ``Device``; only the device's selector and
  name differ, and are normalized away here);
- a ``DeviceBuffer`` owns what it allocates and releases it once; released tensors are
  refused with a DeviceError instead of reaching the backend;
- ``synchronize()`` waits for enqueued work on every device.
"""

from __future__ import annotations

import dataclasses
import gc
import pathlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from cooktop.backends import optable
from cooktop.backends.cpu.device import CpuDevice, cpu_info
from cooktop.backends.optable import ACT, I32, SPECS, TABLE, WEIGHT
from cooktop.errors import DeviceError, ShapeError, UnsupportedOpError
from cooktop.format.quants import random_weight


def _f32(dev, *shape):
    return dev.empty(shape)


def _i32(dev, n):
    t = dev.empty((n,), T.I32)
    dev.write(t, np.zeros(n, dtype=np.int32))
    return t


def _w(dev, n_out, n_in):
    return dev.upload(np.ones((n_out, n_in), np.float32), T.F32, (n_out, n_in))


#: a second numpy device, selector ``elsewhere:0``: its tensors are foreign everywhere
_OTHER = CpuDevice(dataclasses.replace(cpu_info(), backend="elsewhere"))

#: fault name -> (what to run on a device, exception type, message with <dev>/<name> for the device)
FAULTS = {
    "matmul n_in": (lambda d: d.matmul(_f32(d, 3, 5), _f32(d, 3, 64), _w(d, 5, 32)), ShapeError,
                    "matmul: shapes do not fit: out [3, 5], x [3, 64], w [5, 32]; "
                    "want out [n, n_out], x [n, n_in], w [n_out, n_in]"),
    "matmul out": (lambda d: d.matmul(_f32(d, 3, 4), _f32(d, 3, 32), _w(d, 5, 32)), ShapeError,
                   "matmul: shapes do not fit: out [3, 4], x [3, 32], w [5, 32]; "
                   "want out [n, n_out], x [n, n_in], w [n_out, n_in]"),
    "matmul x type": (lambda d: d.matmul(_f32(d, 3, 5), d.empty((3, 32), T.I32), _w(d, 5, 32)),
                      UnsupportedOpError, "matmul: x must be F32, not I32"),
    "matmul 1-D x": (lambda d: d.matmul(_f32(d, 5), _f32(d, 32), _w(d, 5, 32)), ShapeError,
                     "matmul: shapes do not fit: out [5], x [32], w [5, 32]; "
                     "want out [n, n_out], x [n, n_in], w [n_out, n_in]"),
    "foreign tensor": (lambda d: d.add(_f32(d, 2, 3), _OTHER.empty((2, 3)), _f32(d, 2, 3)), DeviceError,
                       "add: a DeviceTensor(elsewhere:0, F32, [2, 3]) lives on another device than <dev>"),
    "unsupported weight type": (lambda d: d.upload(np.zeros((1, 36), np.uint8), T.Q8_1, (1, 32)),
                                UnsupportedOpError, "<dev> (<name>) cannot run matmul on Q8_1 tensors"),
    "weight of the wrong size": (lambda d: d.upload(np.zeros((1, 30), np.uint8), T.Q8_0, (1, 32)),
                                 UnsupportedOpError, "Q8_0 tensor of shape [1, 32] needs 34 bytes, got 30"),
    "empty of a block type": (lambda d: d.empty((2, 256), T.Q4_K), UnsupportedOpError,
                              "empty() makes F32 or I32 tensors or a KV cache of a type <dev> stores "
                              "(DeviceInfo.kv_types), not Q4_K"),
    "kv_store into an I32 cache": (lambda d: d.kv_store(d.empty((16, 8), T.I32), _f32(d, 2, 8), _i32(d, 2)),
                                   UnsupportedOpError, "kv_store: cache must be F32 or a KV cache type <dev> "
                                                       "stores, not I32"),
    "empty of a negative shape": (lambda d: d.empty((2, -1)), ShapeError, "empty(): bad shape [2, -1]"),
    "write size": (lambda d: d.write(_f32(d, 2, 3), np.zeros(5, np.float32)), ShapeError,
                   "write of 5 values into a tensor of shape [2, 3]"),
    "write a weight": (lambda d: d.write(_w(d, 1, 32), np.zeros(32, np.float32)), DeviceError,
                       "write: DeviceTensor(<dev>, F32, [1, 32]) is a weight; only F32/I32 tensors made by "
                       "empty() can be written and read"),
    "read a weight": (lambda d: d.read(_w(d, 1, 32)), DeviceError,
                      "read: DeviceTensor(<dev>, F32, [1, 32]) is a weight; only F32/I32 tensors made by "
                      "empty() can be written and read"),
    "rmsnorm weight": (lambda d: d.rmsnorm(_f32(d, 2, 8), _f32(d, 2, 8), d.upload(np.ones(3, np.float32),
                                                                                  T.F32, (3,)), 1e-5),
                       ShapeError, "rmsnorm: shapes do not fit: out [2, 8], x [2, 8], w [3]; "
                                   "want out and x [n, width], w [g] with g dividing width"),
    "add_bias width": (lambda d: d.add_bias(_f32(d, 2, 8), _f32(d, 2, 8), d.upload(np.ones(4, np.float32),
                                                                                   T.F32, (4,))),
                       ShapeError, "add_bias: shapes do not fit: out [2, 8], x [2, 8], b [4]; "
                                   "want out and x [n, m], b [m]"),
    "rope freq_factors": (lambda d: d.rope(_f32(d, 2, 8), _f32(d, 2, 8), _i32(d, 2), 8, 8, 1e4, 1.0, 0,
                                           d.upload(np.ones(3, np.float32), T.F32, (3,))), ShapeError,
                          "rope: shapes do not fit: out [2, 8], x [2, 8], pos [2], freq_factors [3]; "
                          "want out and x [n, n_head * head_dim], pos [n], freq_factors [>= n_rot / 2] if given, "
                          "with head_dim 8 and n_rot 8 even and 0 < n_rot <= head_dim"),
    "rope mode": (lambda d: d.rope(_f32(d, 2, 8), _f32(d, 2, 8), _i32(d, 2), 8, 8, 1e4, 1.0, 1),
                  UnsupportedOpError, "rope mode 1 is not supported (0 = normal, 2 = NeoX)"),
    "rope n_rot": (lambda d: d.rope(_f32(d, 2, 8), _f32(d, 2, 8), _i32(d, 2), 8, 5, 1e4, 1.0, 0), ShapeError,
                   "rope: shapes do not fit: out [2, 8], x [2, 8], pos [2]; want out and x "
                   "[n, n_head * head_dim], pos [n], freq_factors [>= n_rot / 2] if given, with head_dim 8 and "
                   "n_rot 5 even and 0 < n_rot <= head_dim"),
    "rope pos type": (lambda d: d.rope(_f32(d, 2, 8), _f32(d, 2, 8), _f32(d, 2), 8, 8, 1e4, 1.0, 0),
                      UnsupportedOpError, "rope: pos must be I32, not F32"),
    "kv_store width": (lambda d: d.kv_store(_f32(d, 16, 8), _f32(d, 2, 4), _i32(d, 2)), ShapeError,
                       "kv_store: shapes do not fit: cache [16, 8], x [2, 4], pos [2]; "
                       "want cache [n_ctx, n_kv_dim], x [n, n_kv_dim], pos [n]"),
    "attention gqa": (lambda d: d.attention(_f32(d, 2, 12), _f32(d, 2, 12), _f32(d, 16, 8), _f32(d, 16, 8),
                                            _i32(d, 2), 3, 2, 0.5), ShapeError,
                      "attention: shapes do not fit: out [2, 12], q [2, 12], k_cache [16, 8], v_cache [16, 8], "
                      "pos [2]; want out and q [n, n_head * head_dim], k_cache and v_cache "
                      "[n_ctx, n_head_kv * head_dim], pos [n], kv_start [n] if given, with n_head 3 a multiple of "
                      "n_head_kv 2 and window 0 >= 0"),
    "attention window": (lambda d: d.attention(_f32(d, 2, 12), _f32(d, 2, 12), _f32(d, 16, 6), _f32(d, 16, 6),
                                               _i32(d, 2), 4, 2, 0.5, -1), ShapeError,
                         "attention: shapes do not fit: out [2, 12], q [2, 12], k_cache [16, 6], v_cache [16, 6], "
                         "pos [2]; want out and q [n, n_head * head_dim], k_cache and v_cache "
                         "[n_ctx, n_head_kv * head_dim], pos [n], kv_start [n] if given, with n_head 4 a multiple of "
                         "n_head_kv 2 and window -1 >= 0"),
    "gelu_mul shapes": (lambda d: d.gelu_mul(_f32(d, 2, 3), _f32(d, 2, 3), _f32(d, 3, 2)), ShapeError,
                        "gelu_mul: shapes do not fit: out [2, 3], gate [2, 3], up [3, 2]; "
                        "want out, gate and up of one shape"),
    "attention kv_start": (lambda d: d.attention(_f32(d, 2, 8), _f32(d, 2, 8), _f32(d, 16, 8), _f32(d, 16, 8),
                                                 _i32(d, 2), 2, 2, 0.5, kv_start=_i32(d, 3)), ShapeError,
                           "attention: shapes do not fit: out [2, 8], q [2, 8], k_cache [16, 8], v_cache [16, 8], "
                           "pos [2], kv_start [3]; want out and q [n, n_head * head_dim], k_cache and v_cache "
                           "[n_ctx, n_head_kv * head_dim], pos [n], kv_start [n] if given, with n_head 2 a multiple of "
                           "n_head_kv 2 and window 0 >= 0"),
    "attention kv_start type": (lambda d: d.attention(_f32(d, 2, 8), _f32(d, 2, 8), _f32(d, 16, 8),
                                                      _f32(d, 16, 8), _i32(d, 2), 2, 2, 0.5, kv_start=_f32(d, 2)),
                                UnsupportedOpError, "attention: kv_start must be I32, not F32"),
    "add shapes": (lambda d: d.add(_f32(d, 2, 3), _f32(d, 2, 3), _f32(d, 3, 2)), ShapeError,
                   "add: shapes do not fit: out [2, 3], a [2, 3], b [3, 2]; want out, a and b of one shape"),
    "silu_mul shapes": (lambda d: d.silu_mul(_f32(d, 2, 3), _f32(d, 2, 3), _f32(d, 1, 3)), ShapeError,
                        "silu_mul: shapes do not fit: out [2, 3], gate [2, 3], up [1, 3]; "
                        "want out, gate and up of one shape"),
    "get_rows ids type": (lambda d: d.get_rows(_f32(d, 2, 32), _w(d, 4, 32), _f32(d, 2)), UnsupportedOpError,
                          "get_rows: ids must be I32, not F32"),
    "get_rows out": (lambda d: d.get_rows(_f32(d, 3, 32), _w(d, 4, 32), _i32(d, 2)), ShapeError,
                     "get_rows: shapes do not fit: out [3, 32], table [4, 32], ids [2]; "
                     "want out [k, n], table [n_rows, n], ids [k]"),
    "copy types": (lambda d: d.copy(_f32(d, 4), d.empty((4,), T.I32)), UnsupportedOpError,
                   "copy: out is F32 but x is I32"),
    "head": (lambda d: _f32(d, 2, 3).head(3), ShapeError, "head(3) of a tensor with 2 rows"),
}


def _normalized(dev, e: BaseException) -> str:
    return str(e).replace(dev.info.name, "<name>").replace(dev.info.selector, "<dev>")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_raises_one_type_and_message_on_every_backend(any_device, fault):
    run, etype, message = FAULTS[fault]
    with pytest.raises(Exception) as ei:  # any type: the exact one is asserted next, with the message
        run(any_device)
    assert type(ei.value) is etype, f"{fault}: {type(ei.value).__name__}: {ei.value}"
    assert _normalized(any_device, ei.value) == message


# -- fault cases derived from the op table -----------------------------------------------------
def _valid_call(dev, spec):
    """The tensors and scalars of a valid call of ``spec`` on ``dev``, from its ``example``."""
    tensors = []
    for a in spec.args:
        shape = spec.example[a.name]
        if shape is None:
            tensors.append(None)
        elif a.kind == I32:
            t = dev.empty(shape, T.I32)  # ids [n, k] of the MoE ops too: all zero, a valid expert
            dev.write(t, np.zeros(shape, dtype=np.int32))
            tensors.append(t)
        elif a.kind == WEIGHT:
            tensors.append(dev.upload(np.ones(shape, np.float32), T.F32, shape))
        else:
            tensors.append(dev.zeros(shape))
    scalars = {k: spec.example[k] for k in spec.scalars if k in spec.example}
    return tensors, scalars


def _call(dev, spec, tensors, scalars):
    kw = {a.name: t for a, t in zip(spec.args, tensors) if a.optional}
    getattr(dev, spec.name)(*[t for a, t in zip(spec.args, tensors) if not a.optional], **scalars, **kw)


@pytest.mark.parametrize("op", [s.name for s in TABLE])
def test_every_op_of_the_table_checks_each_argument(any_device, op):
    """For every op of the table: its example call runs; each tensor argument in turn, made
    foreign, of the wrong type or one value wider, raises DeviceError,
    UnsupportedOpError or ShapeError with the table's rule (the same on every backend)."""
    dev, spec = any_device, SPECS[op]
    tensors, scalars = _valid_call(dev, spec)
    if spec.default or op in dev.info.ops:
        _call(dev, spec, tensors, scalars)
        dev.synchronize()
    else:  # an op the device does not claim (the MoE ops off numpy): refused after the same checks
        with pytest.raises(UnsupportedOpError, match=f"{op} is not supported on this backend"):
            _call(dev, spec, tensors, scalars)
    for i, a in enumerate(spec.args):
        if tensors[i] is None:
            continue
        foreign = list(tensors)
        foreign[i] = _OTHER.empty(tensors[i].shape, T.I32 if a.kind == I32 else T.F32)
        with pytest.raises(DeviceError, match=f"^{op}: {a.name} .* lives on another device than"):
            _call(dev, spec, foreign, scalars)
        if a.kind != ACT:
            wrong = list(tensors)
            wrong[i] = dev.empty(tensors[i].shape, T.F32 if a.kind == I32 else T.I32)
            with pytest.raises(UnsupportedOpError):
                _call(dev, spec, wrong, scalars)
        if (op, a.name) in (("rope", "freq_factors"), ("moe_route", "logits")):
            continue  # a longer factor table fits (the rule is >= n_rot / 2); so do more experts than k
        wider = list(tensors)
        shape = (*tensors[i].shape[:-1], tensors[i].shape[-1] + 1)
        wider[i] = (dev.upload(np.ones(shape, np.float32), T.F32, shape) if a.kind == WEIGHT
                    else dev.empty(shape, tensors[i].ggml_type))
        with pytest.raises(ShapeError) as ei:
            _call(dev, spec, wider, scalars)
        assert str(ei.value).endswith(spec.rule.format(**{k: spec.example.get(k, 0) for k in spec.scalars}))


def test_op_limits_are_refused_by_the_public_check(any_device, monkeypatch):
    """A dimension a device caps (``DeviceInfo.op_limits``) is refused before the backend runs."""
    dev = any_device
    monkeypatch.setattr(dev.info, "op_limits", {"attention": {"head_dim": 2}})
    tensors, scalars = _valid_call(dev, SPECS["attention"])
    with pytest.raises(UnsupportedOpError, match=r"^attention: head_dim 4 is more than .*'s 2"):
        _call(dev, SPECS["attention"], tensors, scalars)
    assert dev.supports_op("attention", head_dim=4).endswith("runs attention with head_dim <= 2, not 4")
    assert dev.supports_op("attention", head_dim=2) == ""


def test_the_design_doc_shows_the_op_table():
    """docs/DESIGN.md's op table is :func:`optable.markdown` (regenerate it from there)."""
    design = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md").read_text()
    assert optable.markdown() in design
    assert optable.OPS == tuple(s.name for s in TABLE if s.forward and s.default) and "copy" not in optable.OPS
    assert set(optable.MOE_OPS) == {"moe_route", "matmul_id", "add_id", "moe_combine", "swiglu_oai",
                                    "attention_sinks"}


def test_shape_error_is_a_value_error_and_a_device_error():
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, DeviceError)


def test_buffer_owns_and_releases_once(any_device):
    dev = any_device
    buf = dev.buffer("test")
    w = buf.upload(random_weight(T.Q8_0, (4, 64), np.random.default_rng(0)), T.Q8_0, (4, 64))
    x, out = buf.zeros((2, 64)), buf.empty((2, 4))
    assert buf.tensors == [w, x, out]
    assert buf.nbytes == 4 * 68 + 2 * 64 * 4 + 2 * 4 * 4
    dev.matmul(out, x, w)
    np.testing.assert_array_equal(dev.read(out), np.zeros((2, 4), np.float32))
    bytes_before = dev.allocated_bytes
    buf.release()
    buf.release()  # once: the second call does nothing
    assert buf.released and buf.tensors == []
    assert all(t.device is None for t in (w, x, out))
    if dev.info.backend == "vulkan":  # the only backend that counts its memory down on release
        assert dev.allocated_bytes < bytes_before
    with pytest.raises(DeviceError, match="released buffer"):
        dev.matmul(out, x, w)
    with pytest.raises(DeviceError, match="released buffer"):
        dev.read(out)
    with pytest.raises(DeviceError, match="was released"):
        buf.empty((1,))
    with dev.buffer("scoped") as b2:  # a context manager releases on exit
        t = b2.empty((1, 4))
    assert b2.released and t.device is None


def test_cpu_dequantized_copy_goes_with_its_buffer(cpu_device):
    """The numpy backend's float32 copy of a quantized weight lives on the tensor (``extra``), not in
    an id()-keyed table: releasing the buffer gives the budget back, and a new weight never sees it."""
    before = cpu_device.cache_bytes
    if cpu_device.cache_budget < before + 8 * 64 * 4:
        pytest.skip("COOKTOP_CPU_CACHE budget too small to cache this weight")
    with cpu_device.buffer() as buf:
        w = buf.upload(random_weight(T.Q4_0, (8, 64), np.random.default_rng(1)), T.Q4_0, (8, 64))
        cpu_device.weight_f32(w)
        assert cpu_device.cache_bytes == before + 8 * 64 * 4 and w.extra is not None
    assert cpu_device.cache_bytes == before and w.extra is None
    del w
    gc.collect()
    assert cpu_device.cache_bytes == before  # the finalizer ran once, on release


def test_synchronize_waits_for_enqueued_ops(any_device):
    dev = any_device
    with dev.buffer() as buf:
        a = buf.empty((4, 256))
        dev.write(a, np.ones((4, 256), np.float32))
        for _ in range(3):
            dev.add(a, a, a)
        assert dev.synchronize() is None
        np.testing.assert_array_equal(dev.read(a), np.full((4, 256), 8, np.float32))


def test_copy_rows_within_one_tensor(any_device):
    """``copy_rows`` copies whole rows inside one allocation (the KV cells of a shared prefix) where
    the backend has it, and refuses views, overlapping or outside ranges everywhere the same way."""
    d = any_device
    t = d.empty((6, 5))
    data = np.arange(30, dtype=np.float32).reshape(6, 5)
    d.write(t, data)
    assert d.has_copy_rows
    d.copy_rows(t, 0, 3, 2)
    d.copy_rows(t, 5, 1, 1)
    d.copy_rows(t, 2, 4, 0)
    want = data.copy()
    want[3:5] = data[0:2]
    want[1] = data[5]
    np.testing.assert_array_equal(d.read(t), want)
    with pytest.raises(ShapeError, match="overlap"):
        d.copy_rows(t, 0, 1, 2)
    with pytest.raises(ShapeError, match="outside the 6 rows"):
        d.copy_rows(t, 4, 0, 3)
    with pytest.raises(DeviceError, match="is a view"):
        d.copy_rows(t.head(4), 0, 2, 1)
    with pytest.raises(ShapeError, match="2-D"):
        d.copy_rows(d.empty((4,)), 0, 2, 1)
