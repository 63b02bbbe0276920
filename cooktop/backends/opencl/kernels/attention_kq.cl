// Attention without flash attention, llama.cpp's build_attn_mha with flash_attn off: the scores
// KQ = K^T Q * scale materialised in a scratch buffer, soft_max_ext over them (causal mask,
// kv_start, sliding window, sinks), then KQV = V KQ. Three kernels, one launch each per chunk of
// tokens and heads (the host keeps the scratch under its cap).
// q, out f32 [n_tok, n_head * HEAD_DIM]; k, v [n_cells, n_head_kv * HEAD_DIM] of the cache types
// KTYPE and VTYPE (kv.cl), read as stored; pos, kv_start int32 [n_tok].
// s f32 [tc, hc, n_ctx]: the scores of tokens t0 .. t0+tc-1 and heads h0 .. h0+hc-1, row j of a
// (token, head) at column j; only columns k0 .. pos[t] are written and read, where
// k0 = max(kv_start[t] when has_start else 0, pos[t] + 1 - window when window > 0).

inline int kq_first(const global int *pos, const global int *kv_start, const int has_start, const int window,
                    const int t) {
    const int n_kv = pos[t] + 1;
    return max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0);
}

// CPU devices (AT_SERIAL, NF_LS 1): one work-item per (head, token) row holds the head's q in vector
// registers and reads each K row (KQ) or V row (KQV) as VW-wide vectors (kv_rows.cl), as attention.cl's
// serial kernel does; per output value the sums run in the same order as the other flavour's.

// KQ: one work-group of NF_LS per (head, token) walks the row's columns, NF_LS at a time (the
// launch does not depend on n_ctx, so a short row costs its own length).
// Global (NF_LS, hc, tc), local (NF_LS, 1, 1).
__kernel void attn_kq(global float *s, const global float *q, const global uchar *kc, const global int *pos,
                      const global int *kv_start, const int has_start, const int n_head, const int n_head_kv,
                      const float scale, const int window, const int n_ctx, const int t0, const int h0,
                      const int hc) {
    const int lid = get_local_id(0);
    const int hh = get_group_id(1);
    const int tt = get_group_id(2);
    const int t = t0 + tt, h = h0 + hh;
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int e0 = (h / (n_head / n_head_kv)) * HEAD_DIM;
    const size_t krb = kv_row_bytes(KTYPE, kv_dim);
    const global float *qr = q + ((size_t)t * n_head + h) * HEAD_DIM;
    global float *row = s + ((size_t)tt * hc + hh) * n_ctx;
    const int n_kv = min(pos[t] + 1, n_ctx);
#if AT_SERIAL
    VT qv[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) qv[i] = VLOAD(i, qr);
    const int j0 = kq_first(pos, kv_start, has_start, window, t);
    const global uchar *kr = kc + (size_t)j0 * krb;
    for (int j = j0; j < n_kv; j++, kr += krb) {
        VT dv = (VT)(0.0f);
#pragma unroll
        for (int i = 0; i < NV; i++) dv = fma(qv[i], KVLOAD(kr, KTYPE, e0 + i * VW), dv);
        row[j] = VSUM(dv) * scale;
    }
    (void)lid;
#else
    for (int j = kq_first(pos, kv_start, has_start, window, t) + lid; j < n_kv; j += NF_LS) {
        const global uchar *kr = kc + (size_t)j * krb;
        float dp = 0.0f;
#if HEAD_DIM % 4 == 0
        for (int d = 0; d < HEAD_DIM; d += 4) dp += dot(vload4(0, qr + d), kv_load4(kr, KTYPE, e0 + d));
#else
        for (int d = 0; d < HEAD_DIM; d++) dp = mad(qr[d], kv_load1(kr, KTYPE, e0 + d), dp);
#endif
        row[j] = dp * scale;
    }
#endif
}

