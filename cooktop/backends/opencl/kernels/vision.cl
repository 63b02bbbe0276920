// The vision encoders' ops (backends/vision_ops.py) on f32 activations: layer norm, the GELUs and the
// patch grid's average pool. (attention_full runs attention.cl's flash kernels: opencl/vision.py.)

// Layer norm of each row (ggml_norm, ggml-cpu/ops.cpp ggml_compute_forward_norm_f32, then ggml_mul and
// ggml_add: llama.cpp tools/mtmd/clip.cpp build_norm NORM_TYPE_NORMAL):
//   out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, var = mean((x[r] - mean)^2) (biased)
// x, out f32 [n_rows, n] (out may alias x: each work-item writes only the values it read); w, b f32 [n]
// (has_b 0: no bias, b not read). Local size (RN_LS, 1), one group per row (get_group_id(1)); the sum, then
// the sum of squared deviations, reduced in local memory in float32.
__kernel void layer_norm(global float *out, const global float *x, const global float *w,
                         const global float *b, const int has_b, const int n, const float eps) {
    const int lid = get_local_id(0);
    const size_t off = (size_t)get_group_id(1) * n;
    local float red[RN_LS];
    float s = 0.0f;
    for (int i = lid; i < n; i += RN_LS) s += x[off + i];
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float mean = red[0] / (float)n;
    barrier(CLK_LOCAL_MEM_FENCE);  // every work-item has read red[0] before it is overwritten
    float v = 0.0f;
    for (int i = lid; i < n; i += RN_LS) {
        const float d = x[off + i] - mean;
        v = mad(d, d, v);
    }
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)n + eps);
    for (int i = lid; i < n; i += RN_LS) {
        const float y = (x[off + i] - mean) * scale * w[i];
        out[off + i] = has_b ? y + b[i] : y;
    }
}

// GELU, tanh form (ggml_gelu_f32, ggml-cpu/vec.h): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) x (1 + 0.044715 x^2),
// computed as x / (1 + exp(-2 u)) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2 u)), which keeps its
// relative precision where 1 + tanh(u) cancels (x << 0: the tanh form's float32 result is off by up to
// 6e-8 |x| there). out may alias x.
__kernel void gelu(global float *out, const global float *x, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = x[i];
        out[i] = g / (1.0f + exp(-1.5957691216057307118f * g * (1.0f + 0.044715f * g * g)));
    }
}

// Exact GELU (ggml_vec_gelu_erf_f32, ggml-cpu/vec.h): 0.5 x (1 + erf(x / sqrt(2))). out may alias x.
__kernel void gelu_erf(global float *out, const global float *x, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = x[i];
        out[i] = 0.5f * g * (1.0f + erf(g * 0.70710678118654752440f));
    }
}

// Quick GELU (ggml_gelu_quick_f32, ggml-cpu/vec.h, GELU_QUICK_COEF -1.702): x / (1 + exp(-1.702 x)).
// out may alias x.
__kernel void gelu_quick(global float *out, const global float *x, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = x[i];
        out[i] = g / (1.0f + exp(-1.702f * g));
    }
}

// Average pool of a patch grid over non-overlapping k x k windows (ggml_pool_2d GGML_OP_POOL_AVG, stride k,
// no padding; ggml-cpu/ops.cpp ggml_compute_forward_pool_2d: the window's float sum, then / (k * k)).
// x f32 [height * width, c] token-major (token y * width + x); out f32 [(height / k) * (width / k), c].
// One work-item per output value (global ceil(n_out * c), any local size), the window summed row by row.
__kernel void avg_pool2d(global float *out, const global float *x, const int width, const int k, const int c,
                         const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const int ch = i % c;
    const int o = i / c;
    const int wo = width / k;
    const int y0 = (o / wo) * k, x0 = (o % wo) * k;
    float s = 0.0f;
    for (int dy = 0; dy < k; ++dy) {
        const size_t row = (size_t)(y0 + dy) * width + x0;
        for (int dx = 0; dx < k; ++dx) s += x[(row + dx) * c + ch];
    }
    out[i] = s / (float)(k * k);
}

// Multi-section rope, vision mode (ggml_rope_multi with GGML_ROPE_TYPE_VISION, n_dims = head_dim / 2:
// ggml-cpu/ops.cpp ggml_mrope_cache_init with indep_sects, rotate_pairs with n_offset = n_dims). Pair i of a
// head: sector c = i % (s0 + s1 + s2 + s3), its section s and index j there; theta = pos[s * n + t] *
// freq_base^(-2 j / n_dims); (x[i], x[i + n_dims]) rotated by theta. x, out f32 [n, n_head * head_dim] (out may
// alias x: each work-item reads and writes its own pair); pos int [4, n]. Global (n_dims, n_head, n).
__kernel void rope_multi(global float *out, const global float *x, const global int *pos, const int head_dim,
                         const int n, const int s0, const int s1, const int s2, const int s3,
                         const float log2_base) {
    const int i = get_global_id(0), h = get_global_id(1), t = get_global_id(2);
    const int nd = head_dim / 2;
    if (i >= nd) return;
    const int c = i % (s0 + s1 + s2 + s3);
    const int s = c < s0 ? 0 : c < s0 + s1 ? 1 : c < s0 + s1 + s2 ? 2 : 3;
    const int j = c - (s > 0 ? s0 : 0) - (s > 1 ? s1 : 0) - (s > 2 ? s2 : 0);
    const float theta = (float)pos[s * n + t] * exp2(-2.0f * (float)j / (float)nd * log2_base);
    const float cs = cos(theta), sn = sin(theta);
    const size_t o = ((size_t)t * get_global_size(1) + h) * head_dim + i;
    const float a = x[o], b = x[o + nd];
    out[o] = a * cs - b * sn;
    out[o + nd] = a * sn + b * cs;
}
