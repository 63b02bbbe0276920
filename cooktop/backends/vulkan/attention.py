"""Vulkan attention paths beside ``attention.comp`` (the flash kernel of decode): without flash
attention (``-fa off``), llama.cpp's ``build_attn_mha`` path with the scores materialised
(``glsl/attention_kq.comp``: variants ``attention_kq``, ``attention_softmax``, ``attention_kqv``);
for prompts with it, the query-tiled flash shader (``glsl/attention_tiled.comp``); and for decode
with it, split-K (``attention.comp`` with SPLIT, then ``glsl/attention_split_reduce.comp``). A CPU
driver runs flash attention through the ``-fa off`` kernels (:func:`scores_flash`).

The scores of a chunk of tokens and heads live in one scratch tensor (``chunked.scratch``, role
``"attention scores"``) of ``tc x hc x n_ctx`` floats, under ``chunked.SCORES_CAP_BYTES`` and
``maxStorageBufferRange`` (``chunked.score_chunks``); three dispatches per chunk. The chunking depends
only on the shapes, so a recorded graph replays it; the columns a row reads are bounded by ``pos``
on the device (a row costs its own ``n_kv``, not ``n_ctx``).
"""

from __future__ import annotations

from typing import Any

from .. import chunked
from .shaders import bucket, f32_bits, workgroups

#: Invocations per workgroup of the three shaders (``WG`` in attention_kq.comp).
WG = 64


