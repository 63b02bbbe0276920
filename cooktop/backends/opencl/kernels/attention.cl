// Causal multi-head attention over the KV cache with GQA, one work-group per (head, token).
// q, out f32 [n_tok, n_head * HEAD_DIM]; k, v [n_cells, n_head_kv * HEAD_DIM] of the cache types
// KTYPE and VTYPE (kv.cl: f32, f16, bf16, q8_0, q4_0), read as stored; pos int32 [n_tok].
// Query t of head h attends to cache rows k0..pos[t] of kv head h / (n_head / n_head_kv), where
// k0 = kv_start[t] when has_start (rows of several sequences sharing one cache), else 0;
// window > 0 (sliding window, llama.cpp's standard SWA) keeps rows pos[t]-window < k <= pos[t].
// Keys are taken AT_LS at a time (one per work-item); an online softmax in float32
// (running max m, running sum l, rescaled accumulator) combines the chunks.
// Global (AT_LS, n_head, n_tok), local (AT_LS, 1, 1); AT_LS a power of two.
//
// AT_SERIAL (CPU devices): one work-item per (head, token) walks every key itself,
// with the head's q and output accumulator in vector registers; no barriers, which
// PoCL turns into work-item loops with spilled state (7x slower decode). Keys go in blocks
// of AT_KB (16): the block's scores into a float16, its maximum, one vector exp of
// (scores - new maximum) (masked lanes -inf, so 0), and the accumulator and sum rescaled once
// per block by exp(old max - new max) (the softmax of llama.cpp's flash kernels, by blocks).
// Global (n_head, n_tok), any local size.
// SINKS (attention_sinks, gpt-oss): sinks f32 [n_head], one more logit per head in each softmax
// denominator (llama.cpp ggml_soft_max_add_sinks), folded in after the last key.

#if AT_SERIAL

inline float blk_max(float16 v) {
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    return fmax(fmax(b.x, b.y), fmax(b.z, b.w));
}
#define AT_KB 16


#ifdef GQA_G
// GQA_G (the group size n_head / n_head_kv): one work-item per (kv head, token) runs the G query heads
// of its group together, so each K and V row is read once for the G heads instead of G times (what
// dominates decode at depth). Per head the arithmetic is the kernel above's, in the same order, so
// the outputs are the same bits. Global (n_head_kv, n_tok).
__kernel void attention(global float *out, const global float *q, const global uchar *kc,
                        const global uchar *vc, const global int *pos, const global int *kv_start,
                        const int has_start, const int n_head, const int n_head_kv, const float scale,
                        const int window
#ifdef SINKS
                        , const global float *sinks
#endif
#ifdef ATT_Q8
                        , global char *xq, global float2 *xd
#endif
                        ) {
    const int hk = get_global_id(0);
    const int t = get_global_id(1);
    if (hk >= n_head_kv) return;
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int n_kv = pos[t] + 1;
    const int k0 = max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0);
    const size_t qoff = ((size_t)t * n_head + hk * GQA_G) * HEAD_DIM;
    VT qv[GQA_G][NV], acc[GQA_G][NV];
    float m[GQA_G], l[GQA_G];
    for (int g = 0; g < GQA_G; g++) {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            qv[g][i] = VLOAD(i, q + qoff + g * HEAD_DIM);
            acc[g][i] = (VT)(0.0f);
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    const size_t krb = kv_row_bytes(KTYPE, kv_dim), vrb = kv_row_bytes(VTYPE, kv_dim);
    const int e0 = hk * HEAD_DIM;
    for (int c0 = k0; c0 < n_kv; c0 += AT_KB) {
        const int cn = min(AT_KB, n_kv - c0);
        float sc[GQA_G][AT_KB];
        for (int kk = 0; kk < AT_KB; kk++) {
            VT kv[NV];
            const global uchar *kr = kc + (size_t)(c0 + min(kk, cn - 1)) * krb;  // the last row again past cn
#pragma unroll
            for (int i = 0; i < NV; i++) kv[i] = KVLOAD(kr, KTYPE, e0 + i * VW);
            for (int g = 0; g < GQA_G; g++) {
                VT d = (VT)(0.0f);
#pragma unroll
                for (int i = 0; i < NV; i++) d = fma(qv[g][i], kv[i], d);
                sc[g][kk] = kk < cn ? VSUM(d) * scale : -INFINITY;
            }
        }
        for (int g = 0; g < GQA_G; g++) {  // as the kernel below, per head
            const float16 sv = vload16(0, sc[g]);
            const float m_new = fmax(m[g], blk_max(sv));
            const float alpha = exp(m[g] - m_new);
            vstore16(exp(sv - m_new), 0, sc[g]);
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < NV; i++) acc[g][i] *= alpha;
            m[g] = m_new;
        }
        const global uchar *vr = vc + (size_t)c0 * vrb;
        for (int kk = 0; kk < cn; kk++, vr += vrb) {
            VT kv[NV];
#pragma unroll
            for (int i = 0; i < NV; i++) kv[i] = KVLOAD(vr, VTYPE, e0 + i * VW);
            for (int g = 0; g < GQA_G; g++) {
                const float p = sc[g][kk];
                l[g] += p;
#pragma unroll
                for (int i = 0; i < NV; i++) acc[g][i] = fma((VT)(p), kv[i], acc[g][i]);
            }
        }
    }
    for (int g = 0; g < GQA_G; g++) {
#ifdef SINKS
        {
            const float sk = sinks[hk * GQA_G + g], m_sk = fmax(m[g], sk), c = exp(m[g] - m_sk);
            l[g] = fma(l[g], c, exp(sk - m_sk));
#pragma unroll
            for (int i = 0; i < NV; i++) acc[g][i] *= c;
        }
#endif
        const float inv = 1.0f / l[g];
#pragma unroll
        for (int i = 0; i < NV; i++) VSTORE(acc[g][i] * inv, i, out + qoff + g * HEAD_DIM);
#ifdef ATT_Q8
        const size_t row = (size_t)t * n_head * HEAD_DIM;
        const int h = hk * GQA_G + g;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 32; j++)
            store_q8(acc[g][2 * j] * inv, acc[g][2 * j + 1] * inv, xq + row, xd + row / 32, h * (HEAD_DIM / 32) + j);
