// The recurrent layers' ops (backends/recurrent_ops.py) on f32 activations.

// Causal depthwise convolution with a carried state (ggml_ssm_conv, ggml-cpu/ops.cpp ssm_conv_f32, with
// the state prepended and written back as llama.cpp src/models/lfm2.cpp does). x, out f32 [n, c];
// w f32 [c, k] (k taps per channel); state f32 [n_slots, (k - 1) * c], slot s's row as [k - 1, c], oldest
// first; slots int [n]. One work-item per channel walks the rows in order, so rows of one slot see the
// inputs of the rows before them. The sum runs over the taps in order, in float, as ggml's.
__kernel void ssm_conv(global float *out, const global float *x, global float *state, const global float *w,
                       const global int *slots, const int n, const int c, const int k) {
    const int ch = get_global_id(0);
    if (ch >= c) return;
    const global float *wc = w + (size_t)ch * k;
    for (int i = 0; i < n; ++i) {
        global float *st = state + (size_t)slots[i] * (size_t)(k - 1) * c + ch;
        const float xi = x[(size_t)i * c + ch];
        float sum = 0.0f;
        for (int t = 0; t < k - 1; ++t) sum += st[(size_t)t * c] * wc[t];
        sum += xi * wc[k - 1];
        for (int t = 0; t < k - 2; ++t) st[(size_t)t * c] = st[(size_t)(t + 1) * c];
        st[(size_t)(k - 2) * c] = xi;
        out[(size_t)i * c + ch] = sum;
    }
}

// out = a * b (ggml_mul; out may alias a or b)
__kernel void mul(global float *out, const global float *a, const global float *b, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] * b[i];
}

// out = x / (1 + exp(-x)) (ggml_silu, ggml-cpu/vec.h ggml_silu_f32; out may alias x)
__kernel void silu(global float *out, const global float *x, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float v = x[i];
        out[i] = v / (1.0f + exp(-v));
    }
}

// out = a * 1 / (1 + exp(-gate)) (ggml_sigmoid then ggml_mul, llama.cpp src/models/qwen35.cpp's gated
// attention output; out may alias a or gate)
__kernel void sigmoid_mul(global float *out, const global float *a, const global float *gate, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] * (1.0f / (1.0f + exp(-gate[i])));
}

// L2 norm of each group of g consecutive values, as llama.cpp src/models/models.h build_gdn_l2_norm
// writes it: ggml_rms_norm with eps / g (eps_g), then ggml_scale by 1 / sqrt(g) (inv_sqrt_g). x, out f32
// [n_groups * g] (out may alias x). Local size (RN_LS, 1), one group per work-group (get_group_id(1)); the
// sum of squares is reduced in local memory, as rmsnorm's.
__kernel void l2_norm(global float *out, const global float *x, const int g, const float eps_g,
                      const float inv_sqrt_g) {
    const int lid = get_local_id(0);
    const size_t off = (size_t)get_group_id(1) * g;
    local float red[RN_LS];
    float s = 0.0f;
    for (int i = lid; i < g; i += RN_LS) s = mad(x[off + i], x[off + i], s);
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)g + eps_g);
    for (int i = lid; i < g; i += RN_LS) out[off + i] = x[off + i] * scale * inv_sqrt_g;
}

// The gated delta rule's gates (llama.cpp src/models/qwen35.cpp build_layer_attn_linear): over n = rows *
// n_head values, g = softplus(alpha + dt_bias[h]) * a[h] with softplus(x) = x > 20 ? x : log(1 + exp(x))
// (ggml-cpu/unary-ops.cpp op_softplus), beta = 1 / (1 + exp(-b)) (op_sigmoid). alpha, b, g, beta f32
// [rows, n_head] (g may alias alpha, beta may alias b); dt_bias, a f32 [n_head].
__kernel void gdn_gate(global float *g, global float *beta, const global float *alpha, const global float *b,
                       const global float *dt_bias, const global float *a, const int n, const int n_head) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int h = i % n_head;
    const float x = alpha[i] + dt_bias[h];
    const float sp = x > 20.0f ? x : log(1.0f + exp(x));
    beta[i] = 1.0f / (1.0f + exp(-b[i]));
    g[i] = sp * a[h];
}

