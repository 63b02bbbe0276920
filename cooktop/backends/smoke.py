"""Device smoke test: does this device compute right answers?

Run once per device on first use and by ``cooktop devices``: a round trip of a
small tensor (catches kp 0.9.0 under numpy 2, which reads [1,2,3] back as
[1,1,1]), an rmsnorm, and small matmuls of 1, 3 and 8 tokens (decode and
matrix-matrix kernels) for every weight type the device claims, each
compared with the numpy reference by nmse (bounds of ggml's
test-backend-ops: 1e-7 float, 5e-4 quantized; loosened x10 here because
the smoke test only has to catch broken drivers, not rounding).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from ..format.quants import dequantize, random_weight
from .base import Device, nmse

FLOAT_TYPES = {T.F32, T.F16, T.BF16}

#: Token counts of the matmul check: 1 takes the decode (matrix-vector) kernels, 3 and 8
#: the matrix-matrix ones (an odd count and a full small tile).
MATMUL_TOKENS = (1, 3, 8)


def run_smoke_test(dev: Device) -> tuple[bool, str]:
    """Return ``(ok, detail)``; ``detail`` names the first failing check. May raise (driver errors)."""
    rng = np.random.default_rng(1234)
    probe = np.array([1.0, 2.0, 3.0, 4.5], dtype=np.float32)
    t = dev.empty((1, 4))
    dev.write(t, probe.reshape(1, 4))
    back = dev.read(t).ravel()
    if not np.array_equal(back, probe):
        return False, f"round trip corrupts data: wrote {probe.tolist()}, read {back.tolist()}"

    # build the kernels below as one batch (a backend that compiles at run time shows its notice + bar)
    dev.prebuild(tuple(T[n] for n in dev.info.types if dev.supports("matmul", T[n])))

    n_in, n_tok, n_out = 256, 3, 5
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    xt = dev.empty((n_tok, n_in))
    dev.write(xt, x)
    w = (rng.standard_normal(n_in) * 0.5 + 1).astype(np.float32)
    wt = dev.upload(w, T.F32, (n_in,))
    out = dev.empty((n_tok, n_in))
    dev.rmsnorm(out, xt, wt, 1e-5)
    ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5) * w
    err = nmse(dev.read(out), ref)
    if not err <= 1e-6:
        return False, f"rmsnorm nmse {err:.2e} > 1e-6"

    checked = []
    for name in dev.info.types:
        ty = T[name]
        if not dev.supports("matmul", ty):
            continue
        try:
            raw = random_weight(ty, (n_out, n_in), rng)
        except NotImplementedError:
            continue
        wq = dev.upload(raw, ty, (n_out, n_in))
        w_ref = dequantize(raw, ty, (n_out, n_in)).astype(np.float64)
        bound = 1e-6 if ty in FLOAT_TYPES else 5e-3
        for n in MATMUL_TOKENS:  # 1: the decode (matrix-vector) kernels; 3, 8: the matrix-matrix ones
            xm = rng.standard_normal((n, n_in)).astype(np.float32)
            xmt = dev.empty((n, n_in))
            dev.write(xmt, xm)
            y = dev.empty((n, n_out))
            dev.matmul(y, xmt, wq)
            err = nmse(dev.read(y), xm.astype(np.float64) @ w_ref.T)
            if not err <= bound:
                return False, f"matmul {name} with {n} token(s) nmse {err:.2e} > {bound:.0e}"
        checked.append(name)
    return True, f"round trip, rmsnorm, matmul {' '.join(checked)} (n_tokens {', '.join(map(str, MATMUL_TOKENS))})"