#endif
    }
}
#else
// ATT_Q8 (with quant.cl, HEAD_DIM % 32 == 0): the output is also written as 8-bit blocks
// (xq, xd) for the integer-dot matmul that reads it (q8.py).
__kernel void attention(global float *out, const global float *q, const global uchar *kc,
                        const global uchar *vc, const global int *pos, const global int *kv_start,
                        const int has_start, const int n_head, const int n_head_kv, const float scale,
                        const int window
#ifdef SINKS
                        , const global float *sinks
#endif
#ifdef ATT_Q8
                        , global char *xq, global float2 *xd
#endif
                        ) {
    const int h = get_global_id(0);
    const int t = get_global_id(1);
    if (h >= n_head) return;
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int hk = h / (n_head / n_head_kv);
    const int n_kv = pos[t] + 1;
    const int k0 = max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0);
    const size_t qoff = ((size_t)t * n_head + h) * HEAD_DIM;
    VT qv[NV], acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        qv[i] = VLOAD(i, q + qoff);
        acc[i] = (VT)(0.0f);
    }
    float m = -INFINITY, l = 0.0f;
    const size_t krb = kv_row_bytes(KTYPE, kv_dim), vrb = kv_row_bytes(VTYPE, kv_dim);
    const int e0 = hk * HEAD_DIM;
    for (int c0 = k0; c0 < n_kv; c0 += AT_KB) {
        const int cn = min(AT_KB, n_kv - c0);
        float sc[AT_KB];
        for (int kk = 0; kk < AT_KB; kk++) {
            const global uchar *kr = kc + (size_t)(c0 + min(kk, cn - 1)) * krb;  // the last row again past cn
            VT d = (VT)(0.0f);
#pragma unroll
            for (int i = 0; i < NV; i++) d = fma(qv[i], KVLOAD(kr, KTYPE, e0 + i * VW), d);
            sc[kk] = kk < cn ? VSUM(d) * scale : -INFINITY;
        }
        // the block's softmax terms at the new maximum; what was summed so far is rescaled once
        const float16 sv = vload16(0, sc);
        const float m_new = fmax(m, blk_max(sv));
        const float alpha = exp(m - m_new);
        vstore16(exp(sv - m_new), 0, sc);
        l *= alpha;
#pragma unroll
        for (int i = 0; i < NV; i++) acc[i] *= alpha;
        m = m_new;
        const global uchar *vr = vc + (size_t)c0 * vrb;
        for (int kk = 0; kk < cn; kk++, vr += vrb) {
            const float p = sc[kk];
            l += p;
#pragma unroll
            for (int i = 0; i < NV; i++) acc[i] = fma((VT)(p), KVLOAD(vr, VTYPE, e0 + i * VW), acc[i]);
        }
    }
#ifdef SINKS
    {  // gpt-oss's sink: one more logit in the denominator, no value (ggml_soft_max_add_sinks)
        const float sk = sinks[h], m_sk = fmax(m, sk), c = exp(m - m_sk);
        l = fma(l, c, exp(sk - m_sk));
#pragma unroll
        for (int i = 0; i < NV; i++) acc[i] *= c;
    }