// The gated delta rule with a carried state (ggml_gated_delta_net, ggml-cpu/ops.cpp
// ggml_compute_forward_gated_delta_net_one_chunk, one snapshot). q, k f32 [n, h_k * d]; v, out f32
// [n, h_v * d]; g, beta f32 [n, h_v]; state f32 [n_slots, h_v * d * d], slot s's row as m[h, j, i] (the
// state S_h[i][j], contiguous in i); slots int [n]; value head h reads key head (h / kdiv) % h_k (kdiv 1:
// tiled heads, ggml's h % h_k; kdiv h_v / h_k: repeat-interleaved heads, llama.cpp qwen3next.cpp);
// scale = 1 / sqrt(d).
// One work-item per (value head h, column j) walks the rows in order: for each row it owns m[h, j, :] of
// the row's slot (no other work-item reads or writes it), so the rows of one slot see the state the rows
// before them left, and the dot products over i are its own:
//   m[j, :] *= exp(g); u = (v[j] - m[j, :] . k) * beta; m[j, :] += u * k; out[j] = (m[j, :] . q) * scale
__kernel void gated_delta_net(global float *out, const global float *q, const global float *k,
                              const global float *v, const global float *g, const global float *beta,
                              global float *state, const global int *slots, const int n, const int h_v,
                              const int h_k, const int d, const float scale, const int kdiv) {
    const int id = get_global_id(0);  // h * d + j
    if (id >= h_v * d) return;
    const int h = id / d;
    const size_t qk_w = (size_t)h_k * d, v_w = (size_t)h_v * d, dd = (size_t)d * d;
    const size_t key = (size_t)((h / kdiv) % h_k) * d;
    for (int r = 0; r < n; ++r) {
        global float *m = state + (size_t)slots[r] * h_v * dd + (size_t)id * d;
        const global float *kr = k + (size_t)r * qk_w + key;
        const global float *qr = q + (size_t)r * qk_w + key;
        const float decay = exp(g[(size_t)r * h_v + h]);
        float sk = 0.0f;
        for (int i = 0; i < d; ++i) {
            const float s = m[i] * decay;
            m[i] = s;
            sk = mad(s, kr[i], sk);
        }
        const float u = (v[(size_t)r * v_w + id] - sk) * beta[(size_t)r * h_v + h];
        float o = 0.0f;
        for (int i = 0; i < d; ++i) {
            const float s = mad(kr[i], u, m[i]);
            m[i] = s;
            o = mad(s, qr[i], o);
        }
        out[(size_t)r * v_w + id] = o * scale;
    }
}

// Mamba-2's selective scan with a carried state (ggml_ssm_scan, ggml-cpu/ops.cpp
// ggml_compute_forward_ssm_scan_f32, the Mamba-2 branch: a scalar A per head), with dt's bias before it and
// y + x * D after it as llama.cpp src/models/mamba-base.cpp build_mamba2_layer adds them. xbc f32 [n, w]
// (w = h * p + 2 * g * ns: x [h, p], then B [g, ns], then C [g, ns]); dt f32 [n, h]; a, d, dt_bias f32 [h];
// state f32 [n_slots, h * p * ns], slot s's row as S[h, p, ns]; slots int [n]; out f32 [n, h * p]. Head hd
// reads group hd / (h / g). One work-item per (head, p) walks the rows in order: it owns S[hd, p, :] of the
// row's slot (no other work-item reads or writes it), so the rows of one slot see the state the rows
// before them left:
//   dt' = softplus(dt + dt_bias); S = S * exp(dt' a) + B * (x dt'); out = S . C + x * D
__kernel void ssm_scan(global float *out, const global float *xbc, const global float *dt, const global float *a,
                       const global float *d, const global float *dt_bias, global float *state,
                       const global int *slots, const int n, const int h, const int p, const int ns, const int g) {
    const int id = get_global_id(0);  // hd * p + j
    if (id >= h * p) return;
    const int hd = id / p;
    const size_t d_inner = (size_t)h * p, w = d_inner + (size_t)2 * g * ns;
    const size_t grp = (size_t)(hd / (h / g)) * ns;
    for (int r = 0; r < n; ++r) {
        global float *s = state + (size_t)slots[r] * d_inner * ns + (size_t)id * ns;
        const global float *row = xbc + (size_t)r * w;
        const global float *bm = row + d_inner + grp;
        const global float *cm = row + d_inner + (size_t)g * ns + grp;
        const float v = dt[(size_t)r * h + hd] + dt_bias[hd];
        const float sp = v > 20.0f ? v : log(1.0f + exp(v));
        const float da = exp(sp * a[hd]);
        const float x = row[id];
        const float xdt = x * sp;
        float sum = 0.0f;
        for (int i = 0; i < ns; ++i) {
            const float st = s[i] * da + bm[i] * xdt;
            s[i] = st;
            sum = mad(st, cm[i], sum);
        }
        out[(size_t)r * d_inner + id] = sum + x * d[hd];
    }
}

// Mamba-2's gated RMS norm over groups (llama.cpp src/models/mamba-base.cpp build_mamba2_layer:
// ggml_swiglu_split(z, y), then ggml_rms_norm of each group of gw values times ssm_norm): with
// v = y * silu(z), out = v / sqrt(mean(v^2) + eps) * w[group]. y, z, out f32 [n_rows * n_groups * gw]
// (out may alias y or z: every value is read in the first pass, before the barrier, and written by the
// work-item that reads it again in the second); w f32 [n_groups * gw]. Local size (RN_LS, 1), one group of
// one row per work-group (get_group_id(1)); the sum of squares reduced in local memory, as rmsnorm's.
__kernel void ssm_norm(global float *out, const global float *y, const global float *z, const global float *w,
                       const int gw, const int n_groups, const float eps) {
    const int lid = get_local_id(0);
    const size_t grp = get_group_id(1);
    const size_t off = grp * gw;
    const global float *wg = w + (grp % n_groups) * gw;
    local float red[RN_LS];
    float s = 0.0f;
    for (int i = lid; i < gw; i += RN_LS) {
        const float zv = z[off + i];
        const float v = y[off + i] * (zv / (1.0f + exp(-zv)));
        s = mad(v, v, s);
    }
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)gw + eps);
    for (int i = lid; i < gw; i += RN_LS) {
        const float zv = z[off + i];
        const float v = y[off + i] * (zv / (1.0f + exp(-zv)));
        out[off + i] = v * scale * wg[i];
    }
}

// out = x * s (ggml_scale; Granite's residual and logit multipliers; out may alias x)
__kernel void scale(global float *out, const global float *x, const int n, const float s) {
    const int i = get_global_id(0);
    if (i < n) out[i] = x[i] * s;
}