// soft_max_ext over each score row in place: max, exp, sum, normalise in float32. sinks f32
// [n_head] when has_sinks (gpt-oss, ggml_soft_max_add_sinks): one more logit in the max and the
// denominator, no value. One work-group of NF_LS (a power of two) per (head, token).
// Global (NF_LS, hc, tc), local (NF_LS, 1, 1).
__kernel void attn_softmax(global float *s, const global int *pos, const global int *kv_start, const int has_start,
                           const int window, const int n_ctx, const int t0, const int h0, const int hc,
                           const global float *sinks, const int has_sinks) {
    const int lid = get_local_id(0);
    const int hh = get_group_id(1);
    const int tt = get_group_id(2);
    const int t = t0 + tt;
    local float red[NF_LS];
    const int n_kv = min(pos[t] + 1, n_ctx);
    const int k0 = kq_first(pos, kv_start, has_start, window, t);
    global float *row = s + ((size_t)tt * hc + hh) * n_ctx;
    float m = has_sinks ? sinks[h0 + hh] : -INFINITY;
    for (int j = k0 + lid; j < n_kv; j += NF_LS) m = fmax(m, row[j]);
    red[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = NF_LS / 2; r > 0; r >>= 1) {
        if (lid < r) red[lid] = fmax(red[lid], red[lid + r]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float l = 0.0f;
    for (int j = k0 + lid; j < n_kv; j += NF_LS) {
        const float e = exp(row[j] - m);
        row[j] = e;
        l += e;
    }
    red[lid] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = NF_LS / 2; r > 0; r >>= 1) {
        if (lid < r) red[lid] += red[lid + r];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    l = red[0];
    if (has_sinks) l += exp(sinks[h0 + hh] - m);
    const float inv = 1.0f / l;
    for (int j = k0 + lid; j < n_kv; j += NF_LS) row[j] *= inv;
}

// KQV: one work-item per (value d, head, token) sums p_j v_j[d] over the row's columns
// (AT_SERIAL: one work-item per (head, token) sums all HEAD_DIM values, a V row a vector load).
// Global (>= HEAD_DIM, hc, tc) (AT_SERIAL: (1, hc, tc)), any local size.
__kernel void attn_kqv(global float *out, const global float *s, const global uchar *vc, const global int *pos,
                       const global int *kv_start, const int has_start, const int n_head, const int n_head_kv,
                       const int window, const int n_ctx, const int t0, const int h0, const int hc) {
    const int d = get_global_id(0);
    const int hh = get_global_id(1);
    const int tt = get_global_id(2);
#if AT_SERIAL
    if (d > 0) return;
#else
    if (d >= HEAD_DIM) return;
#endif
    const int t = t0 + tt, h = h0 + hh;
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int n_kv = min(pos[t] + 1, n_ctx);
    const int k0 = kq_first(pos, kv_start, has_start, window, t);
    const size_t vrb = kv_row_bytes(VTYPE, kv_dim);
    const global float *row = s + ((size_t)tt * hc + hh) * n_ctx;
    const global uchar *vr = vc + (size_t)k0 * vrb;
#if AT_SERIAL
    const int e0 = (h / (n_head / n_head_kv)) * HEAD_DIM;
    VT acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] = (VT)(0.0f);
    for (int j = k0; j < n_kv; j++, vr += vrb) {
        const VT p = (VT)(row[j]);
#pragma unroll
        for (int i = 0; i < NV; i++) acc[i] = fma(p, KVLOAD(vr, VTYPE, e0 + i * VW), acc[i]);
    }
    global float *o = out + ((size_t)t * n_head + h) * HEAD_DIM;
#pragma unroll
    for (int i = 0; i < NV; i++) VSTORE(acc[i], i, o);
#else
    const int e = (h / (n_head / n_head_kv)) * HEAD_DIM + d;
    float a = 0.0f;
    for (int j = k0; j < n_kv; j++, vr += vrb) a = mad(row[j], kv_load1(vr, VTYPE, e), a);
    out[((size_t)t * n_head + h) * HEAD_DIM + d] = a;
#endif
}