#endif
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < NV; i++) VSTORE(acc[i] * inv, i, out + qoff);
#ifdef ATT_Q8
    const size_t row = (size_t)t * n_head * HEAD_DIM;
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 32; j++)
        store_q8(acc[2 * j] * inv, acc[2 * j + 1] * inv, xq + row, xd + row / 32, h * (HEAD_DIM / 32) + j);
#endif
}
#endif  // GQA_G

#else

#define HPI ((HEAD_DIM + AT_LS - 1) / AT_LS)

__kernel void attention(global float *out, const global float *q, const global uchar *kc,
                        const global uchar *vc, const global int *pos, const global int *kv_start,
                        const int has_start, const int n_head, const int n_head_kv, const float scale,
                        const int window
#ifdef SINKS
                        , const global float *sinks
#endif
                        ) {
    const int lid = get_local_id(0);
    const int h = get_group_id(1);
    const int t = get_group_id(2);
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int hk = h / (n_head / n_head_kv);
    const int n_kv = pos[t] + 1;
    const int k0 = max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0);
    local float qs[HEAD_DIM];
    local float sc[AT_LS];
    local float red[AT_LS];
    const size_t qoff = ((size_t)t * n_head + h) * HEAD_DIM;
    for (int d = lid; d < HEAD_DIM; d += AT_LS) qs[d] = q[qoff + d];
    float acc[HPI];
    for (int j = 0; j < HPI; j++) acc[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const size_t krb = kv_row_bytes(KTYPE, kv_dim), vrb = kv_row_bytes(VTYPE, kv_dim);
    const int e0 = hk * HEAD_DIM;
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int c0 = k0; c0 < n_kv; c0 += AT_LS) {
        const int k = c0 + lid;
        float s = -INFINITY;
        if (k < n_kv) {
            const global uchar *kr = kc + (size_t)k * krb;
            float dp = 0.0f;
#if HEAD_DIM % 4 == 0
            for (int d = 0; d < HEAD_DIM; d += 4) dp += dot(vload4(0, qs + d), kv_load4(kr, KTYPE, e0 + d));
#else
            for (int d = 0; d < HEAD_DIM; d++) dp = mad(qs[d], kv_load1(kr, KTYPE, e0 + d), dp);
#endif
            s = dp * scale;
        }
        red[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = AT_LS / 2; r > 0; r >>= 1) {
            if (lid < r) red[lid] = fmax(red[lid], red[lid + r]);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float m_new = fmax(m, red[0]);
        barrier(CLK_LOCAL_MEM_FENCE);
        const float p = exp(s - m_new);
        sc[lid] = p;
        red[lid] = p;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = AT_LS / 2; r > 0; r >>= 1) {
            if (lid < r) red[lid] += red[lid + r];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float alpha = exp(m - m_new);
        l = l * alpha + red[0];
        const int cnt = min(AT_LS, n_kv - c0);
        for (int j = 0; j < HPI; j++) {
            const int d = lid + j * AT_LS;
            if (d < HEAD_DIM) {
                const global uchar *vr = vc + (size_t)c0 * vrb;
                float a = acc[j] * alpha;
                for (int kk = 0; kk < cnt; kk++) a = mad(sc[kk], kv_load1(vr + (size_t)kk * vrb, VTYPE, e0 + d), a);
                acc[j] = a;
            }
        }
        m = m_new;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#ifdef SINKS
    {
        const float sk = sinks[h], m_sk = fmax(m, sk), c = exp(m - m_sk);
        l = l * c + exp(sk - m_sk);
        for (int j = 0; j < HPI; j++) acc[j] *= c;
    }
#endif
    const float inv = 1.0f / l;
    for (int j = 0; j < HPI; j++) {
        const int d = lid + j * AT_LS;
        if (d < HEAD_DIM) out[qoff + d] = acc[j] * inv;
    }
}

#endif

#if AT_TILED
// Query-tiled flash attention for prompts (GPU flavour, n_tok > 1): a work-group of QT * DS
// work-items takes QT consecutive query rows of one head and walks the union of their key ranges
// in tiles of KT keys. Each tile's K and V rows are loaded (dequantized from the cache's own type)
// into local memory once for all QT queries; the QT x KT scores go to local memory, masked per
// query (causal, kv_start, window) with -inf, and each query keeps an online softmax (running max m,
// sum l, rescaled accumulator) over the tiles, never the n_tok x n_kv score matrix. Work-item
// (query qi, slice ds) accumulates values d = ds, ds + DS, ... of its query's output.
// Global (QT * DS * ceil(n_tok / QT), n_head), local (QT * DS, 1). Arguments as attention's, then n_tok.
#define TLS (QT * DS)
#define HPD ((HEAD_DIM + DS - 1) / DS)
__kernel void attention_tiled(global float *out, const global float *q, const global uchar *kc,
                              const global uchar *vc, const global int *pos, const global int *kv_start,
                              const int has_start, const int n_head, const int n_head_kv, const float scale,
                              const int window,
#ifdef SINKS
                              const global float *sinks,
#endif
                              const int n_tok) {
    const int lid = get_local_id(0);
    const int t0 = get_group_id(0) * QT;
    const int h = get_group_id(1);
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int e0 = (h / (n_head / n_head_kv)) * HEAD_DIM;
    const size_t krb = kv_row_bytes(KTYPE, kv_dim), vrb = kv_row_bytes(VTYPE, kv_dim);
    local float qs[QT * HEAD_DIM];
    local float ks[KT * HEAD_DIM];
    local float vs[KT * HEAD_DIM];
    local float sc[QT * KT];
    local int lo_q[QT], hi_q[QT];
    const int nq = min(QT, n_tok - t0);
    // the key range of the tile: the union of its queries' [k0, pos + 1)
    int lo = INT_MAX, hi = 0;
    for (int i = 0; i < nq; i++) {
        const int t = t0 + i, n_kv = pos[t] + 1;
        lo = min(lo, max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0));
        hi = max(hi, n_kv);
    }
    if (lid < QT) {
        const int t = t0 + lid;
        const int n_kv = lid < nq ? pos[t] + 1 : 0;
        lo_q[lid] = lid < nq ? max(has_start ? kv_start[t] : 0, window > 0 ? n_kv - window : 0) : 0;
        hi_q[lid] = n_kv;
    }
    for (int i = lid; i < QT * HEAD_DIM; i += TLS) {
        const int qi = i / HEAD_DIM;
        qs[i] = qi < nq ? q[((size_t)(t0 + qi) * n_head + h) * HEAD_DIM + i % HEAD_DIM] : 0.0f;
    }
    const int qi = lid / DS, ds = lid % DS;
    float acc[HPD];
    for (int j = 0; j < HPD; j++) acc[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int c0 = lo; c0 < hi; c0 += KT) {
        const int cn = min(KT, hi - c0);
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers are done (and qs, lo_q are written)
        for (int i = lid; i < KT * HEAD_DIM; i += TLS) {
            const int kk = i / HEAD_DIM, d = i % HEAD_DIM;
            const bool in = kk < cn;
            ks[i] = in ? kv_load1(kc + (size_t)(c0 + kk) * krb, KTYPE, e0 + d) : 0.0f;
            vs[i] = in ? kv_load1(vc + (size_t)(c0 + kk) * vrb, VTYPE, e0 + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = lid; i < QT * KT; i += TLS) {
            const int a = i / KT, kk = i % KT, k = c0 + kk;
            float s = -INFINITY;
            if (kk < cn && k >= lo_q[a] && k < hi_q[a]) {
                float dp = 0.0f;
                for (int d = 0; d < HEAD_DIM; d++) dp = mad(qs[a * HEAD_DIM + d], ks[kk * HEAD_DIM + d], dp);
                s = dp * scale;
            }
            sc[i] = s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float mt = -INFINITY;
        for (int kk = 0; kk < cn; kk++) mt = fmax(mt, sc[qi * KT + kk]);
        const float m_new = fmax(m, mt);
        if (m_new != -INFINITY) {  // else no key of this query yet
            const float alpha = exp(m - m_new);
            l *= alpha;
            for (int j = 0; j < HPD; j++) acc[j] *= alpha;
            for (int kk = 0; kk < cn; kk++) {
                const float p = exp(sc[qi * KT + kk] - m_new);
                l += p;
                for (int j = 0; j < HPD; j++) {
                    const int d = ds + j * DS;
                    if (d < HEAD_DIM) acc[j] = mad(p, vs[kk * HEAD_DIM + d], acc[j]);
                }
            }
            m = m_new;
        }
    }
    if (qi >= nq) return;
#ifdef SINKS
    {
        const float sk = sinks[h], m_sk = fmax(m, sk), c = exp(m - m_sk);
        l = l * c + exp(sk - m_sk);
        for (int j = 0; j < HPD; j++) acc[j] *= c;
    }
#endif
    const float inv = 1.0f / l;
    const size_t qoff = ((size_t)(t0 + qi) * n_head + h) * HEAD_DIM;
    for (int j = 0; j < HPD; j++) {
        const int d = ds + j * DS;
        if (d < HEAD_DIM) out[qoff + d] = acc[j] * inv;
    }
}
#endif  // AT_TILED
