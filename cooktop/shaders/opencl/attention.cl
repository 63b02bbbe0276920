// Causal multi-head attention over the KV cache with GQA, one work-group per (head, token).
// q, out f32 [n_tok, n_head * HEAD_DIM]; k, v f32 [n_ctx, n_head_kv * HEAD_DIM]; pos int32 [n_tok].
// Query t of head h attends to cache rows 0..pos[t] of kv head h / (n_head / n_head_kv).
// Keys are taken AT_LS at a time (one per work-item); an online softmax in float32
// (running max m, running sum l, rescaled accumulator) combines the chunks.
// Global (AT_LS, n_head, n_tok), local (AT_LS, 1, 1); AT_LS a power of two.

#define HPI ((HEAD_DIM + AT_LS - 1) / AT_LS)

__kernel void attention(global float *out, const global float *q, const global float *kc,
                        const global float *vc, const global int *pos,
                        const int n_head, const int n_head_kv, const float scale) {
    const int lid = get_local_id(0);
    const int h = get_group_id(1);
    const int t = get_group_id(2);
    const int kv_dim = n_head_kv * HEAD_DIM;
    const int hk = h / (n_head / n_head_kv);
    const int n_kv = pos[t] + 1;
    local float qs[HEAD_DIM];
    local float sc[AT_LS];
    local float red[AT_LS];
    const size_t qoff = ((size_t)t * n_head + h) * HEAD_DIM;
    for (int d = lid; d < HEAD_DIM; d += AT_LS) qs[d] = q[qoff + d];
    float acc[HPI];
    for (int j = 0; j < HPI; j++) acc[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int c0 = 0; c0 < n_kv; c0 += AT_LS) {
        const int k = c0 + lid;
        float s = -INFINITY;
        if (k < n_kv) {
            const global float *kr = kc + (size_t)k * kv_dim + hk * HEAD_DIM;
            float dp = 0.0f;
#if HEAD_DIM % 4 == 0
            for (int d = 0; d < HEAD_DIM; d += 4) dp += dot(vload4(0, qs + d), vload4(0, kr + d));
#else
            for (int d = 0; d < HEAD_DIM; d++) dp = mad(qs[d], kr[d], dp);
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
                const global float *vr = vc + (size_t)c0 * kv_dim + hk * HEAD_DIM + d;
                float a = acc[j] * alpha;
                for (int kk = 0; kk < cnt; kk++) a = mad(sc[kk], vr[(size_t)kk * kv_dim], a);
                acc[j] = a;
            }
        }
        m = m_new;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / l;
    for (int j = 0; j < HPI; j++) {
        const int d = lid + j * AT_LS;
        if (d < HEAD_DIM) out[qoff + d] = acc[j] * inv;
    }
}
