// Elementwise ops on f32 activations; global size n rounded up to the local size.

// out = a + b (out may alias a)
__kernel void add(global float *out, const global float *a, const global float *b, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] + b[i];
}

// out[r, j] = x[r, j] + b[j]: a bias row b f32 [m] broadcast over the rows of x f32 [n / m, m]
// (out may alias x)
__kernel void add_bias(global float *out, const global float *x, const global float *b, const int n,
                       const int m) {
    const int i = get_global_id(0);
    if (i < n) out[i] = x[i] + b[i % m];
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up  (SwiGLU)
__kernel void silu_mul(global float *out, const global float *gate, const global float *up, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + exp(-g)) * up[i];
    }
}

// cache[pos[t], j] = x[t, j]; cache f32 [n_ctx, dim], x f32 [n_tok, dim]; global (dim, n_tok).
// Positions outside [0, n_ctx) are dropped (the host checks them before enqueueing).
__kernel void kv_store(global float *cache, const global float *x, const global int *pos,
                       const int dim, const int n_ctx) {
    const int j = get_global_id(0);
    const int t = get_global_id(1);
    const int p = pos[t];
    if (j < dim && p >= 0 && p < n_ctx) cache[(size_t)p * dim + j] = x[(size_t)t * dim + j];
}

// out = gelu(gate) * up (GeGLU), GELU in ggml's tanh form (ggml_gelu_f32, ggml-cpu/vec.h):
// 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))). out may alias gate.
__kernel void gelu_mul(global float *out, const global float *gate, const global float *up, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanh(0.79788456080286535588f * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

// out = x, n floats; global ceil(n / 256): each work-item copies 256 values (16 x float16),
// so every core of a CPU device takes part (a buffer copy command runs on one thread in PoCL)
__kernel void copy_f32(global float *out, const global float *x, const int n) {
    const size_t i0 = (size_t)get_global_id(0) * 256;
    if (i0 + 256 <= (size_t)n) {
#pragma unroll
        for (int k = 0; k < 16; k++) vstore16(vload16(k, x + i0), k, out + i0);
    } else {
        for (size_t i = i0; i < (size_t)n; i++) out[i] = x[i];
    }
}

// Mixture of experts (backends/moe_ops.py; llama.cpp src/llama-graph.cpp build_moe_ffn).
// moe_route: one work-item per row of logits f32 [n, n_expert]; ids i32 / wts f32 [n, k]; bias f32
// [n_expert] read when has_bias. The k largest scores (equal ones: the lower index first, as a stable
// sort): without a bias the logits (every gating is monotonic in them), with one the probabilities
// plus the bias (llama.cpp's exp_probs_b: it picks, it does not weigh). Weights by gating 0 softmax
// over all, 1 softmax over the selected, 2 sigmoid; then norm: divided by their sum clamped to
// >= 6.103515625e-5; scale (not 0 or 1): times scale.
inline float route_prob(const float v, const int gating, const float mx, const float sum) {
    return gating == 0 ? exp(v - mx) / sum : gating == 2 ? 1.0f / (1.0f + exp(-v)) : v;
}

__kernel void moe_route(global int *ids, global float *wts, const global float *logits, const global float *bias,
                        const int has_bias, const int n_expert, const int k, const int gating, const int norm,
                        const float scale, const int n) {
    const int r = get_global_id(0);
    if (r >= n) return;
    const global float *l = logits + (size_t)r * n_expert;
    global int *sel = ids + (size_t)r * k;
    global float *wr = wts + (size_t)r * k;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < n_expert; e++) mx = fmax(mx, l[e]);
    if (gating == 0) {
        for (int e = 0; e < n_expert; e++) sum += exp(l[e] - mx);
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        float best_s = 0.0f;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= sel[q] == e;
            const float sc = has_bias ? route_prob(l[e], gating, mx, sum) + bias[e] : l[e];
            if (!taken && (best < 0 || sc > best_s)) {
                best = e;
                best_s = sc;
            }
        }
        sel[j] = best;
    }
    float tot = 0.0f;
    for (int j = 0; j < k; j++) {
        const float v = l[sel[j]];
        const float p = gating == 1 ? exp(v - l[sel[0]]) : route_prob(v, gating, mx, sum);
        wr[j] = p;
        tot += p;
    }
    if (gating == 1) {
        for (int j = 0; j < k; j++) wr[j] /= tot;
        tot = 1.0f;
    }
    for (int j = 0; j < k; j++) {
        float p = wr[j];
        if (norm) p /= fmax(tot, 6.103515625e-5f);
        if (scale != 0.0f && scale != 1.0f) p *= scale;
        wr[j] = p;
    }
}

// out[r, j*m + c] = x[r, j*m + c] + b[ids[r, j], c] (ggml_add_id); global (k * m, n); out may alias x
__kernel void add_id(global float *out, const global float *x, const global float *b, const global int *ids,
                     const int k, const int m, const int n_expert) {
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    if (c >= k * m) return;
    const int e = clamp(ids[(size_t)r * k + c / m], 0, n_expert - 1);
    const size_t i = (size_t)r * k * m + c;
    out[i] = x[i] + b[(size_t)e * m + c % m];
}

// out[r, c] = sum_j wts[r, j] * y[r, j*m + c], in slot order; global (m, n)
__kernel void moe_combine(global float *out, const global float *y, const global float *wts, const int k,
                          const int m) {
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    if (c >= m) return;
    const global float *yr = y + (size_t)r * k * m + c;
    const global float *w = wts + (size_t)r * k;
    float acc = yr[0] * w[0];
    for (int j = 1; j < k; j++) acc += yr[(size_t)j * m] * w[j];
    out[(size_t)r * m + c] = acc;
}

// gpt-oss's clamped SwiGLU (ggml swiglu_oai): g = min(gate, limit), u = clamp(up, -limit, limit),
// out = g / (1 + exp(-alpha g)) * (u + 1); out may alias gate
__kernel void swiglu_oai(global float *out, const global float *gate, const global float *up, const int n,
                         const float alpha, const float limit) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = fmin(gate[i], limit);
        const float u = clamp(up[i], -limit, limit);
        out[i] = g / (1.0f + exp(-alpha * g)) * (u + 1.0f);
    }
}

// Counting sort of the slots by expert for mul_mm_id (one work-item; n_slots x n_expert steps):
// offs int [n_expert + 1] (expert e's slots are order[offs[e] .. offs[e+1]-1], in slot order),
// ids int [n_slots] clamped to [0, n_expert).
__kernel void moe_group(const global int *ids, global int *offs, global int *order, const int n_slots,
                        const int n_expert) {
    if (get_global_id(0) != 0) return;
    int pos = 0;
    for (int e = 0; e < n_expert; e++) {
        offs[e] = pos;
        for (int s = 0; s < n_slots; s++)
            if (clamp(ids[s], 0, n_expert - 1) == e) order[pos++] = s;
    }
    offs[n_expert] = pos;
}