def attention_kq(dev: Any, out, q, k_cache, v_cache, pos, n_head: int, n_head_kv: int, scale: float, window: int,
                 kv_start, sinks) -> None:
    """Enqueue ``out = softmax(K^T q * scale + mask) V`` on the Vulkan device ``dev`` through the score
    scratch (module doc). Arguments as ``Device.attention`` / ``attention_sinks`` (checked).

    Raises:
        DeviceOutOfMemoryError: the scratch cannot be allocated.
    """
    n = dev._rows(q)
    head_dim = q.shape[-1] // n_head
    n_ctx = k_cache.shape[0]
    tc, hc = chunked.score_chunks(dev, n, n_head, n_ctx)
    s = chunked.scratch(dev, "attention scores", tc * hc, n_ctx)
    start = kv_start if kv_start is not None else pos
    sk = sinks.handle if sinks is not None else dev._dummy_tensor()
    kt, vt = int(k_cache.ggml_type), int(v_cache.ggml_type)
    bits = f32_bits(scale)
    per_d = -(-head_dim // WG)
    for t0 in range(0, n, tc):
        nt = min(tc, n - t0)
        nb = bucket(nt, tc)  # the grid by powers of two: chunks of other lengths share pipelines
        for h0 in range(0, n_head, hc):
            nh = min(hc, n_head - h0)
            push = [nt, n_head, n_head_kv, head_dim, n_ctx, bits, window, int(kv_start is not None), kt, t0, h0, nh,
                    int(sinks is not None)]
            dev._dispatch("attention_kq", (q, k_cache, pos, start, s), workgroups(nh * nb), tuple(push))
            dev._dispatch_raw("attention_softmax", (s.handle, pos.handle, start.handle, sk),
                              workgroups(nh * nb), tuple(push))
            push[8] = vt
            dev._dispatch("attention_kqv", (s, v_cache, pos, start, out), workgroups(per_d * nh * nb), tuple(push))


#: attention_tiled.comp's tile (queries per workgroup, keys per tile) and largest head_dim, and its
#: shared memory in bytes (qs, ks, vs, sc).
TILE_QT, TILE_KT, TILE_HD_MAX = 16, 8, 128
TILE_SHARED_BYTES = 4 * (TILE_QT * TILE_HD_MAX + 2 * TILE_KT * TILE_HD_MAX + TILE_QT * TILE_KT)


def attention_tiled(dev: Any, out, q, k_cache, v_cache, pos, n_head: int, n_head_kv: int, scale: float,
                    window: int, kv_start, sinks) -> bool:
    """Enqueue the query-tiled flash shader (``attention_tiled.comp``) for a prompt; False (nothing
    enqueued) where it does not apply: one row, head_dim over TILE_HD_MAX, or less shared memory than
    TILE_SHARED_BYTES (``maxComputeSharedMemorySize``). Arguments as ``Device.attention`` (checked)."""
    n = dev._rows(q)
    head_dim = q.shape[-1] // n_head
    shared = dev.info.extra.get("max_compute_shared_memory") or 0
    if n < 2 or head_dim > TILE_HD_MAX or shared < TILE_SHARED_BYTES:
        return False
    tiles = -(-bucket(n, dev._row_cap(q)) // TILE_QT)
    start = kv_start if kv_start is not None else pos
    push = (n, n_head, n_head_kv, head_dim, k_cache.shape[0], f32_bits(scale), window, int(kv_start is not None),
            int(k_cache.ggml_type), int(v_cache.ggml_type))
    if sinks is None:
        dev._dispatch("attention_tiled", (q, k_cache, v_cache, pos, start, out), workgroups(tiles * n_head), push)
    else:
        dev._dispatch("attention_tiled_sinks", (q, k_cache, v_cache, pos, start, out, sinks),
                      workgroups(tiles * n_head), push)
    return True


#: Run flash attention (prompts and decode) through the score kernels on CPU drivers (``device_type``
#: "cpu"): on lavapipe they decode ~8x faster at depth than attention.comp, split or not (2M tiny
#: model shape, head_dim 32, f16 cache, 2048 keys: ~4 against ~33 ms for the 8 heads; the weighted-V
#: loop of attention.comp costs most of it) and run prompts a little faster than attention_tiled.comp
#: (64 rows at depth 1984: ~310 against ~365 ms; load 3.4 on 2 cores). Prompts take them too so that
#: a row's arithmetic is the same in a prompt and in decode (the score kernels are row-independent):
#: a last-bit difference there turns into a different 8-bit activation in the next mat-vec (q8_1)
#: and moves a logprob by 0.05 (tests/test_prompt_paths.py). False keeps the flash kernels there
#: too (the tests flip it).
SCORES_FLASH_ON_CPU = True


#: Loop iterations Mesa's llvmpipe runs per shader invocation, all loops counted together
#: (gallivm's ``LP_MAX_TGSI_LOOP_ITERATIONS``); past it the loops stop early and the result is wrong.
LAVAPIPE_LOOP_BUDGET = 65535


def lavapipe_max_keys(head_dim: int) -> int:
    """Most keys :func:`attention_kq` computes right on lavapipe for heads of ``head_dim``: an
    ``attention_kq`` invocation loops ``ceil(n_kv / WG)`` times over its keys and ``head_dim`` times
    inside each (``ceil(n_kv / WG) * (head_dim + 1)`` iterations), an ``attention_kqv`` one ``n_kv``
    times, both under :data:`LAVAPIPE_LOOP_BUDGET` (32512 keys at head_dim 128, 64512 at 64).
    lavapipe runs flash attention through these kernels too (:func:`scores_flash`)."""
    return min(LAVAPIPE_LOOP_BUDGET // (head_dim + 1) * WG, LAVAPIPE_LOOP_BUDGET // WG * WG)


def scores_flash(dev: Any) -> bool:
    """Whether flash attention on ``dev`` runs :func:`attention_kq` (the kernels of ``-fa off``): on a CPU
    driver, while :data:`SCORES_FLASH_ON_CPU`."""
    return SCORES_FLASH_ON_CPU and dev.info.device_type == "cpu"


#: Split-K decode: keys per split aimed at (of the cache size ``n_ctx``), most splits, and the
#: workgroup count past which splitting stops (the (row, head) grid alone fills the device).
SPLIT_KEYS, SPLIT_MAX, SPLIT_TARGET_GROUPS = 512, 16, chunked.SPLIT_ROWS_CAP


def split_count(n_rows: int, n_head: int, n_ctx: int) -> int:
    """Splits per (row, head) of split-K flash attention: ``ceil(n_ctx / SPLIT_KEYS)`` (so a full cache
    gives each split ~SPLIT_KEYS keys), at most SPLIT_MAX and SPLIT_TARGET_GROUPS / (n_rows * n_head);
    1 means no split. ``n_rows``: the bucketed row count of the grid. It depends on the cache size, not
    on the rows' ``pos`` (a recorded graph replays the same launch at every depth; a split past a
    row's keys writes an empty partial)."""
    return max(1, min(-(-n_ctx // SPLIT_KEYS), SPLIT_MAX, SPLIT_TARGET_GROUPS // max(1, n_rows * n_head)))


def attention_split(dev: Any, out, q, k_cache, v_cache, pos, n_head: int, n_head_kv: int, scale: float,
                    window: int, kv_start, sinks) -> bool:
    """Enqueue split-K flash attention ("flash decoding", llama.cpp ggml-vulkan's ``split_k`` with
    ``flash_attn_split_k_reduce.comp``): ``split_count`` workgroups per (row, head) each write a partial
    ``(acc [head_dim], m, l)`` of their share of the row's keys to a scratch ``[rows * n_head * S,
    head_dim + 2]`` f32 (``chunked.scratch`` role ``"attention splits"``), then one reduce workgroup
    per (row, head) rescales them by ``exp(m_s - max m)``, sums, folds in ``sinks`` and divides.
    False (nothing enqueued) where one split would do. Arguments as ``Device.attention`` (checked)."""
    n = dev._rows(q)
    nb = bucket(n, dev._row_cap(q))
    n_ctx = k_cache.shape[0]
    ns = split_count(nb, n_head, n_ctx)
    if ns < 2:
        return False
    head_dim = q.shape[-1] // n_head
    part = chunked.scratch(dev, "attention splits", nb * n_head * ns, head_dim + 2)
    start = kv_start if kv_start is not None else pos
    dev._dispatch("attention_split", (q, k_cache, v_cache, pos, start, part), workgroups(nb * n_head * ns),
                  (n, n_head, n_head_kv, head_dim, n_ctx, f32_bits(scale), window, int(kv_start is not None),
                   int(k_cache.ggml_type), int(v_cache.ggml_type), ns))
    push = (n, n_head, head_dim, ns)
    if sinks is None:
        dev._dispatch("attention_split_reduce", (part, out), workgroups(nb * n_head), push)
    else:
        dev._dispatch("attention_split_reduce_sinks", (part, out, sinks), workgroups(nb * n_head), push)
    return True
